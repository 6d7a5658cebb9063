"""Facts in the journal: stored with their job in one transaction, decided one at a time per team.

A fact's vector is written after the commit that stored it (`indexed` says whether that happened), so the
journal is always the truth and Chroma follows it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from .database import Database
from .jobs import end_attempt, held_by
from .records import DELETED, DONE, Fact, FactPlan, Memory, tags_of
from .records import dumps_or_none as _dumps
from .records import fact_from_row as _fact_from_row
from .webhooks import notify_extracted


class FactStore:
    """The journal's fact methods (a mixin over the journal's `db`)."""

    db: Database
    _team_locks: dict[str, threading.Lock]
    _team_locks_guard: threading.Lock

    @contextmanager
    def deciding(self, team: str) -> Iterator[None]:
        """Held while a job's facts are decided (new, merged, superseding) and stored: one decision per team
        at a time, so two workers never both add the same fact or both supersede one. Every process on a
        shared PostgreSQL waits on the same advisory lock; on SQLite one process owns the file."""
        if self.db.dialect == "postgresql":
            with self.db.transaction() as conn:
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", ("facts\x1f" + team,))
                yield
            return
        with self._team_locks_guard:
            lock = self._team_locks.setdefault(team, threading.Lock())
        with lock:
            yield

    def complete(
        self,
        memory: Memory,
        plan: FactPlan,
        *,
        raw_reply: str | None,
        timings: dict[str, Any] | None,
        report: dict[str, Any],
        now: float | None = None,
    ) -> bool:
        """Store the job's facts and mark it done, all in one transaction.

        False (and nothing written) when the memory was forgotten while its job ran: no fact may
        outlive the text it came from. Also False when the worker's lease was taken over meanwhile: the
        job is the new holder's now, and one result per job is stored.
        """
        now = time.time() if now is None else now
        tags = json.dumps(memory.tags)
        held, args = held_by(memory.lease_owner)
        lock = " FOR UPDATE" if self.db.dialect == "postgresql" else ""
        with self.db.transaction() as conn:
            live = conn.execute(
                f"SELECT 1 FROM memories WHERE id = ? AND status != ?{held}{lock}", (memory.id, DELETED, *args)
            ).fetchone()
            if live is None:
                return False
            end_attempt(conn, memory.id, memory.lease_owner, "done", now)
            born_old = {new_id for new_id, _ in plan.born_superseded}
            for fact in plan.new:
                # its vector is written after this commit (`indexed` says whether that happened yet)
                conn.execute(
                    "INSERT INTO facts (id, team, agent_id, memory_id, text, norm, shape, tags, created_at, indexed, "
                    "pinned) VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                    (
                        fact.id,
                        memory.team,
                        memory.agent_id,
                        memory.id,
                        fact.text,
                        fact.norm,
                        fact.shape,
                        tags,
                        memory.created_at,
                        1 if fact.id in born_old else 0,
                        1 if memory.pinned else 0,
                    ),
                )
                self._add_sources(conn, fact.id, memory.id, fact.spans, now)
            for fact_id, spans in plan.merged:
                self._add_sources(conn, fact_id, memory.id, spans, now)
            for fact_id, context_id, (start, end) in plan.context_sources:
                # only while that earlier save is live (a source must never point at a forgotten text), and
                # only within the write scope: a pinned save's facts rest on its agent's saves alone, and no
                # other agent's fact rests on a pinned save
                conn.execute(
                    "INSERT INTO fact_sources (fact_id, memory_id, span_start, span_end, added_at) "
                    "SELECT ?, id, ?, ?, ? FROM memories WHERE id = ? AND team = ? AND status != ? "
                    "AND (agent_id = ? OR (pinned = 0 AND ? = 0)) ON CONFLICT DO NOTHING",
                    (fact_id, start, end, now, context_id, memory.team, DELETED, memory.agent_id, int(memory.pinned)),
                )
            for old_id, new_id in plan.superseded + plan.born_superseded:
                conn.execute(
                    "UPDATE facts SET superseded_by = ?, superseded_at = ? WHERE id = ? AND team = ?",
                    (new_id, now, old_id, memory.team),
                )
            for old_id, _ in plan.superseded:  # its vector goes after the commit (the to-do list survives a crash)
                conn.execute(
                    "INSERT INTO fact_purges (team, fact_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    (memory.team, old_id),
                )
            conn.execute(
                "UPDATE memories SET status = ?, attempts = attempts + 1, finished_at = ?, last_error = NULL, "
                "raw_reply = ?, timings = ?, report = ?, progress = NULL, lease_owner = NULL WHERE id = ?",
                (DONE, now, raw_reply, _dumps(timings), _dumps(report), memory.id),
            )
            notify_extracted(conn, memory, plan, now)  # the webhook notice commits with the facts
        return True

    @staticmethod
    def _add_sources(conn: Any, fact_id: str, memory_id: str, spans: Iterable[tuple[int, int]], now: float) -> None:
        for start, end in spans or [(0, 0)]:
            conn.execute(
                "INSERT INTO fact_sources (fact_id, memory_id, span_start, span_end, added_at) "
                "VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING",
                (fact_id, memory_id, start, end, now),
            )

    def mark_facts_indexed(self, fact_ids: list[str]) -> None:
        if fact_ids:
            with self.db.transaction(durable=False) as conn:
                conn.executemany("UPDATE facts SET indexed = 1 WHERE id = ?", [(f,) for f in fact_ids])

    def unindexed_facts(self, limit: int) -> list[tuple[Fact, str | None]]:
        """Active facts whose vector was never written (a stop between commit and upsert), with their run."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT f.*, m.run_id AS run_id FROM facts f LEFT JOIN memories m ON m.id = f.memory_id "
                "WHERE f.indexed = 0 AND f.superseded_by IS NULL ORDER BY f.created_at LIMIT ?",
                (limit,),
            ).fetchall()
        return [(_fact_from_row(r), r["run_id"]) for r in rows]

    def existing_facts(self, fact_ids: list[str]) -> set[str]:
        if not fact_ids:
            return set()
        marks = ",".join("?" * len(fact_ids))
        with self.db.reading() as conn:
            rows = conn.execute(f"SELECT id FROM facts WHERE id IN ({marks})", fact_ids).fetchall()
        return {row[0] for row in rows}

    def facts_of_memory(self, team: str, memory_id: str) -> list[Fact]:
        """Facts this memory produced or confirmed, superseded ones included (its history)."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT f.*, s.span_start, s.span_end FROM fact_sources s JOIN facts f ON f.id = s.fact_id "
                "WHERE s.memory_id = ? AND f.team = ? ORDER BY f.created_at, s.span_start",
                (memory_id, team),
            ).fetchall()
        facts: dict[str, Fact] = {}
        for row in rows:
            fact = facts.get(row["id"]) or facts.setdefault(row["id"], _fact_from_row(row))
            fact.sources.append({"memory_id": memory_id, "span": [row["span_start"], row["span_end"]]})
        return list(facts.values())

    def fact_recall_rows(
        self, team: str, fact_ids: list[str]
    ) -> dict[str, tuple[str, str, float, tuple[str, ...], str]]:
        """(memory_id, agent_id, created_at, tags, text) of the team's active facts among these ids: what
        recall shows, without building whole `Fact`s on its hot path."""
        if not fact_ids:
            return {}
        marks = ",".join("?" * len(fact_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT id, memory_id, agent_id, created_at, tags, text FROM facts WHERE id IN ({marks}) "
                "AND +team = ? AND superseded_by IS NULL",
                (*fact_ids, team),
            ).fetchall()
        return {r[0]: (r[1], r[2], float(r[3]), tags_of(r[4]), r[5]) for r in rows}

    def fact_sources(self, fact_ids: list[str]) -> dict[str, list[tuple[str, int, int]]]:
        if not fact_ids:
            return {}
        marks = ",".join("?" * len(fact_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT fact_id, memory_id, span_start, span_end FROM fact_sources WHERE fact_id IN ({marks}) "
                "ORDER BY added_at",
                fact_ids,
            ).fetchall()
        out: dict[str, list[tuple[str, int, int]]] = {}
        for row in rows:
            out.setdefault(row[0], []).append((row[1], row[2], row[3]))
        return out

    def active_facts_by_norm(self, team: str, norm: str, writer: Memory | None = None) -> list[Fact]:
        """The team's active facts with this normalised text (only those `writer` may change, when given)."""
        scope, args = write_scope(writer)
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT * FROM facts WHERE team = ? AND norm = ? AND superseded_by IS NULL{scope}", (team, norm, *args)
            ).fetchall()
        return [_fact_from_row(r) for r in rows]

    def active_facts_by_shape(self, team: str, shape: str, writer: Memory | None = None) -> list[Fact]:
        """The team's active facts of this shape (only those `writer` may change, when given)."""
        scope, args = write_scope(writer)
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT * FROM facts WHERE team = ? AND shape = ? AND superseded_by IS NULL{scope}",
                (team, shape, *args),
            ).fetchall()
        return [_fact_from_row(r) for r in rows]

    def facts_by_ids(self, team: str, fact_ids: list[str], writer: Memory | None = None) -> dict[str, Fact]:
        """The team's facts among these ids (only those `writer` may change, when given)."""
        if not fact_ids:
            return {}
        scope, args = write_scope(writer)
        marks = ",".join("?" * len(fact_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT * FROM facts WHERE id IN ({marks}) AND +team = ?{scope}", (*fact_ids, team, *args)
            ).fetchall()
        return {r["id"]: _fact_from_row(r) for r in rows}


def write_scope(writer: Memory | None) -> tuple[str, tuple[str, ...]]:
    """The facts a save may merge into or supersede, as SQL (docs/security.md, "Write scope"): a pinned save
    only its own agent's; an unpinned one the team's, except another agent's pinned facts. A pinned agent's
    share changes only through that agent, so neither its view nor the others' shows what the other holds.
    None (no writer): every fact of the team, for readers."""
    if writer is None:
        return "", ()
    if writer.pinned:
        return " AND agent_id = ?", (writer.agent_id,)
    return " AND (pinned = 0 OR agent_id = ?)", (writer.agent_id,)
