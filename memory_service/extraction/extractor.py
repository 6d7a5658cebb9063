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
from .errors import BadReply, ContextOverflow, LlmTimeout
from .grounding import GroundedFact, RejectedFact, ground
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

    async def extract(self, text: str, deadline: float) -> ExtractionResult:
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
        totals: dict[str, float] = {"prompt_n": 0, "cache_n": 0, "predicted_n": 0, "prompt_ms": 0, "predicted_ms": 0}
        seen: set[str] = set()
        for index, chunk in enumerate(chunks):
            remaining = deadline - time.time()
            cap = self.output_cap(remaining, len(chunk.text) // 3 + system_tokens)
            if remaining <= 0 or cap < MIN_OUTPUT_TOKENS:
                raise LlmTimeout(
                    f"budget exhausted before chunk {index + 1}/{len(chunks)} "
                    f"({max(remaining, 0):.1f}s left, could afford {cap} output tokens)",
                    timings=totals,
                )
            completion = await self.client.complete_json(
                build_messages(chunk.text), schema=schema, max_tokens=cap, timeout_s=remaining
            )
            self.throughput.observe(completion.timings)
            for key in totals:
                totals[key] += float(completion.timings.get(key) or 0)
            raws.append(completion.content)
            try:
                facts = parse_facts(completion.content, completion.finish_reason)
            except BadReply as exc:
                exc.timings = totals
                raise
            result = ground(facts, chunk.text, offset=chunk.start)
            for fact in result.kept:
                if fact.text.lower() not in seen:
                    seen.add(fact.text.lower())
                    kept.append(fact)
            rejected.extend(result.rejected)
        report = {
            "prompt_version": PROMPT_VERSION,
            "chunks": len(chunks),
            "proposed": len(kept) + len(rejected),
            "rejected": [{"text": r.text, "reason": r.reason} for r in rejected],
            "cache_ratio": round(totals["cache_n"] / (totals["cache_n"] + totals["prompt_n"]), 3)
            if totals["cache_n"] + totals["prompt_n"] else None,
        }
        return ExtractionResult(kept, rejected, raws, totals, report)
