"""What a key's role may do: the three roles and the one rule between them.

Here, not in the key store, because the API, the console and the MCP server (a client of the API, which
hides the tools a key's role cannot use) all apply the same rule, and the MCP server must not load a store.
"""

from __future__ import annotations

from typing import Literal

Role = Literal["read", "write", "admin"]
ROLES: tuple[Role, ...] = ("read", "write", "admin")


def role_allows(role: str, needed: Role) -> bool:
    """Roles nest: admin can do what write can, write what read can."""
    return ROLES.index(role) >= ROLES.index(needed)
