"""Schemathesis hooks for tests/test_fuzz.py (loaded through SCHEMATHESIS_HOOKS by the CLI it runs).

Schemathesis has no serializer for `application/x-ndjson`, so without one it cannot send `/v1/import`
bodies at all: this one writes the generated value as JSON Lines, one line per item of a list.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def json_lines(ctx: Any, value: Any) -> bytes:
    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)
