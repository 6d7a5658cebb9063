"""The extraction loop: one worker per llama-server slot, jobs from the journal.

A worker never dies on a job's error: every failure is written on the job
(error, raw reply, timings) and retried with back-off until the attempt limit.
Only errors spend attempts. Slowness does not: every model call gets its own
budget window when it starts (a queued job is not charged for its wait), long
texts are cut into chunks that fit that window at the measured speed, and a
call that still runs out of time makes the job resume with smaller chunks.
When even the smallest piece runs out of time (a machine busy with something
else), or its reply is cut at the output cap lowered to the measured speed, the
job waits a doubling pause and resumes sooner once a call fits again.
When the model server is down, jobs wait for it without spending attempts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..embedding.embedder import Embedder
from ..extraction.coverage import Asked, asked_in, speaker_of
from ..extraction.errors import ContextOverflow, CutBySpeed, ExtractionError, LlmTimeout, LlmUnavailable, TooSlow
from ..extraction.extractor import Earlier, ExtractionResult, Extractor, Progress, earlier_context
from ..extraction.gate import small_talk_reason
from ..llm.handle import ModelHandle
from ..storage.jobs import SLOW_WAIT
from ..storage.journal import DELETED, FAILED, LOST, QUEUED, FactPlan, Journal, Memory
from ..storage.vectors import VectorStore
from .background import IDLE_POLL_S, process_holder, wait_for
from .dedup import decide_facts, probe_facts
from .forgetting import Forgetter
from .passages import write_fact_vectors
from .postprocess import Postprocessed, postprocess, skipped_report

if TYPE_CHECKING:  # a type only: the registry (metrics.py) reads the pipeline's job history
    from ..metrics import Metrics

log = logging.getLogger("memory_service.pipeline.worker")

MAX_RETRY_DELAY_S = 300.0
# a failed attempt's outcome, by the status `fail_attempt` leaves the job in
FAIL_OUTCOMES = {QUEUED: "retried", FAILED: "failed", DELETED: "forgotten", LOST: "lost"}


@dataclass
class ExtractionWorker:
    """Takes jobs from the journal and extracts their facts: one per llama-server, `run` once per slot.

    It sees only what it uses: the journal, the model, the fact index, the metrics
    (every attempt's outcome), the service's forgetter, and a callback for jobs that reach done or failed
    (so a saver waiting on one wakes).
    """

    settings: Settings
    journal: Journal
    model: ModelHandle
    embedder: Embedder
    vectors: VectorStore
    metrics: Metrics
    forgetter: Forgetter  # after a commit: removes the vectors of the facts it superseded
    settled: Callable[[str], None] = lambda memory_id: None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    holder: str = field(default_factory=process_holder)  # this process, in job leases

    async def run(self, worker_no: int = 0) -> None:
        while True:
            try:
                extractor = await self.model.wait_ready()
                paused = self.model.throughput.paused_for(time.time())
                if paused > 0:  # too slow for the budget a moment ago: no job is tried before the pause ends
                    await asyncio.sleep(min(paused, IDLE_POLL_S))
                    continue
                worker = f"{self.holder}:{worker_no}"
                job = await asyncio.to_thread(
                    self.journal.claim_next,
                    worker,
                    self.settings.job_lease_s,
                    None,
                    self.settings.max_attempts,
                )
                if job is None:
                    await wait_for(self.wake, IDLE_POLL_S)
                    continue
                lease = asyncio.create_task(self._keep_lease(job, worker))
                try:
                    await self.process(extractor, job)
                finally:
                    lease.cancel()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any bug in one job
                log.exception("extraction worker %d: unexpected error", worker_no)
                await asyncio.sleep(1.0)

    async def _keep_lease(self, job: Memory, worker: str) -> None:
        """Renew the job's lease (held by `worker`) while it runs, so no other worker or process takes it over."""
        lease_s = self.settings.job_lease_s
        while True:
            await asyncio.sleep(lease_s / 3)
            if not await asyncio.to_thread(self.journal.renew, job.id, worker, lease_s):
                log.warning("job %s: lease lost to another worker; its result will not be stored", job.id)
                return

    async def process(self, extractor: Extractor, job: Memory) -> None:
        """One claimed job: extract, post-process, decide and store; every outcome is written on the job."""
        started = time.time()
        attempt = self._attempt_record(job, started)
        skipped = small_talk_reason(job.text) if self.settings.skip_small_talk else None
        if skipped is not None:
            await self._finish_skipped(job, skipped, attempt)
            return
        progress = Progress.from_dict(job.progress)
        result = await self._extract(extractor, job, attempt, progress, started)
        if result is None:  # deferred or failed: the job says which
            return
        self.model.throughput.observe_job(time.time() - started)
        await self._resume_waiting()
        if not await asyncio.to_thread(self.journal.live, [job.id]):
            log.info("job %s: its memory was forgotten during extraction; nothing stored", job.id)
            self.metrics.job(job.team, "forgotten", time.time() - started)
            self.settled(job.id)
            return
        try:
            processed = await self._postprocess(result, job)
            timings = {**result.timings, "attempt": _finish(attempt, result.report.get("calls", []))}
            raw_reply = "\n".join(result.raw_replies)
            rejected = [r.code for r in result.rejected]
            await asyncio.to_thread(self._decide_and_store, job, processed, raw_reply, timings, started, rejected)
            self.settled(job.id)
        except Exception as exc:  # storing failed: the job must not be left 'extracting'
            log.exception("job %s: storing facts failed", job.id)
            await self._fail(job, ExtractionError(f"storing facts failed: {exc!r}"), attempt, progress)

    def _attempt_record(self, job: Memory, started: float) -> dict[str, Any]:
        """The start of this attempt's record on the job's timings (`_finish` closes it)."""
        return {
            "queued_at": round(job.next_attempt_at, 3),
            "started_at": round(started, 3),
            "queue_wait_s": round(started - job.next_attempt_at, 3),
            "budget_s": self.settings.extract_budget_s,
            "server": self.model.client.base_url,  # which llama-server of the pool took it (for operators)
        }

    async def _finish_skipped(self, job: Memory, reason: str, attempt: dict[str, Any]) -> None:
        """Nothing to extract: done at once, no model call; the passage stays recallable."""
        timings = {"attempt": _finish(attempt, [])}
        report = skipped_report(reason)
        await asyncio.to_thread(self.journal.complete, job, FactPlan(), raw_reply=None, timings=timings, report=report)
        self.metrics.job(job.team, "done")
        self.settled(job.id)

    async def _extract(
        self, extractor: Extractor, job: Memory, attempt: dict[str, Any], progress: Progress, started: float
    ) -> ExtractionResult | None:
        """The model's facts; None when the attempt ended otherwise (deferred or failed, written on the job)."""
        budget_s = self.settings.extract_budget_s

        async def keep(progress: Progress) -> None:
            await asyncio.to_thread(self.journal.save_progress, job.id, progress.to_dict(), job.lease_owner)

        context = await self._earlier_context(job)
        try:
            return await extractor.extract(
                job.text, budget_s=budget_s, progress=progress, on_chunk=keep, context=context
            )
        except TooSlow as exc:
            # Not an error: the machine is slower than measured. Resume at once with smaller chunks, in
            # the job's place in the queue, without spending an attempt.
            self.model.throughput.slow_down(exc.chunk_tokens + await extractor.system_tokens(), budget_s)
            await keep(progress)
            reason = f"slower than measured, resuming with smaller chunks: {exc}"
            await self._defer(job, started, until=job.next_attempt_at, reason=reason)
        except LlmUnavailable as exc:
            if await self.model.went_down(str(exc)):
                await self._defer(
                    job, started, until=time.time() + 1.0, reason=f"model server unreachable, waiting: {exc}"
                )
            else:
                await self._fail(job, exc, attempt, progress)
        except LlmTimeout as exc:
            if isinstance(exc, CutBySpeed) and exc.sooner:
                # the cut call itself measured a machine fast enough for a larger cap: go again at once
                await keep(progress)
                reason = f"faster again, resuming with a larger output cap: {exc}"
                await self._defer(job, started, until=job.next_attempt_at, reason=reason)
            elif exc.smallest_piece is None or not await self._wait_for_speed(job, exc, started, progress):
                await self._fail(job, exc, attempt, progress)
        except ContextOverflow as exc:
            # the server may have been restarted with a smaller -c: re-read /props before the retry
            await self.model.probe()
            await self._fail(job, exc, attempt, progress)
        except ExtractionError as exc:
            await self._fail(job, exc, attempt, progress)
        except Exception as exc:  # a bug must show on the job, not vanish
            log.exception("job %s: unexpected error", job.id)
            await self._fail(job, ExtractionError(f"internal error: {exc!r}"), attempt, progress)
        return None

    async def _wait_for_speed(self, job: Memory, exc: LlmTimeout, started: float, progress: Progress) -> bool:
        """Even the smallest piece missed its window (or its reply was cut at the cap the speed allowed: a
        CutBySpeed): the machine is busy, so the job waits a doubling pause instead of spending an attempt. False once the model has been too slow for MEMORY_SLOW_GIVE_UP_S
        (that is no busy moment: the timeout is an error again, and says what to change)."""
        settings, now = self.settings, time.time()
        slow_for = self.model.throughput.slow_for(now)
        if settings.slow_give_up_s <= 0 or (slow_for is not None and slow_for >= settings.slow_give_up_s):
            return False
        pause = self.model.throughput.too_slow(now, settings.slow_pause_s, settings.slow_pause_max_s)
        if progress.chunks:  # the pieces already extracted are kept
            await asyncio.to_thread(self.journal.save_progress, job.id, progress.to_dict(), job.lease_owner)
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - (slow_for or 0.0)))
        reason = (
            f"{SLOW_WAIT}slower than MEMORY_EXTRACT_BUDGET_S={settings.extract_budget_s:g} allows since {since} "
            f"(a busy machine?); tried again in {pause:g}s, or as soon as a call fits its window; no attempt "
            f"spent. {exc}"
        )
        log.warning("job %s: %s", job.id, reason)
        await self._defer(job, started, until=now + pause, reason=reason)
        return True

    async def _resume_waiting(self) -> None:
        """A job was extracted within the budget: the jobs waiting out a slow model need not wait any longer
        (unless this very server was found too slow again meanwhile)."""
        if self.model.throughput.paused_for(time.time()) > 0:
            return
        budget_s = self.settings.extract_budget_s
        if await asyncio.to_thread(self.journal.resume_waiting, budget_s=budget_s):
            self.wake.set()

    async def _earlier_context(self, job: Memory) -> list[Earlier]:
        """The earlier saves of the job's conversation, shown to the model as past turns (when configured)."""
        settings = self.settings
        if not (settings.extract_context_saves and settings.extract_context_chars):
            return []
        earlier = await asyncio.to_thread(
            self.journal.context_for,
            job,
            block=settings.extract_context_saves,
            window_s=settings.extract_context_window_s,
        )
        return earlier_context([(m.id, m.text, m.raw_reply) for m in earlier], settings.extract_context_chars)

    async def _defer(self, job: Memory, started: float, *, until: float, reason: str) -> None:
        """Put the job back without spending an attempt (slowness, or the model server down)."""
        await asyncio.to_thread(
            self.journal.defer,
            job.id,
            until=until,
            budget_s=self.settings.extract_budget_s,
            reason=reason,
            owner=job.lease_owner,
        )
        self.metrics.job(job.team, "deferred", time.time() - started)

    async def _postprocess(self, result: ExtractionResult, job: Memory) -> Postprocessed:
        fill = self.settings.extract_complete
        asked = await asyncio.to_thread(self._question_before, job) if fill and speaker_of(job.text) else None
        return postprocess(result, job, fill=fill, asked=asked, zone=self.settings.timezone)

    def _question_before(self, job: Memory) -> Asked | None:
        """The question the save just before this one in its conversation ended on (read only for a chat
        line: a text with no speaker gets no answer pair, so its saves pay no query)."""
        earlier = self.journal.context_for(job, block=1, window_s=self.settings.extract_context_window_s)
        return asked_in(earlier[-1].id, earlier[-1].text) if earlier else None

    def _decide_and_store(
        self,
        job: Memory,
        processed: Postprocessed,
        raw_reply: str,
        timings: dict[str, Any],
        started: float,
        rejected: list[str],
    ) -> None:
        """Decide the job's facts and commit them in one transaction, one decision per team at a time;
        then write their vectors (after the commit: the journal is the truth, Chroma follows it). The
        vector store is read before the team's lock and written after it: a store that hangs must not hold
        the lock its forgets and other decisions wait on."""
        probes = probe_facts(
            job,
            processed.facts,
            journal=self.journal,
            embedder=self.embedder,
            vectors=self.vectors,
            near_duplicate=self.settings.dedup_threshold,
        )
        with self.journal.deciding(job.team):
            plan, items = decide_facts(
                job,
                processed.facts,
                journal=self.journal,
                embedder=self.embedder,
                probes=probes,
                near_duplicate=self.settings.dedup_threshold,
            )
            report = {
                **processed.report,
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
            self.forgetter.finish_pending()
        except Exception:  # the facts are stored and keyword-searchable; the indexer writes the vectors later
            log.warning(
                "job %s: facts stored, writing their vectors failed; the indexer will retry", job.id, exc_info=True
            )

    async def _fail(
        self, job: Memory, exc: ExtractionError, attempt: dict[str, Any], progress: Progress | None
    ) -> None:
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


def _finish(attempt: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
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
