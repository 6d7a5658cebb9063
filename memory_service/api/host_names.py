"""Reading the Host and Origin headers: the names a loopback service answers to, and the `host[:port]` a
header names.

Apart from host_guard.py (the API's middleware, which asks the key store whether the service is keyless)
because the MCP server's HTTP transport checks the same headers (mcp_server/http_access.py) and must load
neither FastAPI nor the API's auth. Standard library only.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
# a host (a bracketed IPv6 literal or a name), then an optional port: anything else is not a Host we answer
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::[0-9]{1,5})?")


def host_name(value: str) -> str | None:
    """The host of a Host header or an origin's netloc, lower case and without its port; None if malformed."""
    match = _HOST.fullmatch(value.strip())
    return match.group(1).lower() if match else None


def host_authority(value: str, default_port: str = "") -> str | None:
    """`host[:port]` in lower case, the scheme's default port dropped; None if malformed."""
    value = value.strip().lower()
    if not _HOST.fullmatch(value):
        return None
    return value.removesuffix(default_port) if default_port else value


def origin_authority(origin: str) -> str | None:
    """The `host[:port]` an Origin header names (None for `null`, or anything but scheme://host[:port])."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment:
        return None
    return host_authority(parts.netloc, ":80" if parts.scheme == "http" else ":443")
