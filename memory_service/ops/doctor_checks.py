"""The checks `memory-service doctor` runs against a llama-server: a real extraction, the prompt cache, the budget.

Each returns a `Check`: a verdict (OK, WARN, FAIL), why, and what to do; `doctor` gathers them into its report.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from ..extraction.completion import ServerProps
from ..extraction.errors import ExtractionError, TooSlow
from ..extraction.extractor import MIN_OUTPUT_TOKENS, Extractor, Progress
from ..extraction.loops import find_loop
from ..extraction.sizing import MIN_CHUNK_TOKENS, TIME_HEADROOM, time_fit_tokens
from ..llm.thinking import FAIL, OK, WARN

# "A typical save": what the budget verdict is about (an agent note of ~300 tokens, ~150 output tokens).
TYPICAL_TEXT_TOKENS = 300
TYPICAL_OUTPUT_TOKENS = 150

# Two different texts: the second shows whether the byte-stable system prompt is served from the KV cache.
PROBE_TEXTS = (
    "Deploy note from the release agent. The billing service was upgraded to version 4.2.1 on staging at 14:05. "
    "Maria Lopez approved the rollout to production for Thursday. The database migration took 37 minutes and "
    "touched 1,250,000 rows. Two alerts fired during the window: the queue depth on orders-worker peaked at 8,400 "
    "and recovered within 6 minutes. The on-call engineer this week is Tom Becker; his pager number ends in 4417. "
    "Next step: rotate the API keys for the payments gateway before Friday, and close ticket OPS-2291 once the "
    "dashboards are green. Customer Acme Corp asked for a maintenance notice 48 hours ahead of any downtime.",
    "Research agent summary. The team compared three vector databases for the search feature. Chroma handled "
    "100,000 rows with a median query time of 2 milliseconds. Filtered queries were slower: 240 milliseconds when "
    "the filter matched every row. Priya Natarajan recommended partitioning collections by team. The hosted option "
    "costs 900 dollars per month, which finance rejected on 12 March. The prototype lives in the repository "
    "search-lab on branch feat/partition. The daily email limit for the outreach agent was set to 50 messages. The "
    "next review is on 3 April at 10:30 in room B-214, and Liam will present the benchmark charts.",
)

_THINK_BLOCK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL | re.IGNORECASE)


@dataclass
class Check:
    name: str
    verdict: str
    why: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)


MAX_PROBE_SPLITS = 6


async def probe_extraction(extractor: Extractor, text: str, budget_s: float) -> dict[str, Any]:
    """One real extraction through the service's Extractor, with the service's budget.

    Like the worker, a call too slow for the budget lowers the speed estimate and the text is
    resumed in smaller chunks; how often that happened is reported (`splits`).
    """
    started = time.monotonic()
    progress = Progress()
    splits = 0
    try:
        while True:
            try:
                result = await extractor.extract(text, budget_s=budget_s, progress=progress)
                break
            except TooSlow as exc:
                splits += 1
                if splits > MAX_PROBE_SPLITS:
                    raise
                extractor.throughput.slow_down(exc.chunk_tokens + await extractor.system_tokens(), budget_s)
    except ExtractionError as exc:
        return {
            "valid": False,
            "error": f"{type(exc).__name__}: {exc}",
            "latency_s": round(time.monotonic() - started, 3),
            "raw_reply": (exc.raw_reply or "")[:600],
            "timings": exc.timings or {},
            "calls": (exc.report or {}).get("calls", []),
        }
    calls = result.report.get("calls", [])
    raw = "\n".join(result.raw_replies)
    return {
        "valid": True,
        "latency_s": round(time.monotonic() - started, 3),
        "facts": [f.text for f in result.facts],
        "rejected": result.report.get("rejected", []),
        "prompt_n": int(result.timings.get("prompt_n") or 0),
        "cache_n": int(result.timings.get("cache_n") or 0),
        "predicted_n": int(result.timings.get("predicted_n") or 0),
        "finish_reason": ",".join(str(c.get("finish_reason")) for c in calls),
        "reasoning_chars": sum(int(c.get("reasoning_chars") or 0) for c in calls),
        "think_chars": sum(len(m.group(1).strip()) for m in _THINK_BLOCK.finditer(raw)),
        "timings": result.timings,
        "calls": calls,
        "splits": splits,
        "loops": sum(1 for c in calls if c.get("loop")),
    }


LOOP_REMEDIES = (
    "the model repeated itself; the service stops such a reply and asks again in smaller pieces, but this piece "
    "looped too: use a larger model (--model large, or MEMORY_MODEL=large), or a shorter text per save"
)


def probe_check(probe: dict[str, Any], budget_s: float, model: str = "") -> Check:
    """The first probe's verdict; `model` (the server's model file) keeps the advice from naming the model in use."""
    # the default model already in use: only a larger one is a different model to try
    other = "--model large" if "qwen2.5-coder-0.5b" in model.lower() else "--model default or large"
    if not probe["valid"]:
        error = probe["error"]
        fix = f"see the raw reply; run with a model that follows a JSON schema ({other})"
        if error.startswith("LoopedReply") or (error.startswith("TruncatedReply") and _repeats(probe)):
            fix = LOOP_REMEDIES
        elif error.startswith(("LlmTimeout", "CutBySpeed")):
            fix = (
                f"the model could not answer within MEMORY_EXTRACT_BUDGET_S={budget_s:g}s: use a smaller model, "
                "more threads (MEMORY_LLAMA_THREADS), or a larger budget"
            )
        elif "thinking" in error or (probe.get("raw_reply") or "").lstrip().startswith("<think>"):
            fix = "thinking is on: the reply is a think block, not facts; see the thinking check"
        elif error.startswith("LlmUnavailable"):
            fix = "check that llama-server is running and reachable at this URL"
        raw = f"; raw reply: {probe['raw_reply'][:200]!r}" if probe.get("raw_reply") else ""
        return Check("probe extraction", FAIL, f"{error}{raw}", fix)
    summary = (
        f"valid JSON, {len(probe['facts'])} fact(s) kept, {len(probe['rejected'])} rejected, "
        f"{probe['latency_s']:.2f}s"
        + (f" (split smaller after {probe['splits']} timeout(s))" if probe.get("splits") else "")
        + (f" ({probe['loops']} looping reply(ies) stopped and asked again smaller)" if probe.get("loops") else "")
        + ", "
        f"prompt {probe['prompt_n']} tok, output {probe['predicted_n']} tok, finish={probe['finish_reason']}, "
        f"reasoning {probe['reasoning_chars'] + probe['think_chars']} chars"
    )
    if probe["reasoning_chars"] or probe["think_chars"]:
        return Check(
            "probe extraction",
            FAIL,
            f"the model still thinks with thinking off: {summary}",
            "use a template or model that honours enable_thinking=false (see the thinking check)",
        )
    if "length" in probe["finish_reason"]:
        return Check(
            "probe extraction",
            WARN,
            f"output cap reached: {summary}",
            "raise MEMORY_MAX_OUTPUT_TOKENS or lower MEMORY_MAX_FACTS",
        )
    if not probe["facts"]:
        return Check(
            "probe extraction",
            WARN,
            f"no grounded facts from a text full of them: {summary}",
            f"the model is too weak for extraction; try {other}",
        )
    return Check("probe extraction", OK, summary)


def _repeats(probe: dict[str, Any]) -> bool:
    """A reply cut at its cap that is a loop (the stream guard missed it, e.g. on a plain request)."""
    return find_loop(probe.get("raw_reply") or "") is not None


def server_check(props: ServerProps, server_line: str, room: int) -> Check:
    """Whether the server's context leaves room for a text, and whether its slots help on this machine."""
    if room < 256:
        return Check(
            "server",
            FAIL,
            f"context too small: {server_line}",
            "start llama-server with a larger -c (MEMORY_LLAMA_CTX), or lower MEMORY_MAX_OUTPUT_TOKENS",
        )
    if props.slots > 1:
        return Check(
            "server",
            WARN,
            f"{server_line}: --parallel splits the context and, on few cores, does not raise throughput",
            "one slot and the service's own queue is the better default",
        )
    return Check("server", OK, server_line)


def cache_check(second: dict[str, Any]) -> Check:
    """The second probe's prompt should come mostly from the KV cache: the system prompt is byte-stable."""
    seen = second["cache_n"] + second["prompt_n"]
    line = f"2nd probe reused {second['cache_n']} of {seen} prompt tokens from the KV cache"
    if second["cache_n"] > 0:
        return Check("prompt cache", OK, line + " (the system prompt is byte-stable)")
    return Check(
        "prompt cache",
        WARN,
        line,
        "every save pays for the whole system prompt; "
        "check that llama-server keeps cache_prompt on (no --no-cache-prompt)",
    )


def budget_check(
    report: dict[str, Any],
    probes: list[dict[str, Any]],
    props: ServerProps,
    extractor: Extractor,
    system_tokens: int,
    room: int,
    budget_s: float,
) -> Check:
    prompt_rate, gen_rate = _rates(probes)
    cached = any(p.get("cache_n") for p in probes[1:] if p["valid"])
    throughput: dict[str, Any] = {"prompt_tokens_per_s": prompt_rate, "generation_tokens_per_s": gen_rate}
    report["throughput"] = throughput
    if not prompt_rate or not gen_rate:
        return Check(
            "budget",
            FAIL,
            "could not measure the model's speed: no probe extraction finished",
            "fix the failures above first",
        )
    warm = TYPICAL_TEXT_TOKENS / prompt_rate + TYPICAL_OUTPUT_TOKENS / gen_rate
    cold = warm + system_tokens / prompt_rate
    typical = warm if cached else cold
    full_chunk = (room + (0 if cached else system_tokens)) / prompt_rate + extractor.max_output_tokens / gen_rate
    throughput.update(
        typical_save_s=round(typical, 2),
        typical_save_cold_s=round(cold, 2),
        full_chunk_s=round(full_chunk, 2),
        budget_s=budget_s,
    )
    speeds = f"prompt {prompt_rate:.0f} tok/s, generation {gen_rate:.1f} tok/s"
    line = (
        f"a typical save ({TYPICAL_TEXT_TOKENS}-token text + {TYPICAL_OUTPUT_TOKENS} output tokens) needs "
        f"≈{typical:.1f}s of the {budget_s:g}s budget ({speeds})"
    )
    smallest = MIN_CHUNK_TOKENS / prompt_rate + MIN_OUTPUT_TOKENS / gen_rate
    fit = time_fit_tokens(budget_s, 0, prompt_rate, gen_rate, extractor.max_output_tokens) or 0
    throughput.update(chunk_tokens_that_fit=fit, smallest_call_s=round(smallest, 2))
    remedies = (
        "what makes it faster, best first: the fastest build variant this CPU runs (the build line above; "
        "'native' is fastest, and the bootstrap picks it when the CPU allows), fewer llama.cpp threads "
        "than cores on a busy box (MEMORY_LLAMA_THREADS), a smaller model, or a larger "
        f"MEMORY_EXTRACT_BUDGET_S (about {typical * 1.5:.0f} would fit a typical save in one call)"
    )
    if smallest > budget_s:
        return Check(
            "budget",
            FAIL,
            line + f"; even the smallest piece a text is split into ({MIN_CHUNK_TOKENS} "
            f"tokens) needs ≈{smallest:.1f}s, so extraction can't finish",
            remedies,
        )
    if typical > TIME_HEADROOM * budget_s:  # then the service splits a typical save
        pieces = max(1, -(-TYPICAL_TEXT_TOKENS // max(fit, MIN_CHUNK_TOKENS)))
        return Check(
            "budget",
            WARN,
            line + f": the service adapts by splitting such a text into {pieces} "
            f"call(s) of at most {max(fit, MIN_CHUNK_TOKENS)} text tokens, each within the budget, so saves "
            "are extracted later, not lost",
            remedies,
        )
    if full_chunk > budget_s:
        return Check(
            "budget",
            OK,
            line + f"; a text that fills the context ({room} text tokens) needs "
            f"≈{full_chunk:.1f}s and is split into calls of at most {fit} text tokens",
        )
    return Check("budget", OK, line)


def _rates(probes: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """Prompt and generation tokens/s from the probes' llama-server timings (summed, not averaged)."""
    prompt_n = prompt_ms = gen_n = gen_ms = 0.0
    for probe in probes:
        timings = probe.get("timings") or {}
        prompt_n += float(timings.get("prompt_n") or 0)
        prompt_ms += float(timings.get("prompt_ms") or 0)
        gen_n += float(timings.get("predicted_n") or 0)
        gen_ms += float(timings.get("predicted_ms") or 0)
    prompt_rate = round(prompt_n / prompt_ms * 1000, 1) if prompt_n >= 8 and prompt_ms > 0 else None
    gen_rate = round(gen_n / gen_ms * 1000, 1) if gen_n >= 4 and gen_ms > 0 else None
    return prompt_rate, gen_rate
