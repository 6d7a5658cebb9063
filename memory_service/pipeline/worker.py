"""The extraction loop: one worker per llama-server slot, jobs from the journal.

A worker never dies on a job's error: every failure is written on the job
(error, raw reply, timings) and retried with back-off until the attempt limit.
Only errors spend attempts. Slowness does not: every model call gets its own
budget window when it starts (a queued job is not charged for its wait), long
texts are cut into chunks that fit that window at the measured speed, and a
call that still runs out of time makes the job resume with smaller chunks.
When the model server is down, jobs wait for it without spending attempts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from memory_service.config import Settings
from memory_service.embedding.embedder import Embedder
from memory_service.extraction.coverage import Asked, asked_in, complete, speaker_of
from memory_service.extraction.dates import occurred, resolve_facts
from memory_service.extraction.errors import ContextOverflow, ExtractionError, LlmUnavailable, TooSlow
from memory_service.extraction.extractor import Earlier, Extractor, Progress, earlier_context
from memory_service.extraction.gate import small_talk_reason
from memory_service.extraction.prompt import PROMPT_VERSION
from memory_service.llm.handle import ModelHandle
from memory_service.metrics import Metrics
from memory_service.pipeline.forgetting import finish_pending, passage_ids
from memory_service.pipeline.passages import decide_facts, fact_items, index_passages
from memory_service.storage.journal import DELETED, FAILED, LOST, QUEUED, FactPlan, Journal, Memory
from memory_service.storage.vectors import VectorItem, VectorStore

log = logging.getLogger("memory_service.pipeline.worker")

MAX_RETRY_DELAY_S = 300.0
# a failed attempt's outcome, by the status `fail_attempt` leaves the job in
FAIL_OUTCOMES = {QUEUED: "retried", FAILED: "failed", DELETED: "forgotten", LOST: "lost"}
IDLE_POLL_S = 1.0
FACT_SWEEP_S = 60.0


BACKGROUND_NICENESS = 10


def lower_priority() -> None:
    """Lower this thread's CPU priority (Linux: each thread has its own nice value); elsewhere a no-op."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)
    except (AttributeError, OSError):
        pass


def _day_of(job: Memory, zone: str) -> date:
    """The day the text was said: relative dates in its facts count from it (older journals: the save day)."""
    return date.fromisoformat(job.occurred_day or occurred(None, job.created_at, zone)[1])


def process_holder() -> str:
    """Names this process in job leases: host, pid and a nonce (a pid is reused after a restart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


async def wait_for(event: asyncio.Event, timeout: float) -> None:
    """Until `event` is set or `timeout` passes; then clear it (one wake-up per notification)."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass
    event.clear()


@dataclass
class ExtractionWorker:
    """Takes jobs from the journal and extracts their facts: one per llama-server, `run` once per slot.

    It sees only what it uses: the journal, the model, the fact index, the metrics
    (every attempt's outcome), and a callback for jobs that reach done or failed
    (so a saver waiting on one wakes).
    """

    settings: Settings
    journal: Journal
    model: ModelHandle
    embedder: Embedder
    vectors: VectorStore
    metrics: Metrics
    settled: Callable[[str], None] = lambda memory_id: None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    holder: str = field(default_factory=process_holder)  # this process, in job leases

    async def run(self, worker_no: int = 0) -> None:
        while True:
            try:
                extractor = await self.model.wait_ready()
                job = await asyncio.to_thread(
                    self.journal.claim_next,
                    f"{self.holder}:{worker_no}",
                    self.settings.job_lease_s,
                    None,
                    self.settings.max_attempts,
                )
                if job is None:
                    await wait_for(self.wake, IDLE_POLL_S)
                    continue
                lease = asyncio.create_task(self._keep_lease(job))
                try:
                    await self.process(extractor, job)
                finally:
                    lease.cancel()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any bug in one job
                log.exception("extraction worker %d: unexpected error", worker_no)
                await asyncio.sleep(1.0)

    async def _keep_lease(self, job: Memory) -> None:
        """Renew the job's lease while it runs, so no other worker or process takes it over."""
        lease_s = self.settings.job_lease_s
        while True:
            await asyncio.sleep(lease_s / 3)
            if not await asyncio.to_thread(self.journal.renew, job.id, job.lease_owner, lease_s):
                log.warning("job %s: lease lost to another worker; its result will not be stored", job.id)
                return

    async def process(self, extractor: Extractor, job: Memory) -> None:
        settings, journal = self.settings, self.journal
        started = time.time()
        attempt: dict[str, Any] = {
            "queued_at": round(job.next_attempt_at, 3),
            "started_at": round(started, 3),
            "queue_wait_s": round(started - job.next_attempt_at, 3),
            "budget_s": settings.extract_budget_s,
            "server": self.model.client.base_url,  # which llama-server of the pool took it (for operators)
        }
        skipped = small_talk_reason(job.text) if settings.skip_small_talk else None
        if skipped is not None:
            # nothing to extract: done at once, no model call; the passage stays recallable
            report = {
                "skipped": skipped,
                "prompt_version": PROMPT_VERSION,
                "chunks": 0,
                "calls": [],
                "proposed": 0,
                "stored": 0,
                "merged": 0,
                "superseded": 0,
                "rejected": [],
            }
            await asyncio.to_thread(
                journal.complete,
                job,
                FactPlan(),
                raw_reply=None,
                timings={"attempt": _finish(attempt, [])},
                report=report,
            )
            self.metrics.job(job.team, "done")
            self.settled(job.id)
            return
        progress = Progress.from_dict(job.progress)

        async def keep(progress: Progress) -> None:
            await asyncio.to_thread(journal.save_progress, job.id, progress.to_dict(), job.lease_owner)

        context: list[Earlier] = []
        if settings.extract_context_saves and settings.extract_context_chars:
            earlier = await asyncio.to_thread(
                journal.context_for,
                job,
                block=settings.extract_context_saves,
                window_s=settings.extract_context_window_s,
            )
            context = earlier_context([(m.id, m.text, m.raw_reply) for m in earlier], settings.extract_context_chars)
        try:
            result = await extractor.extract(
                job.text, budget_s=settings.extract_budget_s, progress=progress, on_chunk=keep, context=context
            )
        except TooSlow as exc:
            # Not an error: the machine is slower than measured. Resume at once with smaller chunks, in
            # the job's place in the queue, without spending an attempt.
            self.model.throughput.slow_down(
                exc.chunk_tokens + await extractor.system_tokens(), settings.extract_budget_s
            )
            await asyncio.to_thread(journal.save_progress, job.id, progress.to_dict(), job.lease_owner)
            await asyncio.to_thread(
                journal.defer,
                job.id,
                until=job.next_attempt_at,
                budget_s=settings.extract_budget_s,
                reason=f"slower than measured, resuming with smaller chunks: {exc}",
                owner=job.lease_owner,
            )
            self.metrics.job(job.team, "deferred", time.time() - started)
            return
        except LlmUnavailable as exc:
            if await self.model.went_down(str(exc)):
                await asyncio.to_thread(
                    journal.defer,
                    job.id,
                    until=time.time() + 1.0,
                    budget_s=settings.extract_budget_s,
                    reason=f"model server unreachable, waiting: {exc}",
                    owner=job.lease_owner,
                )
                self.metrics.job(job.team, "deferred", time.time() - started)
                return
            await self._fail(job, exc, attempt, progress)
            return
        except ContextOverflow as exc:
            # the server may have been restarted with a smaller -c: re-read /props before the retry
            await self.model.probe()
            await self._fail(job, exc, attempt, progress)
            return
        except ExtractionError as exc:
            await self._fail(job, exc, attempt, progress)
            return
        except Exception as exc:  # a bug must show on the job, not vanish
            log.exception("job %s: unexpected error", job.id)
            await self._fail(job, ExtractionError(f"internal error: {exc!r}"), attempt, progress)
            return
        self.model.throughput.observe_job(time.time() - started)
        if not await asyncio.to_thread(journal.live, [job.id]):
            log.info("job %s: its memory was forgotten during extraction; nothing stored", job.id)
            self.metrics.job(job.team, "forgotten", time.time() - started)
            self.settled(job.id)
            return
        try:
            facts = result.facts
            base = {**result.report}
            completed = None
            if settings.extract_complete:
                asked = await asyncio.to_thread(self._question_before, job) if speaker_of(job.text) else None
                completed = complete(facts, job.text, asked)
                facts = completed.facts
            facts = resolve_facts(facts, _day_of(job, settings.timezone))
            if completed is not None:
                base["completed"] = {
                    "speaker": completed.speaker,
                    "first_person_rewritten": completed.rewritten,
                    "sentences_added": completed.added,
                    "answers_question_of": completed.answered_id,
                    "speaker_named": completed.attributed,
                    # which facts code added, not the model (they come after the model's): the evals tell them apart
                    "added_facts": [f.text for f in facts[len(result.facts) :]],
                }
            if job.deferrals and (job.last_error or "").startswith("slower than measured"):
                base["slow"] = (
                    f"finished after {job.deferrals} deferral(s): the model was slower than the "
                    "budget allowed, so the text was split into smaller chunks"
                )
            elif job.deferrals:  # not slowness: e.g. its llama-server died mid-request and another took it
                base["deferred"] = f"finished after {job.deferrals} deferral(s); the last: {job.last_error}"
            timings = {**result.timings, "attempt": _finish(attempt, result.report.get("calls", []))}
            await asyncio.to_thread(
                self._decide_and_store,
                job,
                facts,
                base,
                "\n".join(result.raw_replies),
                timings,
                started,
                [r.code for r in result.rejected],
            )
            self.settled(job.id)
        except Exception as exc:  # storing failed: the job must not be left 'extracting'
            log.exception("job %s: storing facts failed", job.id)
            await self._fail(job, ExtractionError(f"storing facts failed: {exc!r}"), attempt, progress)

    def _question_before(self, job: Memory) -> Asked | None:
        """The question the save just before this one in its conversation ended on (read only for a chat
        line: a text with no speaker gets no answer pair, so its saves pay no query)."""
        earlier = self.journal.context_for(job, block=1, window_s=self.settings.extract_context_window_s)
        return asked_in(earlier[-1].id, earlier[-1].text) if earlier else None

    def _decide_and_store(
        self,
        job: Memory,
        facts: list,
        base: dict[str, Any],
        raw_reply: str,
        timings: dict[str, Any],
        started: float,
        rejected: list[str],
    ) -> None:
        """Decide the job's facts and commit them in one transaction, one decision per team at a time;
        then write their vectors (after the commit: the journal is the truth, Chroma follows it)."""
        with self.journal.deciding(job.team):
            plan, items = decide_facts(
                job,
                facts,
                journal=self.journal,
                embedder=self.embedder,
                vectors=self.vectors,
                near_duplicate=self.settings.dedup_threshold,
            )
            report = {
                **base,
                "stored": len(plan.new),
                "merged": len(plan.merged),
                "superseded": len(plan.superseded) + len(plan.born_superseded),
            }
            stored = self.journal.complete(job, plan, raw_reply=raw_reply, timings=timings, report=report)
        if not stored:  # forgotten meanwhile, or the lease was lost: nothing was written
            self.metrics.job(job.team, "forgotten", time.time() - started)
            return
        # counted at the commit, when the job reads `done`
        self.metrics.job(job.team, "done", time.time() - started)
        self.metrics.facts(
            job.team,
            stored=report["stored"],
            merged=report["merged"],
            superseded=report["superseded"],
            rejected=rejected,
        )
        try:
            write_fact_vectors(self.journal, self.vectors, job.team, items)
        except Exception:  # the facts are stored and keyword-searchable; the indexer writes the vectors later
            log.warning(
                "job %s: facts stored, writing their vectors failed; the indexer will retry", job.id, exc_info=True
            )

    async def _fail(self, job: Memory, exc: ExtractionError, attempt: dict, progress: Progress | None) -> None:
        settings = self.settings
        if progress is not None and progress.chunks:
            # chunks already extracted are kept: the retry resumes after them
            await asyncio.to_thread(self.journal.save_progress, job.id, progress.to_dict(), job.lease_owner)
        attempts = job.attempts + 1
        retry_at = None
        if exc.retryable and attempts < settings.max_attempts:
            retry_at = time.time() + min(MAX_RETRY_DELAY_S, settings.retry_base_s * (2 ** (attempts - 1)))
        timings = {**(exc.timings or {}), "attempt": _finish(attempt, (exc.report or {}).get("calls", []))}
        status = await asyncio.to_thread(
            self.journal.fail_attempt,
            job.id,
            error=f"{type(exc).__name__}: {exc}",
            raw_reply=exc.raw_reply,
            timings=timings,
            report=exc.report,
            retry_at=retry_at,
            budget_s=settings.extract_budget_s,
            owner=job.lease_owner,
        )
        log.warning("job %s attempt %d failed (%s): %s", job.id, attempts, status, exc)
        self.metrics.job(job.team, FAIL_OUTCOMES.get(status, "failed"), time.time() - attempt["started_at"])
        if status == DELETED:
            self.settled(job.id)
        if status == FAILED:
            log.error("job %s failed after %d attempts; its passage stays recallable", job.id, attempts)
            self.settled(job.id)


def write_fact_vectors(journal: Journal, vectors: VectorStore, team: str, items: list[VectorItem]) -> None:
    """After a commit: the new facts' vectors, then the superseded facts' vectors removed (fact_purges)."""
    if items:
        vectors.upsert(team, items)
        journal.mark_facts_indexed([item.id for item in items])
    finish_pending(journal, vectors)


def _finish(attempt: dict, calls: list[dict[str, Any]]) -> dict:
    """Close an attempt's record: when it ended and how far past the deadline of its last model call."""
    ended = time.time()
    out = {
        **attempt,
        "ended_at": round(ended, 3),
        "elapsed_s": round(ended - attempt["started_at"], 3),
        "calls": len(calls),
    }
    deadlines = [c["deadline_at"] for c in calls if c.get("deadline_at")]
    if deadlines:
        out["deadline_at"] = deadlines[-1]
        out["overrun_s"] = round(ended - deadlines[-1], 3)
    return out


@dataclass
class PassageIndexer:
    """Embeds newly saved texts as passages, oldest first, in small batches (recall shares the embedder).

    The embedding runs on a thread of its own at a lower OS priority: on a small machine whose other
    core runs the model, a save's acknowledgement and a recall must not wait for CPU behind it.
    """

    journal: Journal
    embedder: Embedder
    vectors: VectorStore
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    _embedding: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, "passages", initializer=lower_priority)
    )

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = 0.0
        while True:
            try:
                batch = await asyncio.to_thread(self.journal.unindexed, 16)
                if not batch:
                    if time.monotonic() >= next_sweep:  # at start, then now and then: see `_sweep_facts`
                        next_sweep = time.monotonic() + FACT_SWEEP_S
                        await loop.run_in_executor(self._embedding, self._sweep_facts)
                    await wait_for(self.wake, IDLE_POLL_S)
                    continue
                await loop.run_in_executor(self._embedding, index_passages, batch, self.embedder, self.vectors)
                await asyncio.to_thread(self.journal.mark_indexed, [m.id for m in batch])
                await asyncio.to_thread(self._drop_forgotten, batch)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("passage indexer: unexpected error")
                await asyncio.sleep(1.0)

    def close(self) -> None:
        self._embedding.shutdown(wait=False, cancel_futures=True)

    def _sweep_facts(self) -> None:
        """Finish what a stop cut off between a job's commit and its vector writes: vectors of facts still
        marked unindexed, removal of superseded facts' vectors."""
        while rows := self.journal.unindexed_facts(64):
            for team, items in fact_items(rows, self.embedder).items():
                write_fact_vectors(self.journal, self.vectors, team, items)
        finish_pending(self.journal, self.vectors)

    def _drop_forgotten(self, batch: list[Memory]) -> None:
        """A text forgotten while it was being embedded: remove the passages just written for it."""
        live = self.journal.live([m.id for m in batch])
        for memory in batch:
            if memory.id not in live:
                self.vectors.delete(memory.team, passage_ids(memory.id, memory.text))
