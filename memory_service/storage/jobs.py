"""The extraction queue: the jobs live in the `memories` rows (a job cannot be lost without its text).

A worker leases a job (`claim_next`) and renews the lease while it runs; a job whose lease ran out is due
again, so a dead process's jobs go to another one without a restart. Every settle (`complete`, `defer`,
`fail_attempt`, `save_progress`) names the holder and is refused once the lease passed to someone else,
and every take is recorded in `job_attempts`.
"""

from __future__ import annotations

import time
from typing import Any

from .database import Database
from .fair_queue import next_due, take_turn
from .records import DELETED, EXTRACTING, FAILED, LOST, QUEUED, Memory
from .records import dumps_or_none as _dumps
from .webhooks import enqueue

EXACT_BACKLOG = 200  # jobs ahead counted exactly on every save; past this, see JobQueue.backlog
LONG_BACKLOG_REFRESH_S = 1.0
# how the reason of a job waiting out a model too slow for the budget begins (`waiting_for_speed` counts them)
SLOW_WAIT = "waiting for the model to be fast enough: "


def held_by(owner: str | None) -> tuple[str, tuple[Any, ...]]:
    """The condition that the job is still this worker's (none when no owner is named)."""
    return ("", ()) if owner is None else (" AND status = 'extracting' AND lease_owner = ?", (owner,))


def failed_for_good(conn: Any, memory_id: str, now: float) -> None:
    """The `memory.failed` webhook notice, on the transaction that marked the job failed."""
    row = conn.execute(
        "SELECT team, agent_id, attempts, last_error FROM memories WHERE id = ?", (memory_id,)
    ).fetchone()
    payload = {"memory_id": memory_id, "agent_id": row[1], "attempts": row[2], "error": (row[3] or "")[:500]}
    enqueue(conn, row[0], "memory.failed", payload, now)


def end_attempt(conn: Any, memory_id: str, owner: str | None, outcome: str, now: float) -> None:
    """Close the worker's open attempt record of this job (a settle without an owner has none)."""
    if owner is not None:
        conn.execute(
            "UPDATE job_attempts SET ended_at = ?, outcome = ? WHERE memory_id = ? AND worker = ? AND ended_at IS NULL",
            (now, outcome, memory_id, owner),
        )


class JobQueue:
    """The journal's job methods (a mixin over the journal's `db`)."""

    db: Database
    _long_backlog: tuple[float, int, int] | None  # (counted at, jobs, chars), set up by the journal

    def recover(self, owner: str | None = None) -> int:
        """Jobs taken but not finished go back to the queue: every one (one process owns this journal,
        at its start and stop), or those whose lease names `owner` as prefix (one of several processes
        stopping; the others keep theirs)."""
        now = time.time()
        where, args = "status = ?", [EXTRACTING]
        if owner is not None:
            where += " AND lease_owner LIKE ?"
            args.append(owner.replace("%", "") + "%")
        with self.db.transaction() as conn:
            conn.execute(
                f"UPDATE job_attempts SET ended_at = ?, outcome = 'released' WHERE ended_at IS NULL "
                f"AND memory_id IN (SELECT id FROM memories WHERE {where})",
                (now, *args),
            )
            return conn.execute(
                f"UPDATE memories SET status = ?, started_at = NULL, lease_owner = NULL, lease_until = NULL "
                f"WHERE {where}",
                (QUEUED, *args),
            ).rowcount

    def claim_next(
        self, worker: str = "local", lease_s: float = 60.0, now: float | None = None, max_attempts: int | None = None
    ) -> Memory | None:
        """Lease the next due job to `worker` for `lease_s` (renewed while it runs), or None.

        A job whose lease ran out (its process died) is due again: another worker takes it over, with no
        restart, and that counts as an attempt, so a text that kills its process every time ends `failed`
        after `max_attempts` instead of going round for ever. On PostgreSQL `SKIP LOCKED` lets every
        process claim at once without taking the same row. Due jobs are served round-robin across teams and
        then agents (`fair_queue.next_due`), so one team's backlog delays no other team's jobs; each step is
        an index probe that stops at its first row: the claim costs the same with a long backlog.
        """
        now = time.time() if now is None else now
        lock = " FOR UPDATE SKIP LOCKED" if self.db.dialect == "postgresql" else ""
        with self.db.transaction() as conn:
            while True:
                found = conn.execute(
                    f"SELECT id FROM memories WHERE status = ? AND lease_until < ? LIMIT 1{lock}", (EXTRACTING, now)
                ).fetchone()
                if found is None:  # round-robin across teams, then their agents (storage/fair_queue.py)
                    due = next_due(conn, now, self.db.dialect)
                    if due is None:
                        return None
                    found = (due,)
                row = conn.execute("SELECT * FROM memories WHERE id = ?", (found[0],)).fetchone()
                if row["status"] != EXTRACTING:
                    break
                # taken over: the previous holder's attempt ended with its lease, and counts
                conn.execute(
                    "UPDATE job_attempts SET ended_at = ?, outcome = 'lease expired' "
                    "WHERE memory_id = ? AND ended_at IS NULL",
                    (row["lease_until"], row["id"]),
                )
                attempts = row["attempts"] + 1
                if max_attempts is None or attempts < max_attempts:
                    conn.execute("UPDATE memories SET attempts = ? WHERE id = ?", (attempts, row["id"]))
                    row = conn.execute("SELECT * FROM memories WHERE id = ?", (row["id"],)).fetchone()
                    break
                conn.execute(
                    "UPDATE memories SET status = ?, attempts = ?, finished_at = ?, started_at = NULL, "
                    "lease_owner = NULL, lease_until = NULL, last_error = ? WHERE id = ?",
                    (
                        FAILED,
                        attempts,
                        now,
                        f"the process extracting it stopped {attempts} times without "
                        "finishing (its lease ran out each time); its passage stays recallable",
                        row["id"],
                    ),
                )
                failed_for_good(conn, row["id"], now)
            conn.execute(
                "UPDATE memories SET status = ?, started_at = ?, lease_owner = ?, lease_until = ? WHERE id = ?",
                (EXTRACTING, now, worker, now + lease_s, row["id"]),
            )
            conn.execute(
                "INSERT INTO job_attempts (memory_id, worker, started_at) VALUES (?, ?, ?)", (row["id"], worker, now)
            )
            take_turn(conn, row["team"], row["agent_id"])
            memory = Memory.from_row(row)
            memory.status, memory.started_at, memory.lease_owner = EXTRACTING, now, worker
            return memory

    def renew(self, memory_id: str, worker: str, lease_s: float, now: float | None = None) -> bool:
        """Extend `worker`'s lease on a running job; False when it is no longer the holder."""
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            return (
                conn.execute(
                    "UPDATE memories SET lease_until = ? WHERE id = ? AND status = ? AND lease_owner = ?",
                    (now + lease_s, memory_id, EXTRACTING, worker),
                ).rowcount
                == 1
            )

    def attempts_of(self, memory_id: str) -> list[tuple[str, float, float | None, str | None]]:
        """(worker, started_at, ended_at, outcome) of every time a worker took this job, oldest first."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT worker, started_at, ended_at, outcome FROM job_attempts "
                "WHERE memory_id = ? ORDER BY started_at",
                (memory_id,),
            ).fetchall()
        return [(r[0], float(r[1]), None if r[2] is None else float(r[2]), r[3]) for r in rows]

    def context_for(self, memory: Memory, *, block: int, window_s: float) -> list[Memory]:
        """The saves just before `memory` in its conversation, oldest first.

        In a run the window keeps its start for `block` saves in a row, so each prompt extends the last
        one and llama.cpp's cache covers the context: it starts at the save before a multiple of `block`
        and holds 1 to `block` saves (fewer at the run's start). Only the first save of each block pays
        for one earlier save again. Without a run, the conversation is the same agent's saves (also
        without a run) from the `window_s` before it, windowed the same way. A pinned save's run holds
        only its own agent's saves: what it extracts is what its key may read.
        """
        where = "team = ? AND status != ? AND created_at < ? AND id != ?"
        args: list[Any] = [memory.team, DELETED, memory.created_at, memory.id]
        if memory.run_id is not None:
            where += " AND run_id = ?"
            args.append(memory.run_id)
            if memory.pinned:  # a pinned agent's prompt never holds another agent's text (issue 40's write scope)
                where += " AND agent_id = ?"
                args.append(memory.agent_id)
        else:
            where += " AND agent_id = ? AND run_id IS NULL AND created_at >= ?"
            args += [memory.agent_id, memory.created_at - window_s]
        with self.db.reading() as conn:
            before = conn.execute(f"SELECT COUNT(*) FROM memories WHERE {where}", args).fetchone()[0]
            start = max(0, before // block * block - 1)
            rows = conn.execute(
                f"SELECT * FROM memories WHERE {where} ORDER BY created_at, id LIMIT ? OFFSET ?",
                (*args, before - start, start),
            ).fetchall()
        return [Memory.from_row(row) for row in rows]

    def next_due_in(self, now: float | None = None) -> float | None:
        """Seconds until the earliest queued job is due (0 if one is due now), None if the queue is empty."""
        now = time.time() if now is None else now
        with self.db.reading() as conn:
            row = conn.execute("SELECT MIN(next_attempt_at) FROM memories WHERE status = ?", (QUEUED,)).fetchone()
        return None if row[0] is None else max(0.0, row[0] - now)

    def save_progress(self, memory_id: str, progress: dict[str, Any], owner: str | None = None) -> None:
        """The chunks of a long text extracted so far: a deferral, retry or restart resumes after them."""
        held, args = held_by(owner)
        with self.db.transaction() as conn:
            conn.execute(
                f"UPDATE memories SET progress = ? WHERE id = ? AND status != ?{held}",
                (_dumps(progress), memory_id, DELETED, *args),
            )

    def defer(self, memory_id: str, *, until: float, budget_s: float, reason: str, owner: str | None = None) -> None:
        """Not now, and not an error (model down, machine slower than measured): requeue without an attempt."""
        held, args = held_by(owner)
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE memories SET status = ?, deferrals = deferrals + 1, next_attempt_at = ?, deadline_at = ?, "
                f"started_at = NULL, last_error = ?, lease_owner = NULL WHERE id = ? AND status != ?{held}",
                (QUEUED, until, until + budget_s, reason, memory_id, DELETED, *args),
            )
            end_attempt(conn, memory_id, owner, "deferred", time.time())

    def waiting_for_speed(self, now: float | None = None, team: str | None = None) -> int:
        """Jobs (of `team`, or every team's) waiting out a pause because the model was too slow for the budget
        (the `deferred` count)."""
        now = time.time() if now is None else now
        scope, args = (" AND team = ?", (team,)) if team is not None else ("", ())
        with self.db.reading() as conn:
            return int(
                conn.execute(
                    "SELECT COUNT(*) FROM memories WHERE status = ? AND next_attempt_at > ? AND last_error LIKE ?"
                    + scope,
                    (QUEUED, now, SLOW_WAIT + "%", *args),
                ).fetchone()[0]
            )

    def resume_waiting(self, *, budget_s: float, now: float | None = None) -> int:
        """A call fitted its window again: the jobs waiting out a slow model are due now, not at their pause's end."""
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            return int(
                conn.execute(
                    "UPDATE memories SET next_attempt_at = ?, deadline_at = ? "
                    "WHERE status = ? AND next_attempt_at > ? AND last_error LIKE ?",
                    (now, now + budget_s, QUEUED, now, SLOW_WAIT + "%"),
                ).rowcount
            )

    def fail_attempt(
        self,
        memory_id: str,
        *,
        error: str,
        raw_reply: str | None,
        timings: dict[str, Any] | None,
        report: dict[str, Any] | None,
        retry_at: float | None,
        budget_s: float,
        now: float | None = None,
        owner: str | None = None,
    ) -> str:
        """Record a failed attempt; retry at `retry_at`, or mark failed when it is None. Returns the new status.

        A memory forgotten meanwhile stays forgotten: nothing is written and the status is `deleted`. So
        does a job whose lease `owner` lost (another worker took it over): the status is then `lost`.
        """
        now = time.time() if now is None else now
        status = QUEUED if retry_at is not None else FAILED
        held, args = held_by(owner)
        with self.db.transaction() as conn:
            updated = conn.execute(
                "UPDATE memories SET status = ?, attempts = attempts + 1, last_error = ?, "
                "raw_reply = COALESCE(?, raw_reply), timings = COALESCE(?, timings), report = COALESCE(?, report), "
                "next_attempt_at = ?, deadline_at = ?, started_at = NULL, finished_at = ?, lease_owner = NULL "
                f"WHERE id = ? AND status != ?{held}",
                (
                    status,
                    error,
                    raw_reply,
                    _dumps(timings),
                    _dumps(report),
                    retry_at if retry_at is not None else now,
                    (retry_at + budget_s) if retry_at is not None else now,
                    None if retry_at is not None else now,
                    memory_id,
                    DELETED,
                    *args,
                ),
            ).rowcount
            end_attempt(conn, memory_id, owner, "retry" if retry_at is not None else "failed", now)
            if updated and retry_at is None:
                failed_for_good(conn, memory_id, now)
            if not updated and owner is not None:
                alive = conn.execute(
                    "SELECT 1 FROM memories WHERE id = ? AND status != ?", (memory_id, DELETED)
                ).fetchone()
                return LOST if alive else DELETED
        return status if updated else DELETED

    def retry(self, team: str, memory_id: str, *, budget_s: float, now: float | None = None) -> bool:
        """An operator's retry of a failed job: queued again, due now. False unless the team's job had failed.

        Attempts are kept (the history stays true), so a retry is one more attempt: a job that fails
        again with a retryable error goes back to failed rather than through the whole back-off again.
        """
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            return (
                conn.execute(
                    "UPDATE memories SET status = ?, next_attempt_at = ?, deadline_at = ?, started_at = NULL, "
                    "finished_at = NULL WHERE id = ? AND team = ? AND status = ?",
                    (QUEUED, now, now + budget_s, memory_id, team, FAILED),
                ).rowcount
                == 1
            )

    def backlog(self, created_at: float | None = None, now: float | None = None) -> tuple[int, int]:
        """(jobs, characters) waiting or running, optionally only those saved by `created_at`: the work ahead.

        Every save asks, so this must not grow with the queue. Up to `EXACT_BACKLOG` jobs it is counted
        exactly (one bounded index range). A longer backlog is counted in full at most once every
        `LONG_BACKLOG_REFRESH_S`: the full count is a scan of the queue (22 ms at 20k jobs, measured),
        and a figure one second old serves an estimate as well.
        """
        where = "status IN (?, ?)"
        args: tuple[Any, ...] = (QUEUED, EXTRACTING)
        if created_at is not None:
            where, args = where + " AND created_at <= ?", (*args, created_at)
        with self.db.reading() as conn:
            jobs, chars = conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(n), 0) FROM (SELECT LENGTH(text) AS n FROM memories WHERE {where} "
                "LIMIT ?) AS ahead",
                (*args, EXACT_BACKLOG + 1),
            ).fetchone()
            if jobs <= EXACT_BACKLOG:
                return int(jobs), int(chars)
            now = time.time() if now is None else now
            cached = self._long_backlog
            if (
                cached is not None
                and now - cached[0] < LONG_BACKLOG_REFRESH_S
                and (created_at is None or created_at >= cached[0])
            ):
                return cached[1], cached[2]
            jobs, chars = conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(LENGTH(text)), 0) FROM memories WHERE {where}", args
            ).fetchone()
        # the count covers every job saved by `created_at` (or by now): a later save has all of them ahead
        stamp = now if created_at is None else min(created_at, now)
        if cached is None or stamp >= cached[0]:
            self._long_backlog = (stamp, int(jobs), int(chars))
        return int(jobs), int(chars)

    def team_backlog(self, team: str, created_at: float | None = None, now: float | None = None) -> tuple[int, int]:
        """`backlog` of one team: its own jobs waiting or running (saved by `created_at` when given).

        What a team is told of the queue (remember's queue_depth and estimate) is its own: another team's
        backlog changes neither the figures nor the time to count them (one range of the partial index
        `memories_team_pending`, which holds only pending rows). Counted exactly up to `EXACT_BACKLOG`,
        past it in full at most once every `LONG_BACKLOG_REFRESH_S` per team, as `backlog` does.
        """
        where = f"team = ? AND status IN ('{QUEUED}', '{EXTRACTING}')"  # literals: the partial index's own terms
        args: tuple[Any, ...] = (team,)
        if created_at is not None:
            where, args = where + " AND created_at <= ?", (*args, created_at)
        with self.db.reading() as conn:
            jobs, chars = conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(n), 0) FROM (SELECT LENGTH(text) AS n FROM memories WHERE {where} "
                "LIMIT ?) AS ahead",
                (*args, EXACT_BACKLOG + 1),
            ).fetchone()
            if jobs <= EXACT_BACKLOG:
                return int(jobs), int(chars)
            now = time.time() if now is None else now
            counted: dict[str, tuple[float, int, int]] = self.__dict__.setdefault("_team_backlogs", {})
            cached = counted.get(team)
            if (
                cached is not None
                and now - cached[0] < LONG_BACKLOG_REFRESH_S
                and (created_at is None or created_at >= cached[0])
            ):
                return cached[1], cached[2]
            jobs, chars = conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(LENGTH(text)), 0) FROM memories WHERE {where}", args
            ).fetchone()
        stamp = now if created_at is None else min(created_at, now)
        if cached is None or stamp >= cached[0]:
            if len(counted) > 10_000:  # teams with a long backlog; a stale figure is only re-counted
                counted.clear()
            counted[team] = (stamp, int(jobs), int(chars))
        return int(jobs), int(chars)
