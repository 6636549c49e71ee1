"""Reading a Redis URL's credentials (standard library only: the production settings use it
before Django's settings exist)."""

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit


def password_of(url: str) -> str:
    """The password `url` carries, in its user part or as `?password=`; empty when none."""
    parts = urlsplit(url)
    return unquote(parts.password or "") or dict(parse_qsl(parts.query)).get("password", "")


def password_given(url: str) -> bool:
    return bool(password_of(url))


def without_credentials(url: str) -> str:
    """`url` with its user, password and `?password=` taken out: to show, or to knock on the
    door as a stranger would."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
