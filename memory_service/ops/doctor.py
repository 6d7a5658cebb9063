"""`memory-service doctor`: ask the model server whether it meets the contract and the budget.

Why: every failure in the field (thinking left on, a 300 s timeout blown, a context too small
for the prompt, a laptop in swap) looked the same from outside: "extraction failed". Each check
here asks the running llama-server directly (/props, /apply-template, a real extraction through
the service's own Extractor) and prints a verdict line — OK, WARN or FAIL, why, and what to do.
Any FAIL gives a non-zero exit, so a setup that can't turn thinking off or can't meet the budget
is caught before agents depend on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memory_service.config import Settings
from memory_service.extraction.client import LlamaClient, ServerProps
from memory_service.extraction.errors import ExtractionError, TooSlow
from memory_service.extraction.extractor import MIN_OUTPUT_TOKENS, Extractor, Progress
from memory_service.extraction.sizing import MIN_CHUNK_TOKENS, TIME_HEADROOM, text_budget, time_fit_tokens
from memory_service.extraction.thinking import FAIL, OK, WARN, check_thinking
from memory_service.extraction.throughput import Throughput
from memory_service.llm.runtime.proven import REBUILD_HINT

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


# --------------------------------------------------------------------------- probe extraction


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
    }


def _probe_check(probe: dict[str, Any], budget_s: float) -> Check:
    if not probe["valid"]:
        error = probe["error"]
        fix = "see the raw reply; run with a model that follows a JSON schema (--model default)"
        if error.startswith("LlmTimeout"):
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
            "the model is too weak for extraction; try --model default or large",
        )
    return Check("probe extraction", OK, summary)


# --------------------------------------------------------------------------- the whole report


async def diagnose(client: LlamaClient, settings: Settings) -> dict[str, Any]:
    """Every check, as a structured report (`--json` prints it; parts are reusable by /ready)."""
    budget_s = settings.extract_budget_s
    report: dict[str, Any] = {
        "llm_url": client.base_url,
        "settings": {"extract_budget_s": budget_s, "max_output_tokens": settings.max_output_tokens},
    }
    checks: list[Check] = []
    report["checks"] = checks

    props: ServerProps | None = None
    if await client.health(timeout=5.0):
        try:
            props = await client.props()
        except ExtractionError as exc:
            checks.append(Check("server", FAIL, f"/props failed: {exc}", "use llama-server b4000 or newer"))
    else:
        checks.append(
            Check(
                "server",
                FAIL,
                f"llama-server at {client.base_url} is not reachable or not healthy",
                "start it (memory-service serve starts one) or fix --llm-url / MEMORY_LLM_URL",
            )
        )
    if props is None:
        return _finish(report)

    extractor = Extractor(
        client=client,
        props=props,
        throughput=Throughput(),
        max_output_tokens=min(settings.max_output_tokens, max(64, props.n_ctx // 4)),
        max_facts=settings.max_facts,
        max_fact_chars=settings.max_fact_chars,
    )
    system_tokens = await extractor.system_tokens()
    room = text_budget(props.n_ctx, system_tokens, extractor.max_output_tokens)
    report["server"] = {
        "build": props.build_info,
        "model": props.model_path.rsplit("/", 1)[-1],
        "n_ctx": props.n_ctx,
        "slots": props.slots,
        "system_prompt_tokens": system_tokens,
        "text_tokens_per_chunk": room,
    }
    server_line = (
        f"build {props.build_info or '?'}, model {report['server']['model'] or '?'}, n_ctx {props.n_ctx} "
        f"per slot, {props.slots} slot(s), {room} text tokens per chunk"
    )
    if room < 256:
        checks.append(
            Check(
                "server",
                FAIL,
                f"context too small: {server_line}",
                "start llama-server with a larger -c (MEMORY_LLAMA_CTX), or lower MEMORY_MAX_OUTPUT_TOKENS",
            )
        )
    elif props.slots > 1:
        checks.append(
            Check(
                "server",
                WARN,
                f"{server_line}: --parallel splits the context and, on few cores, does not raise throughput",
                "one slot and the service's own queue is the better default",
            )
        )
    else:
        checks.append(Check("server", OK, server_line))

    thinking = await check_thinking(client)
    report["thinking"] = thinking
    checks.append(Check("thinking", thinking["verdict"], thinking["why"], thinking["fix"]))

    probes = [await probe_extraction(extractor, text, budget_s) for text in PROBE_TEXTS]
    report["probes"] = probes
    checks.append(_probe_check(probes[0], budget_s))
    if probes[1]["valid"]:
        second = probes[1]
        seen = second["cache_n"] + second["prompt_n"]
        line = f"2nd probe reused {second['cache_n']} of {seen} prompt tokens from the KV cache"
        if second["cache_n"] > 0:
            checks.append(Check("prompt cache", OK, line + " (the system prompt is byte-stable)"))
        else:
            checks.append(
                Check(
                    "prompt cache",
                    WARN,
                    line,
                    "every save pays for the whole system prompt; "
                    "check that llama-server keeps cache_prompt on (no --no-cache-prompt)",
                )
            )
    checks.append(_budget_check(report, probes, props, extractor, system_tokens, room, budget_s))
    return _finish(report)


def _budget_check(
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


def _finish(report: dict[str, Any]) -> dict[str, Any]:
    checks: list[Check] = report["checks"]
    verdicts = [c.verdict for c in checks]
    report["result"] = FAIL if FAIL in verdicts else WARN if WARN in verdicts else OK
    report["exit_code"] = 1 if FAIL in verdicts else 0
    report["checks"] = [asdict(c) for c in checks]
    return report


async def _diagnose_url(url: str, settings: Settings) -> dict[str, Any]:
    client = LlamaClient(url)
    try:
        return await diagnose(client, settings)
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- CLI


def format_report(report: dict[str, Any]) -> str:
    lines = [f"memory-service doctor: llama-server at {report['llm_url']}"]
    started = report.get("started_server")
    if started:
        lines[0] += (
            f" (started for this check: {started['model']}, {started['threads']} thread(s), ctx {started['ctx']})"
        )
    for check in report["checks"]:
        lines.append(f"{check['verdict']:<5} {check['name']}: {check['why']}")
        if check["fix"] and check["verdict"] != OK:
            lines.append(f"      what to do: {check['fix']}")
    counts = {v: sum(1 for c in report["checks"] if c["verdict"] == v) for v in (FAIL, WARN)}
    lines.append(f"RESULT: {report['result']} ({counts[FAIL]} failure(s), {counts[WARN]} warning(s))")
    return "\n".join(lines)


def run_doctor(args: argparse.Namespace) -> int:
    """`memory-service doctor`: check the running llama-server(s), or start one exactly like `serve` and check that.

    With several servers (a comma-separated MEMORY_LLM_URL or --llm-url) each gets the full check, one
    after the other so their speeds are measured without competing, and the worst result is the exit code.
    """
    settings = Settings.from_env()
    given = getattr(args, "llm_url", None)
    urls = settings.with_overrides(llm_url=given).llm_urls if given else settings.llm_urls
    server = None
    started: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="memory-doctor-") as tmp:
        if not urls:
            try:
                server, started = _start_server(settings, getattr(args, "model", None), Path(tmp))
            except Exception as exc:  # no binary, no model, server died while loading: say so, don't trace
                log_tail = _log_tail(Path(tmp) / "llama-server.log")
                print(
                    f"FAIL  server: could not start llama-server: {exc}{log_tail}\n"
                    f"      what to do: {REBUILD_HINT}, or pass --llm-url of a running llama-server",
                    file=sys.stderr,
                )
                return 1
            urls = [server.url]
        try:
            reports = asyncio.run(_diagnose_urls(urls, settings))
        finally:
            if server is not None:
                server.stop()
    for report in reports:
        report["started_server"] = started
        report["checks"].insert(0, _build_check(report, started))
    report = reports[0] if len(reports) == 1 else pool_report(reports)
    print(json.dumps(report, indent=2) if getattr(args, "json", False) else format_any(report))
    return int(report["exit_code"])


async def _diagnose_urls(urls: list[str], settings: Settings) -> list[dict[str, Any]]:
    return [await _diagnose_url(url, settings) for url in urls]


def pool_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Several servers: each one's report under `servers`, and the worst result of them."""
    results = [r["result"] for r in reports]
    return {
        "llm_urls": [r["llm_url"] for r in reports],
        "servers": reports,
        "result": FAIL if FAIL in results else WARN if WARN in results else OK,
        "exit_code": max(int(r["exit_code"]) for r in reports),
    }


def format_any(report: dict[str, Any]) -> str:
    """One server's lines, or each server's in turn and then the pool's result."""
    if "servers" not in report:
        return format_report(report)
    servers = report["servers"]
    failing = [r["llm_url"] for r in servers if r["result"] == FAIL]
    blocks = [format_report(r) for r in servers]
    summary = f"RESULT: {report['result']} for the pool of {len(servers)} llama-servers"
    if failing:
        rest = "; the others keep extracting" if len(failing) < len(servers) else ""
        summary += f" ({len(failing)} failing: {', '.join(failing)}{rest})"
    return "\n\n".join(blocks) + "\n\n" + summary


def _start_server(settings: Settings, model: str | None, tmp: Path) -> tuple[Any, dict[str, Any]]:
    """The same llama-server `serve` would start: binary, model, threads, context and chat template."""
    from memory_service.llm.runtime.models import resolve_model
    from memory_service.llm.runtime.server import build_variant, launch

    model_path = resolve_model(model or settings.model, settings.cache_dir)
    server = launch(settings, model_path, tmp / "llama-server.log")
    return server, {
        "url": server.url,
        "model": model_path.name,
        "threads": settings.llama_threads,
        "nice": settings.llama_nice,
        "ctx": settings.llama_ctx,
        "chat_template_file": settings.llama_chat_template_file,
        "binary": str(server.binary),
        "variant": build_variant(server.binary, settings.cache_dir),
    }


def _build_check(report: dict[str, Any], started: dict[str, Any] | None) -> dict[str, Any]:
    """Which llama-server build answered, and how fast it measured here (prompt and generation tokens/s)."""
    speed = report.get("throughput") or {}
    measured = (
        f"measured prompt {speed.get('prompt_tokens_per_s') or '?'} tok/s, generation "
        f"{speed.get('generation_tokens_per_s') or '?'} tok/s"
    )
    if started is None:
        return asdict(Check("build", OK, f"a running llama-server (not started by doctor); {measured}"))
    variant = started["variant"]
    if variant.startswith("unverified"):
        return asdict(
            Check(
                "build",
                WARN,
                f"{started['binary']}: {variant}; {measured}",
                "let scripts/bootstrap.sh build and prove one, or make sure this one suits the CPU",
            )
        )
    return asdict(Check("build", OK, f"variant '{variant}' (proven on this CPU), {measured}"))


def _log_tail(path: Path) -> str:
    if not path.exists():
        return ""
    tail = path.read_text(errors="replace").strip().splitlines()[-8:]
    return ("\n      llama-server log:\n        " + "\n        ".join(tail)) if tail else ""


__all__ = ["check_thinking", "diagnose", "run_doctor"]
