"""Where a webhook may be sent: an http(s) URL whose host resolves only to public addresses.

A subscription's URL is the one address the service calls on a user's say-so, so it must not become a way
into the operator's own network (a cloud metadata address, a database on the LAN, the service itself). Both
the route that creates a subscription and every delivery check it: DNS may answer differently later (DNS
rebinding), so a delivery connects to the very address it checked (`Target`), not to a second look-up.
`MEMORY_WEBHOOK_ALLOW_PRIVATE=1` lets an operator send to loopback and private receivers.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_URL_CHARS = 2048


class BadWebhookUrl(ValueError):
    """The URL is not one the service will call; the message says why."""


@dataclass(frozen=True)
class Target:
    """Where one delivery connects: the URL to request (its host replaced by the checked address when
    pinned), the Host header and TLS name to present."""

    url: str
    host_header: str | None = None
    sni_hostname: str | None = None


def check_form(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL with a host and no credentials, or BadWebhookUrl."""
    if len(url) > MAX_URL_CHARS:
        raise BadWebhookUrl(f"the URL is {len(url)} characters; at most {MAX_URL_CHARS} are allowed")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadWebhookUrl(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise BadWebhookUrl(f"only http:// and https:// URLs are called (got {parts.scheme or 'no'} scheme)")
    if not parts.hostname:
        raise BadWebhookUrl("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise BadWebhookUrl("the URL may not carry a user or password; the signature authenticates the service")
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise BadWebhookUrl("the URL may not contain spaces or control characters")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def is_public(address: str) -> bool:
    """Whether an address is reachable on the public internet: not loopback, private, link-local, reserved,
    multicast or unspecified (an IPv4 address inside IPv6 is judged as itself)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def resolve(url: str, *, allow_private: bool) -> Target:
    """The checked target of `url` (BadWebhookUrl when refused). Every address the host resolves to must be
    public: an answer mixing one public and one private address is refused, since either may be used."""
    scheme, host, port = check_form(url)
    if allow_private:
        return Target(url)
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise BadWebhookUrl(f"the host {host!r} does not resolve ({exc})") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    refused = [a for a in addresses if not is_public(a)]
    if refused or not addresses:
        raise BadWebhookUrl(
            f"the host {host!r} resolves to a loopback, private, link-local or reserved address "
            f"({', '.join(refused) or 'none'}); the operator allows those with MEMORY_WEBHOOK_ALLOW_PRIVATE=1"
        )
    if literal is not None:
        return Target(url)
    parts = urlsplit(url)
    pinned = addresses[0] if ":" not in addresses[0] else f"[{addresses[0]}]"
    netloc = f"{pinned}:{parts.port}" if parts.port else pinned
    return Target(
        parts._replace(netloc=netloc).geturl(),
        host_header=parts.netloc,
        sni_hostname=host if scheme == "https" else None,
    )
