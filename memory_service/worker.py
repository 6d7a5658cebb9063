"""The extraction loop: one worker per llama-server slot, jobs from the journal.

A worker never dies on a job's error: every failure is written on the job
(error, raw reply, timings) and retried with back-off until the attempt limit.
A job that can't finish within its budget is deferred, not run late. When the
model server is down, jobs wait for it without spending their attempts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .extraction.errors import ContextOverflow, ExtractionError, LlmUnavailable
from .extraction.extractor import MIN_OUTPUT_TOKENS, Extractor
from .indexing import index_passages, store_facts
from .storage.journal import FAILED, Memory

if TYPE_CHECKING:
    from .services import Services

log = logging.getLogger("memory_service.worker")

MAX_RETRY_DELAY_S = 300.0
IDLE_POLL_S = 1.0


async def extraction_loop(services: "Services", worker_no: int) -> None:
    while True:
        try:
            extractor = await services.model.wait_ready()
            job = await asyncio.to_thread(services.journal.claim_next)
            if job is None:
                await services.wait_for_work(IDLE_POLL_S)
                continue
            await process_job(services, extractor, job)
        except asyncio.CancelledError:
            raise
        except Exception:  # the loop must outlive any bug in one job
            log.exception("extraction worker %d: unexpected error", worker_no)
            await asyncio.sleep(1.0)


def min_seconds_needed(services: "Services", job: Memory) -> float:
    """Time to read the prompt and write a minimal answer, at the measured rates (0 before any measurement)."""
    throughput = services.model.throughput
    gen, prompt = throughput.generation_tps(), throughput.prompt_tps()
    if not gen:
        return 0.0
    prompt_tokens = min(len(job.text) // 3, 2048)
    return prompt_tokens / (prompt or 1e9) + MIN_OUTPUT_TOKENS / gen


async def process_job(services: "Services", extractor: Extractor, job: Memory) -> None:
    settings = services.settings
    journal = services.journal
    now = time.time()
    remaining = job.deadline_at - now
    needed = min_seconds_needed(services, job)
    # Too little budget left (it waited in the queue): defer with a fresh window rather than run late.
    # When even a fresh window is too short at the measured rates, deferring would loop forever and
    # never re-measure: run it, and let the deadline cut it off visibly.
    if remaining < needed and (needed <= settings.extract_budget_s or remaining <= 0):
        await asyncio.to_thread(
            journal.defer, job.id, until=now, budget_s=settings.extract_budget_s,
            reason=f"deferred: {max(remaining, 0):.1f}s of budget left when its turn came, "
                   f"{needed:.1f}s needed at the measured speed",
        )
        return
    started = time.time()
    attempt = {
        "queued_at": round(job.next_attempt_at, 3), "started_at": round(started, 3),
        "deadline_at": round(job.deadline_at, 3),
        "queue_wait_s": round(started - job.next_attempt_at, 3), "budget_s": settings.extract_budget_s,
    }
    try:
        result = await extractor.extract(job.text, job.deadline_at, chunk_budget_s=settings.extract_budget_s)
    except LlmUnavailable as exc:
        if not await services.model.client.health():
            services.model.mark_down(str(exc))
            await asyncio.to_thread(
                journal.defer, job.id, until=time.time() + 1.0, budget_s=settings.extract_budget_s,
                reason=f"model server unreachable, waiting: {exc}",
            )
            return
        await _record_failure(services, job, exc, attempt)
        return
    except ContextOverflow as exc:
        # the server may have been restarted with a smaller -c: re-read /props before the retry
        await services.model.probe()
        await _record_failure(services, job, exc, attempt)
        return
    except ExtractionError as exc:
        await _record_failure(services, job, exc, attempt)
        return
    except Exception as exc:  # a bug must show on the job, not vanish
        log.exception("job %s: unexpected error", job.id)
        await _record_failure(services, job, ExtractionError(f"internal error: {exc!r}"), attempt)
        return
    services.model.throughput.observe_job(time.time() - started)
    try:
        plan = await asyncio.to_thread(
            store_facts, job, result.facts, journal=journal, embedder=services.embedder, vectors=services.vectors,
            near_duplicate=settings.dedup_threshold,
        )
        report = {
            **result.report,
            "stored": len(plan.new), "merged": len(plan.merged),
            "superseded": len(plan.superseded) + len(plan.born_superseded),
        }
        timings = {**result.timings, "attempt": _finish(attempt)}
        await asyncio.to_thread(
            journal.complete, job, plan, raw_reply="\n".join(result.raw_replies), timings=timings, report=report
        )
    except Exception as exc:  # storing failed: the job must not be left 'extracting'
        log.exception("job %s: storing facts failed", job.id)
        await _record_failure(services, job, ExtractionError(f"storing facts failed: {exc!r}"), attempt)


def _finish(attempt: dict) -> dict:
    """Close an attempt's record: when it ended and how far past its (first chunk's) deadline."""
    ended = time.time()
    return {**attempt, "ended_at": round(ended, 3), "elapsed_s": round(ended - attempt["started_at"], 3),
            "overrun_s": round(ended - attempt["deadline_at"], 3)}


async def _record_failure(services: "Services", job: Memory, exc: ExtractionError, attempt: dict) -> None:
    settings = services.settings
    attempts = job.attempts + 1
    retry_at = None
    if exc.retryable and attempts < settings.max_attempts:
        retry_at = time.time() + min(MAX_RETRY_DELAY_S, settings.retry_base_s * (2 ** (attempts - 1)))
    timings = {**(exc.timings or {}), "attempt": _finish(attempt)}
    status = await asyncio.to_thread(
        services.journal.fail_attempt, job.id, error=f"{type(exc).__name__}: {exc}", raw_reply=exc.raw_reply,
        timings=timings, report=exc.report, retry_at=retry_at, budget_s=settings.extract_budget_s,
    )
    log.warning("job %s attempt %d failed (%s): %s", job.id, attempts, status, exc)
    if status == FAILED:
        log.error("job %s failed after %d attempts; its passage stays recallable", job.id, attempts)


async def passage_loop(services: "Services") -> None:
    """Embed newly saved texts as passages, oldest first, in small batches (recall shares the embedder)."""
    while True:
        try:
            batch = await asyncio.to_thread(services.journal.unindexed, 16)
            if not batch:
                await services.wait_for_passages(IDLE_POLL_S)
                continue
            await asyncio.to_thread(index_passages, batch, services.embedder, services.vectors)
            await asyncio.to_thread(services.journal.mark_indexed, [m.id for m in batch])
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("passage indexer: unexpected error")
            await asyncio.sleep(1.0)
