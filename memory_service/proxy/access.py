"""Who may use the proxy: it acts with the memory service's key (it recalls and saves), so it listens on
loopback only, and, as the keyless API does (api/host_guard.py), it answers only trusted Host names and refuses
what a browser marks as coming from another site: a web page reaching 127.0.0.1 through DNS rebinding would
otherwise read the team's memory in a brief. The header parsing is the API's own (api/host_names.py, standard
library only).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..api.host_names import LOOPBACK_NAMES, host_name, origin_authority
from ..config import ConfigError, is_loopback


def check_bind(host: str) -> None:
    """Refuse to listen beyond loopback: whoever reaches the port would read and write the team's memory."""
    if not is_loopback(host):
        raise ConfigError(
            f"refusing to serve the proxy on {host}: whoever reaches the port would recall and save with this "
            "proxy's memory key. Bind it to loopback (127.0.0.1, the default) and run it beside the agent"
        )


class Access:
    """The Host and Origin checks; `refusal` is None for a request to serve."""

    def __init__(self, bound: str, trusted: tuple[str, ...] = ()) -> None:
        self.trusted = LOOPBACK_NAMES | {h.lower() for h in trusted}
        bound_name = host_name(f"[{bound}]" if ":" in bound else bound)
        if bound_name:
            self.trusted |= {bound_name}

    def refusal(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        host = headers.get("host")
        if host is None or host_name(host) not in self.trusted:
            return 421, (
                f"Host {host!r} is not one this proxy answers to: use http://127.0.0.1:<port>, or add the name to "
                "MEMORY_TRUSTED_HOSTS"
            )
        if headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
            return 403, "refused: a request from another site (Sec-Fetch-Site)"
        origin = headers.get("origin")
        if origin is not None:
            authority = origin_authority(origin)
            if authority is None or (authority != host.strip().lower() and host_name(authority) not in self.trusted):
                return 403, "refused: a request from another site (Origin)"
        return None
