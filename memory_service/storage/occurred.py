"""When what a saved text tells happened, for recall's `time_field: occurred_at` window.

Read apart from the journal's search queries: the vector and keyword legs index `created_at`, so a
window on `occurred_at` is applied to the rows they found (a text saved without `occurred_at`
happened when it was saved).
"""

from __future__ import annotations

from typing import Any

CHUNK = 500  # ids per statement, well under SQLite's variable limit


def occurred_times(db_owner: Any, team: str, memory_ids: list[str]) -> dict[str, float]:
    """memory id -> occurred_at (or created_at when the saver gave none), for the team's memories."""
    ids = list(dict.fromkeys(memory_ids))
    out: dict[str, float] = {}
    with db_owner.reading() as conn:
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            marks = ",".join("?" * len(chunk))
            for row in conn.execute(
                f"SELECT id, COALESCE(occurred_at, created_at) FROM memories WHERE id IN ({marks}) AND +team = ?",
                (*chunk, team),
            ):
                out[row[0]] = float(row[1])
    return out
