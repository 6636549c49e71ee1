"""Where a webhook may point: an http(s) URL or a `mailto:` address, never the server's
neighbourhood (SSRF).

A target is where the server's own requests go, so a URL whose host resolves to an address that
is not globally routable (`ipaddress`'s `is_global`: loopback, link-local, private, multicast,
reserved, the shared address space 100.64.0.0/10 and the other special-purpose ranges; an IPv6
address by the IPv4 one it carries) is refused when it is added (`check_target`) and again at
every delivery (`resolve`: the connection goes to the address that was checked, so a name that
re-resolves elsewhere between check and connect leads nowhere), unless staff allowed it (the
webhook's `allow_private`, set in the Django admin, or a network of SF_WEBHOOK_ALLOWED_NETS).
"""

import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from jobs.errors import BadRequest

URL_MAX = 2000
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known prefix: IPv4 in the last 32 bits


class Refused(Exception):
    """The target may not be delivered to (not a transient failure: no retry)."""


def check_target(url: str, allow_private: bool = False) -> None:
    """Refuse (BadRequest) a target that is not an http(s) URL or a mailto: address, or whose
    host is not one the server may reach (see the module's docstring)."""
    if len(url) > URL_MAX:
        raise BadRequest(f"the URL is {len(url)} characters long; at most {URL_MAX}")
    if url.lower().startswith("mailto:"):
        _check_email(url[len("mailto:") :])
        return
    parts = _split(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(
            f"{url[:100]!r} is not an http(s) URL or a mailto: address; "
            "give e.g. https://hooks.example.com/starforge"
        )
    if parts.username or parts.password:
        raise BadRequest("put no credentials in the URL: receivers verify the signature instead")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number 0..65535
    except ValueError:
        raise BadRequest(f"the URL's port is not a port number: {url[:100]!r}") from None
    try:
        resolve(url, allow_private)
    except Refused as exc:
        raise BadRequest(str(exc)) from None


def _split(url: str) -> SplitResult:
    """`urlsplit`, whose ValueError on a broken host ("http://[::1", "http://[zz::1]/") is a
    BadRequest here with a sentence."""
    try:
        return urlsplit(url)
    except ValueError as exc:
        raise BadRequest(
            f"{url[:100]!r} is not a well-formed URL ({exc}); an IPv6 address goes in "
            "brackets, e.g. https://[2001:db8::1]/hook"
        ) from None


def _check_email(address: str) -> None:
    try:
        validate_email(address)
    except ValidationError:
        raise BadRequest(f"{address[:100]!r} is not an email address") from None
    if not settings.SF_NOTIFY_EMAIL:
        raise BadRequest(
            "this server sends no email (no EMAIL_HOST is set up); use an http(s) webhook"
        )


def resolve(url: str, allow_private: bool = False) -> tuple[str, int, str]:
    """(address, port, host) to connect to for `url`: its host's first address, all of which
    must be allowed. Raises Refused with the reason."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as exc:  # ValueError: NUL, bad port
        raise Refused(f"host {url[:100]!r} does not resolve ({exc})") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]
    for address in addresses:
        why = _private(address)
        if why and not (allow_private or _allowed_network(address)):
            carried = _carried(address)
            shown = address if carried == address else f"{address} (that is {carried})"
            raise Refused(
                f"host {host} resolves to {shown}, a {why} address, which webhooks may not "
                "reach unless an admin allows it"
            )
    return str(addresses[0]), port, host


def _private(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Why the server may not reach this address ("" when it may): only globally routable
    ones (`is_global`), an IPv6 address that carries an IPv4 one judged by that."""
    address = _carried(address)
    for word, flag in (
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("unspecified", address.is_unspecified),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        # Shared address space (100.64.0.0/10: carrier NAT, Tailscale, pod networks, cloud
        # metadata such as 100.100.100.200) and the other special-purpose ranges.
        ("not globally routable", not address.is_global),
    ):
        if flag:
            return word
    return ""


def _carried(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, the NAT64 prefix), where the
    packets end up; otherwise the address itself."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    inner = address.ipv4_mapped or address.sixtofour
    if inner is None and address in NAT64:
        inner = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return inner or address


def _allowed_network(address) -> bool:
    nets = settings.SF_WEBHOOK_ALLOWED_NETS
    return any(address in ipaddress.ip_network(n, strict=False) for n in nets)
