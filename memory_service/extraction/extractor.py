"""One extraction attempt: size to context, ask the model per chunk, parse, ground.

Deterministic and budgeted: every model call gets the time left until the
job's deadline, and an output cap that the measured generation rate can
produce within it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .client import LlamaClient, ServerProps
from .errors import BadReply, ContextOverflow, ExtractionError, LlmTimeout, TruncatedReply
from .grounding import GroundedFact, RejectedFact, ground, normalize
from .parsing import parse_facts
from .prompt import PROMPT_VERSION, SYSTEM_PROMPT, build_messages, facts_schema
from .sizing import plan_chunks, text_budget
from .throughput import Throughput

MIN_OUTPUT_TOKENS = 48


@dataclass
class ExtractionResult:
    facts: list[GroundedFact]
    rejected: list[RejectedFact]
    raw_replies: list[str]
    timings: dict[str, Any]
    report: dict[str, Any] = field(default_factory=dict)


@dataclass
class Extractor:
    client: LlamaClient
    props: ServerProps
    throughput: Throughput
    max_output_tokens: int = 384
    max_facts: int = 12
    max_fact_chars: int = 300
    _system_tokens: int | None = None

    async def system_tokens(self) -> int:
        if self._system_tokens is None:
            self._system_tokens = await self.client.count_tokens(SYSTEM_PROMPT) + 8
        return self._system_tokens

    def output_cap(self, remaining_s: float, prompt_tokens: int) -> int:
        """The most tokens the model can produce in the time left, at its measured rates."""
        gen_rate = self.throughput.generation_tps()
        prompt_rate = self.throughput.prompt_tps()
        if gen_rate is None:
            return self.max_output_tokens
        prompt_s = prompt_tokens / prompt_rate if prompt_rate else 0.0
        affordable = int((remaining_s - prompt_s) * gen_rate * 0.85)
        return max(0, min(self.max_output_tokens, affordable))

    async def extract(self, text: str, deadline: float, *, chunk_budget_s: float | None = None) -> ExtractionResult:
        """Extract facts from `text`; chunk i must finish by `deadline + i * chunk_budget_s`.

        A long text gets one budget per chunk it is split into (all counted from the save), so a
        40 KiB save is not doomed to time out; each request's timeout is what is left of its chunk's budget.
        """
        schema = facts_schema(self.max_facts, self.max_fact_chars)
        system_tokens = await self.system_tokens()
        budget = text_budget(self.props.n_ctx, system_tokens, self.max_output_tokens)
        try:
            chunks = await plan_chunks(text, budget_tokens=budget, count_tokens=self.client.count_tokens)
        except ValueError as exc:
            raise ContextOverflow(str(exc)) from exc
        kept: list[GroundedFact] = []
        rejected: list[RejectedFact] = []
        raws: list[str] = []
        calls: list[dict[str, Any]] = []
        totals: dict[str, float] = {"prompt_n": 0, "cache_n": 0, "predicted_n": 0, "prompt_ms": 0, "predicted_ms": 0}
        seen: set[str] = set()

        def report() -> dict[str, Any]:
            seen_tokens = totals["cache_n"] + totals["prompt_n"]
            return {
                "prompt_version": PROMPT_VERSION,
                "n_ctx": self.props.n_ctx,
                "text_budget_tokens": budget,
                "chunks": len(chunks),
                "calls": calls,
                "proposed": len(kept) + len(rejected),
                "truncated_calls": sum(1 for c in calls if c.get("truncated")),
                "rejected": [{"text": r.text, "reason": r.reason} for r in rejected],
                "cache_ratio": round(totals["cache_n"] / seen_tokens, 3) if seen_tokens else None,
            }

        for index, chunk in enumerate(chunks):
            chunk_deadline = deadline + index * (chunk_budget_s or 0.0)
            remaining = chunk_deadline - time.time()
            if remaining <= 0:
                raise LlmTimeout(
                    f"budget exhausted before chunk {index + 1}/{len(chunks)} ({-remaining:.1f}s past its deadline)",
                    timings=totals, report=report(),
                )
            # A measured cap below the minimum still gets one try: the request is cut at the deadline anyway,
            # and refusing to send would keep a stale slow measurement forever.
            cap = max(MIN_OUTPUT_TOKENS, self.output_cap(remaining, chunk.tokens + system_tokens))
            call: dict[str, Any] = {
                "chunk": index, "start": chunk.start, "end": chunk.start + len(chunk.text), "tokens": chunk.tokens,
                "max_tokens": cap, "timeout_s": round(remaining, 3),
            }
            calls.append(call)
            try:
                completion = await self.client.complete_json(
                    build_messages(chunk.text), schema=schema, max_tokens=cap, timeout_s=remaining
                )
            except ExtractionError as exc:
                call["error"] = type(exc).__name__
                exc.timings, exc.report = exc.timings or totals, report()
                raise
            self.throughput.observe(completion.timings)
            for key in totals:
                totals[key] += float(completion.timings.get(key) or 0)
            call.update(
                prompt_n=completion.timings.get("prompt_n"), cache_n=completion.timings.get("cache_n"),
                predicted_n=completion.timings.get("predicted_n"), finish_reason=completion.finish_reason,
                reasoning_chars=completion.reasoning_chars,
            )
            raws.append(completion.content)
            try:
                facts = parse_facts(completion.content, completion.finish_reason, completion.reasoning)
            except TruncatedReply as exc:
                if not exc.facts:
                    call["error"] = "TruncatedReply"
                    exc.timings, exc.report = totals, report()
                    raise
                # cut at the cap: keep the items the grammar had finished, and say so on the job
                facts = exc.facts
                call["truncated"] = True
            except BadReply as exc:
                call["error"] = "BadReply"
                exc.timings, exc.report = totals, report()
                raise
            result = ground(facts, chunk.text, offset=chunk.start)
            call.update(facts=len(result.kept), rejected=len(result.rejected))
            for fact in result.kept:
                norm = normalize(fact.text)
                if norm not in seen:  # the overlap between chunks yields the same fact twice
                    seen.add(norm)
                    kept.append(fact)
            rejected.extend(result.rejected)
        return ExtractionResult(kept, rejected, raws, totals, report())
