"""One extraction attempt: size to context, ask the model per chunk, parse, ground.

Deterministic and budgeted: every model call gets its own window of MEMORY_EXTRACT_BUDGET_S from the moment it
starts, a text chunk small enough to be read and answered within it at the measured speed, and an output cap
that the measured generation rate can produce within it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .completion import Completion, CompletionClient, ServerProps
from .earlier import NO_FACTS as NO_FACTS
from .earlier import Earlier as Earlier
from .earlier import earlier_context as earlier_context
from .earlier import history_of
from .errors import (
    BadReply,
    ContextOverflow,
    CutBySpeed,
    ExtractionError,
    LlmTimeout,
    LoopedReply,
    TooSlow,
    TruncatedReply,
)
from .grounding import GroundedFact, RejectedFact, ground, normalize, split_echoes
from .loops import ANTI_LOOP
from .parsing import parse_facts
from .prompt import PROMPT_VERSION, SYSTEM_PROMPT, build_messages, facts_schema
from .sizing import MIN_CHUNK_TOKENS, Chunk, halves, plan_chunks, text_budget, time_fit_tokens
from .throughput import Throughput

MIN_OUTPUT_TOKENS = 48
TOTAL_KEYS = ("prompt_n", "cache_n", "predicted_n", "prompt_ms", "predicted_ms")


@dataclass
class Progress:
    """How far a text has been extracted, kept on the job so a deferral, retry or restart resumes it."""

    offset: int = 0  # characters of the text already extracted
    chunks: int = 0
    facts: list[dict[str, Any]] = field(default_factory=list)  # {"text", "spans"}
    rejected: list[dict[str, str]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    raws: list[str] = field(default_factory=list)
    split_echoes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Progress:
        if not data:
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class ExtractionResult:
    facts: list[GroundedFact]
    rejected: list[RejectedFact]
    raw_replies: list[str]
    timings: dict[str, Any]
    report: dict[str, Any] = field(default_factory=dict)


@dataclass
class Extractor:
    client: CompletionClient
    props: ServerProps
    throughput: Throughput
    max_output_tokens: int = 384
    max_facts: int = 12
    max_fact_chars: int = 300
    # told each completion's llama.cpp timings (token counts), e.g. for the service's metrics
    on_timings: Callable[[dict[str, Any]], None] | None = None
    _system_tokens: int | None = None

    @property
    def counted_system_tokens(self) -> int:
        """The system prompt's tokens once counted (0 before): for estimates that must not wait on the server."""
        return self._system_tokens or 0

    async def system_tokens(self) -> int:
        if self._system_tokens is None:
            self._system_tokens = await self.client.count_tokens(SYSTEM_PROMPT) + 8
        return self._system_tokens

    def output_cap(self, budget_s: float, prompt_tokens: int) -> int:
        """The most tokens the model can produce in one call's budget, at its measured rates."""
        gen_rate = self.throughput.generation_tps()
        prompt_rate = self.throughput.prompt_tps()
        if gen_rate is None:
            return self.max_output_tokens
        prompt_s = prompt_tokens / prompt_rate if prompt_rate else 0.0
        affordable = int((budget_s - prompt_s) * gen_rate * 0.85)
        return max(0, min(self.max_output_tokens, affordable))

    async def chunk_tokens(self, budget_s: float) -> tuple[int, int, int | None]:
        """(text tokens per chunk, by context, by time): a chunk must fit the context *and* the budget."""
        system_tokens = await self.system_tokens()
        by_context = text_budget(self.props.n_ctx, system_tokens, self.max_output_tokens)
        uncached = 0 if self.throughput.system_cached() else system_tokens
        by_time = time_fit_tokens(
            budget_s, uncached, self.throughput.prompt_tps(), self.throughput.generation_tps(), self.max_output_tokens
        )
        if by_time is None:
            return by_context, by_context, None
        return max(MIN_CHUNK_TOKENS, min(by_context, by_time)), by_context, by_time

    async def _context_that_fits(self, context: list[Earlier] | None, chunks: list[Any], budget: int) -> list[Earlier]:
        """The context, if the text is one chunk and both fit one call's token budget; else none."""
        if not context or len(chunks) != 1:
            return []
        tokens = await self.client.count_tokens("\n".join(f"{e.text}\n{e.answer}" for e in context))
        return context if chunks[0].tokens + tokens <= budget else []

    async def extract(
        self,
        text: str,
        *,
        budget_s: float,
        progress: Progress | None = None,
        on_chunk: Callable[[Progress], Awaitable[None]] | None = None,
        context: list[Earlier] | None = None,
    ) -> ExtractionResult:
        """Extract facts from `text`, chunk by chunk; every model call gets its own `budget_s` window.

        Chunks are sized so that each call fits the context and, at the measured speed, the budget.
        `progress` resumes a text part-way (after a deferral, a retry or a restart); `on_chunk`
        is awaited after each chunk so the caller can persist it. `context` (earlier saves of the same
        conversation, as past turns) is shown before a text that fits one call with it, so pronouns
        resolve; facts may borrow from it and keep it as a source.
        """
        run = await self._plan(text, budget_s, progress or Progress(), context)
        progress = run.progress
        for index, chunk in enumerate(run.chunks):
            await self._extract_chunk(run, chunk)
            progress.chunks += 1
            last = index + 1 == len(run.chunks)
            progress.offset = len(text) if last else run.base + run.chunks[index + 1].start
            if on_chunk is not None and not last:
                await on_chunk(progress)
        kept = [
            GroundedFact(f["text"], [tuple(s) for s in f["spans"]], [tuple(c) for c in f.get("context", [])])
            for f in progress.facts
        ]
        rejected = [RejectedFact(r["text"], r["reason"], r.get("code", "other")) for r in progress.rejected]
        return ExtractionResult(kept, rejected, progress.raws, dict(progress.totals), self._report(run))

    async def _plan(self, text: str, budget_s: float, progress: Progress, context: list[Earlier] | None) -> _Run:
        """Size the rest of the text (from where `progress` left off) into chunks, and pick the context shown."""
        schema = facts_schema(self.max_facts, self.max_fact_chars)
        system_tokens = await self.system_tokens()
        budget, by_context, by_time = await self.chunk_tokens(budget_s)
        base = progress.offset
        try:
            chunks = await plan_chunks(text[base:], budget_tokens=budget, count_tokens=self.client.count_tokens)
        except ValueError as exc:
            raise ContextOverflow(str(exc)) from exc
        seen = {normalize(f["text"]) for f in progress.facts}
        shown = await self._context_that_fits(context if base == 0 else None, chunks, budget)
        return _Run(progress, budget_s, schema, system_tokens, budget, by_context, by_time, base, chunks, shown, seen)

    def _report(self, run: _Run) -> dict[str, Any]:
        """The job's report on the extraction so far (also put on an error, so a failed attempt shows it)."""
        progress, totals = run.progress, run.progress.totals
        seen_tokens = totals.get("cache_n", 0) + totals.get("prompt_n", 0)
        return {
            "prompt_version": PROMPT_VERSION + ("+context" if run.shown else ""),
            "n_ctx": self.props.n_ctx,
            "text_budget_tokens": run.by_context,
            "time_budget_tokens": run.by_time,
            "chunk_tokens": run.budget,
            "chunks": progress.chunks,
            "calls": progress.calls,
            "proposed": len(progress.facts) + len(progress.rejected),
            "truncated_calls": sum(1 for c in progress.calls if c.get("truncated")),
            "loops": sum(1 for c in progress.calls if c.get("loop")),  # replies stopped in a repetition loop
            "split_echoes": progress.split_echoes,
            "rejected": progress.rejected,
            "cache_ratio": round(totals.get("cache_n", 0) / seen_tokens, 3) if seen_tokens else None,
        }

    async def _extract_chunk(self, run: _Run, chunk: Chunk, sampling: dict[str, Any] | None = None) -> None:
        """One model call on one chunk: its record on the progress, then its grounded facts kept."""
        call = self._call_record(run, chunk)
        if sampling:
            call["sampling"] = sampling
        run.progress.calls.append(call)
        completion = await self._complete(run, chunk, call)
        self._count(run.progress, completion, call, run.system_tokens)
        try:
            facts = self._parse(run, chunk, call, completion)
        except LoopedReply as exc:
            call["loop"] = completion.loop or True
            await self._after_loop(run, chunk, call, exc)
            return
        self._keep(run, chunk, call, facts)

    async def _after_loop(self, run: _Run, chunk: Chunk, call: dict[str, Any], exc: LoopedReply) -> None:
        """A reply stopped in a repetition loop: keep its complete facts, then ask the chunk again in smaller
        pieces (a different prompt leads the model elsewhere; at temperature 0 the same one loops again). A
        smallest piece that loops before any fact, in a text with no fact kept yet, is asked once more with
        DRY sampling on; if that loops too, it is an error."""
        self._keep(run, chunk, call, exc.facts)
        pieces = await halves(chunk, self.client.count_tokens)
        for piece in pieces:
            await self._extract_chunk(run, Chunk(piece.text, chunk.start + piece.start, piece.tokens))
        if pieces or exc.facts or run.progress.facts:
            return
        if "sampling" in call:
            call["error"] = "LoopedReply"
            exc.timings, exc.report = dict(run.progress.totals), self._report(run)
            raise exc
        await self._extract_chunk(run, chunk, ANTI_LOOP)

    def _cap(self, run: _Run, chunk: Chunk) -> int:
        """The output cap of a call on `chunk`: what the measured speed writes within the budget."""
        uncached = 0 if self.throughput.system_cached() else run.system_tokens
        return max(MIN_OUTPUT_TOKENS, self.output_cap(run.budget_s, chunk.tokens + uncached))

    def _call_record(self, run: _Run, chunk: Chunk) -> dict[str, Any]:
        """What a model call is given (its output cap fits the measured speed) and when its deadline is."""
        started = time.time()
        cap = self._cap(run, chunk)
        call: dict[str, Any] = {
            "chunk": run.progress.chunks,
            "start": run.base + chunk.start,
            "end": run.base + chunk.start + len(chunk.text),
            "tokens": chunk.tokens,
            "max_tokens": cap,
            "timeout_s": round(run.budget_s, 3),
            "deadline_at": round(started + run.budget_s, 3),
        }
        if run.shown:
            call["context"] = {
                "memories": [e.memory_id for e in run.shown],
                "chars": sum(len(e.text) for e in run.shown),
            }
        return call

    async def _complete(self, run: _Run, chunk: Chunk, call: dict[str, Any]) -> Completion:
        """The model's answer for a chunk; a timeout says whether a smaller chunk could still fit."""
        budget_s = run.budget_s
        try:
            return await self.client.complete_json(
                build_messages(chunk.text, history_of(run.shown)),
                schema=run.schema,
                max_tokens=call["max_tokens"],
                timeout_s=budget_s,  # streamed: a call cut off at its deadline frees the slot at once
                sampling=call.get("sampling"),
            )
        except ExtractionError as exc:
            call["error"] = type(exc).__name__
            exc.timings, exc.report = exc.timings or dict(run.progress.totals), self._report(run)
            if isinstance(exc, LlmTimeout) and chunk.tokens > 2 * MIN_CHUNK_TOKENS:
                raise TooSlow(
                    f"chunk of {chunk.tokens} tokens did not finish within {budget_s:g}s: the "
                    "machine is slower than measured",
                    cause=exc,
                    chunk_tokens=chunk.tokens,
                ) from exc
            if isinstance(exc, LlmTimeout):
                # the smallest piece this text splits into still does not fit: say what would fix it
                raise LlmTimeout(
                    f"{exc}; this {chunk.tokens}-token piece is as small as the text splits, so the model is too "
                    f"slow for MEMORY_EXTRACT_BUDGET_S={budget_s:g}: raise it, or use a faster model or build "
                    "(memory-service doctor measures both)",
                    timings=exc.timings,
                    report=exc.report,
                    smallest_piece=chunk.tokens,
                ) from exc
            raise

    def _count(self, progress: Progress, completion: Completion, call: dict[str, Any], system_tokens: int) -> None:
        """The call's timings: into the measured speed, the caller's counter, the totals and the call's record."""
        # a reply cut at a cap lowered for speed did not fit its window: the machine is still too slow
        cut = completion.finish_reason == "length" and call["max_tokens"] < self.max_output_tokens
        # a reply stopped in a loop says nothing of the speed either way
        fitted = not cut and completion.loop is None
        self.throughput.observe(completion.timings, system_tokens=system_tokens, fitted=fitted)
        if self.on_timings is not None:
            self.on_timings(completion.timings)
        for key in TOTAL_KEYS:
            progress.totals[key] = progress.totals.get(key, 0) + float(completion.timings.get(key) or 0)
        call.update(
            prompt_n=completion.timings.get("prompt_n"),
            cache_n=completion.timings.get("cache_n"),
            predicted_n=completion.timings.get("predicted_n"),
            finish_reason=completion.finish_reason,
            reasoning_chars=completion.reasoning_chars,
        )
        progress.raws.append(completion.content)

    def _parse(self, run: _Run, chunk: Chunk, call: dict[str, Any], completion: Completion) -> list[str]:
        """The facts of the answer; an answer cut at its cap keeps the items the grammar had finished."""
        try:
            return parse_facts(completion.content, completion.finish_reason, completion.reasoning)
        except LoopedReply:
            raise  # `_after_loop` keeps its facts and asks again
        except TruncatedReply as exc:
            if exc.facts:
                call["truncated"] = True  # cut at the cap: say so on the job
                return exc.facts
            call["error"] = "TruncatedReply"
            exc.timings, exc.report = dict(run.progress.totals), self._report(run)
            cap = call["max_tokens"]
            if cap < self.max_output_tokens and chunk.tokens > 2 * MIN_CHUNK_TOKENS:
                # the cap was lowered to fit the time: a smaller chunk needs a smaller answer
                raise TooSlow(
                    f"the answer did not fit the {cap}-token cap that {run.budget_s:g}s allows",
                    cause=exc,
                    chunk_tokens=chunk.tokens,
                ) from exc
            if cap < self.max_output_tokens:  # as small as the text splits: only a faster machine helps
                raise self._cut_by_speed(run, chunk, call, exc) from exc
            raise  # cut at the full cap: the model rambled or looped, a bad reply
        except BadReply as exc:
            call["error"] = "BadReply"
            exc.timings, exc.report = dict(run.progress.totals), self._report(run)
            raise

    def _cut_by_speed(self, run: _Run, chunk: Chunk, call: dict[str, Any], exc: TruncatedReply) -> CutBySpeed:
        """A reply cut at the cap the measured speed allowed, before any fact, on a piece too small to split."""
        cap, call["error"] = call["max_tokens"], "CutBySpeed"
        message = (
            f"the reply was cut at the {cap}-token output cap that {run.budget_s:g}s allowed at the measured speed "
            f"(full cap {self.max_output_tokens}), before any complete fact; this {chunk.tokens}-token piece "
            f"is as small as the text splits, so the model is too slow for MEMORY_EXTRACT_BUDGET_S={run.budget_s:g}: "
            "raise it, or use a faster model or build (memory-service doctor measures both)"
        )
        # `sooner`: this very call measured a machine fast enough for a larger cap
        return CutBySpeed(message, cause=exc, cap=cap, smallest_piece=chunk.tokens, sooner=self._cap(run, chunk) > cap)

    def _keep(self, run: _Run, chunk: Chunk, call: dict[str, Any], facts: list[str]) -> None:
        """Ground the chunk's facts and keep the new ones on the progress (chunk overlaps repeat facts)."""
        progress = run.progress
        facts, split = split_echoes(facts, chunk.text)
        progress.split_echoes += split
        context = [(e.memory_id, e.text, e.offset) for e in run.shown]
        result = ground(facts, chunk.text, offset=run.base + chunk.start, context=context)
        call.update(facts=len(result.kept), rejected=len(result.rejected))
        for fact in result.kept:
            norm = normalize(fact.text)
            if norm not in run.seen:  # the overlap between chunks yields the same fact twice
                run.seen.add(norm)
                progress.facts.append(
                    {
                        "text": fact.text,
                        "spans": [list(s) for s in fact.spans],
                        "context": [list(c) for c in fact.context],
                    }
                )
        progress.rejected.extend({"text": r.text, "reason": r.reason, "code": r.code} for r in result.rejected)


@dataclass
class _Run:
    """One `extract` call: its chunks and their token budget, the context shown, and the progress it adds to."""

    progress: Progress
    budget_s: float
    schema: dict[str, Any]
    system_tokens: int
    budget: int  # text tokens per chunk
    by_context: int
    by_time: int | None
    base: int  # where in the text this call resumes
    chunks: list[Chunk]
    shown: list[Earlier]
    seen: set[str]  # normalised facts already kept
