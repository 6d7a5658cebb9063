"""What an agent, run or memory id may be: one rule each, checked alike by the API, the limit store and the
MCP tools."""

from __future__ import annotations

import re

MAX_ID_LEN = 128
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]*$"
ID_RULE = f"1-{MAX_ID_LEN} characters of A-Z a-z 0-9 . _ : @ / -, starting with a letter or digit"

# The service names every saved text `mem_` + 32 hex digits; the pattern takes shorter hex too, so a truncated
# id is a plain "no such memory", while no memory id can hold `/`, `.`, `%`, `?` or `#` (it is one path segment).
MAX_MEMORY_ID_LEN = 68
MEMORY_ID_PATTERN = r"^mem_[0-9a-f]{1,64}$"
MEMORY_ID_RULE = "'mem_' followed by lowercase hex digits, as a save or a recall result shows it"

_ID_RE = re.compile(ID_PATTERN)


def is_id(value: object) -> bool:
    """fullmatch, so a trailing newline (which `$` would let through) is refused as the API refuses it."""
    return isinstance(value, str) and len(value) <= MAX_ID_LEN and _ID_RE.fullmatch(value) is not None
