"""`remember --wait`: poll the saved memory until its facts are extracted (or failed, or the wait is over).

Polling `GET /v1/memories/{id}` rather than the API's own `wait_s` lets the command show the extraction's
progress as it goes and wait longer than the API's 120 s bound; the answer it ends with is the memory itself,
so the facts it waited for are printed.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from ..ops.progress import Stage
from .common import answer
from .progress import Bars

SETTLED = ("done", "failed")
POLL_S = 0.25  # a fake model extracts in ~50 ms, a real one in seconds: a quarter second is felt by neither


EXTRACTING = Stage("extracting facts", "chars")


def wait_for_facts(client: httpx.Client, saved: dict[str, Any], seconds: float, *, show: bool) -> dict[str, Any]:
    """The memory once settled, or as it stands when `seconds` have passed; a bar of the characters read so far
    (the API's per-chunk progress) while `show` and stderr is a terminal."""
    deadline = time.monotonic() + seconds
    with Bars(None if show else False) as bars:
        while True:
            memory: dict[str, Any] = answer(client.get(f"/v1/memories/{saved['id']}"))
            total = len(memory["text"])
            done = total if memory["status"] in SETTLED else (memory.get("progress") or {}).get("chars_done", 0)
            bars(EXTRACTING, done, total)
            if memory["status"] in SETTLED or time.monotonic() >= deadline:
                return memory
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
