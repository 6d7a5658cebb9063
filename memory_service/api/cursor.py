"""Opaque page cursors: the position of the last item shown, encoded so clients don't build their own."""

from __future__ import annotations

import base64
import json

from fastapi import HTTPException

from ..contract.types import MAX_EPOCH_S, MIN_EPOCH_S


def encode(position: tuple[float, str]) -> str:
    raw = json.dumps([position[0], position[1]], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str) -> tuple[float, str]:
    """The position, or a 400 that says where a valid cursor comes from."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, memory_id = json.loads(raw)
        if not isinstance(memory_id, str) or not isinstance(created_at, (int, float)) or isinstance(created_at, bool):
            raise ValueError
        position = float(created_at)  # OverflowError for a 400-digit integer
        if not MIN_EPOCH_S <= position <= MAX_EPOCH_S:  # also NaN and infinities, which json.loads reads
            raise ValueError
        return position, memory_id
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise HTTPException(400, "cursor is not valid: pass the next_cursor of the previous page unchanged") from None
