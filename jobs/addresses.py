"""The address a request came from, as the brute-force throttles and /metrics' trusted networks
count it.

Directly connected, it is the connection's (`REMOTE_ADDR`). Behind reverse proxies an admin
lists in SF_TRUSTED_PROXIES, it is the address the nearest proxy saw: `X-Forwarded-For` read
from the right, past every trusted proxy. Entries further left were written by whoever sent the
request and are never believed, so a client cannot choose its own address; from a connection
that is not a trusted proxy the header is ignored altogether.
"""

import functools
import ipaddress

from django.conf import settings
from django.http import HttpRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def client_address(request: HttpRequest) -> str:
    remote = request.META.get("REMOTE_ADDR", "") or "unknown"
    proxies = settings.SF_TRUSTED_PROXIES
    if not proxies or not in_networks(remote, proxies):
        return remote
    client = remote
    for hop in reversed(request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")):
        address = _address(hop.strip())
        if address is None:  # not what a proxy writes: stop at the last hop a proxy vouched for
            break
        client = str(address)
        if not _within(address, proxies):
            break
    return client


def in_networks(text: str, networks: list[str]) -> bool:
    """Whether the address `text` is in one of the CIDRs `networks` (False when not an address)."""
    address = _address(text)
    return address is not None and _within(address, networks)


def _within(address: Address, networks: list[str]) -> bool:
    return any(address in net for net in _networks(tuple(networks)))


def _address(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


@functools.lru_cache(maxsize=8)
def _networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)
