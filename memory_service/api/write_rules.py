"""The one rule every route that saves a text obeys: /v1/remember, mem0's add and update, Hindsight's retain and
each line of an import. They all call `check_write`, so no compatibility route can take what the native one
refuses (issue 53): a text or metadata past the bounds, an agent a pinned key may not write as, or an
idempotency key in the namespace the service derives its own keys in.

What is checked is what will be stored (the metadata with whatever the route adds beside the client's), so
anything a route stores also fits an export line that imports back.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request

from ..contract.types import RESERVED_KEY_PREFIXES
from .auth import check_agent

MAX_METADATA_BYTES = 8 * 1024


class Refused(HTTPException, ValueError):
    """A save the rule refuses: an HTTP error for a route, a ValueError (its `detail` the reason) for an import
    line, which is reported and skipped rather than failing the whole body."""


def check_write(
    request: Request,
    *,
    max_text_bytes: int,
    agent_id: str,
    text: str,
    metadata: dict[str, Any] | None,
    key: str | None = None,
    key_is_derived: bool = False,
    what: str = "text",
    metadata_what: str = "metadata",
) -> None:
    """403 for an agent a pinned key may not write as, 413 for a text over MEMORY_MAX_TEXT_BYTES or stored
    metadata over 8 KiB as JSON, 422 for a key in the reserved namespace that the service did not derive
    (`key_is_derived`: the route derived it, or checked it is the key the service derives for this save)."""
    try:
        check_agent(request, agent_id)
    except HTTPException as exc:
        raise Refused(exc.status_code, str(exc.detail)) from None
    size = len(text.encode("utf-8"))
    if size > max_text_bytes:
        raise Refused(
            413,
            f"{what} is {size} bytes; the limit is {max_text_bytes} bytes (MEMORY_MAX_TEXT_BYTES). "
            "Split it into several saves.",
        )
    stored = len(json.dumps(metadata or {}))
    if stored > MAX_METADATA_BYTES:
        raise Refused(
            413,
            f"{metadata_what} is larger than {MAX_METADATA_BYTES} bytes as JSON ({stored}): keep less beside the text",
        )
    if key is not None and key.startswith(RESERVED_KEY_PREFIXES) and not key_is_derived:
        raise Refused(
            422,
            f"idempotency_key {key[:80]!r}: keys starting with {' or '.join(map(repr, RESERVED_KEY_PREFIXES))} are "
            "reserved for keys the service derives (Hindsight retains, imports); choose another key, or send none",
        )
