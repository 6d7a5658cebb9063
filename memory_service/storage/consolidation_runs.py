"""The log of consolidation passes (`consolidation_runs`): when, by whom, how each ended, what it wrote.

A pass beats while it runs, so a run whose process died is told apart from one still going.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .journal import Journal

RUNNING, DONE, YIELDED, INTERRUPTED, FAILED = "running", "done", "yielded", "interrupted", "failed"
STALE_RUN_S = 120.0  # a run whose holder has not beaten for this long died with its process


class RunLog:
    """The run-log methods of `ConsolidationStore` (a mixin over its journal)."""

    journal: Journal

    def start_run(self, holder: str, groups_due: int, now: float | None = None) -> str:
        now = time.time() if now is None else now
        run_id = uuid.uuid4().hex[:16]
        with self.journal.transaction() as conn:
            conn.execute(
                "INSERT INTO consolidation_runs (id, holder, started_at, beat_at, outcome, groups_due) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, holder, now, now, RUNNING, groups_due),
            )
        return run_id

    def beat(self, run_id: str, written: int, removed: int) -> None:
        with self.journal.transaction() as conn:
            conn.execute(
                "UPDATE consolidation_runs SET beat_at = ?, written = ?, removed = ? WHERE id = ?",
                (time.time(), written, removed, run_id),
            )

    def end_run(self, run_id: str, outcome: str, written: int, removed: int, detail: str | None = None) -> None:
        now = time.time()
        with self.journal.transaction() as conn:
            conn.execute(
                "UPDATE consolidation_runs SET ended_at = ?, beat_at = ?, outcome = ?, written = ?, "
                "removed = ?, detail = ? WHERE id = ?",
                (now, now, outcome, written, removed, detail, run_id),
            )

    def close_dead_runs(self, holder: str | None = None, now: float | None = None) -> int:
        """Runs cut off by a stop: this holder's (at start-up on a data dir), or any whose beat stopped."""
        now = time.time() if now is None else now
        with self.journal.transaction() as conn:
            if holder is None:
                cur = conn.execute(
                    "UPDATE consolidation_runs SET outcome = ?, ended_at = beat_at WHERE outcome = ? AND beat_at < ?",
                    (INTERRUPTED, RUNNING, now - STALE_RUN_S),
                )
            else:
                cur = conn.execute(
                    "UPDATE consolidation_runs SET outcome = ?, ended_at = beat_at WHERE outcome = ? AND holder != ?",
                    (INTERRUPTED, RUNNING, holder),
                )
            return int(cur.rowcount or 0)

    def runs(self, limit: int = 5) -> list[dict[str, Any]]:
        """The latest runs, newest first: what ran, when, and what it wrote."""
        with self.journal.reading() as conn:
            rows = conn.execute(
                "SELECT id, holder, started_at, ended_at, outcome, groups_due, written, removed, detail "
                "FROM consolidation_runs ORDER BY started_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
        keys = ("id", "holder", "started_at", "ended_at", "outcome", "groups_due", "written", "removed", "detail")
        return [dict(zip(keys, tuple(r))) for r in rows]
