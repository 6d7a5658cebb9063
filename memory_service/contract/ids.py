"""What an agent or run id may be: one rule, checked alike by the API and by the limit store."""

from __future__ import annotations

import re

MAX_ID_LEN = 128
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]*$"
ID_RULE = f"1-{MAX_ID_LEN} characters of A-Z a-z 0-9 . _ : @ / -, starting with a letter or digit"

_ID_RE = re.compile(ID_PATTERN)


def is_id(value: object) -> bool:
    """fullmatch, so a trailing newline (which `$` would let through) is refused as the API refuses it."""
    return isinstance(value, str) and len(value) <= MAX_ID_LEN and _ID_RE.fullmatch(value) is not None
