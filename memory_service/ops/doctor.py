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
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..config import Settings
from ..extraction.completion import ServerProps
from ..extraction.errors import ExtractionError
from ..extraction.extractor import Extractor
from ..extraction.sizing import text_budget
from ..extraction.throughput import Throughput
from ..llm.client import LlamaClient
from ..llm.runtime.proven import REBUILD_HINT
from ..llm.thinking import FAIL, OK, WARN, check_thinking
from .doctor_checks import (
    PROBE_TEXTS,
    Check,
    budget_check,
    cache_check,
    probe_check,
    probe_extraction,
    server_check,
)

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
    props = await _server_props(client, checks)
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
    checks.append(server_check(props, server_line, room))

    thinking = await check_thinking(client)
    report["thinking"] = thinking
    checks.append(Check("thinking", thinking["verdict"], thinking["why"], thinking["fix"]))

    probes = [await probe_extraction(extractor, text, budget_s) for text in PROBE_TEXTS]
    report["probes"] = probes
    checks.append(probe_check(probes[0], budget_s, props.model_path))
    if probes[1]["valid"]:
        checks.append(cache_check(probes[1]))
    checks.append(budget_check(report, probes, props, extractor, system_tokens, room, budget_s))
    return _finish(report)


async def _server_props(client: LlamaClient, checks: list[Check]) -> ServerProps | None:
    """The server's /props, or None with a FAIL check saying why it could not be asked."""
    if not await client.health(timeout=5.0):
        checks.append(
            Check(
                "server",
                FAIL,
                f"llama-server at {client.base_url} is not reachable or not healthy",
                "start it (memory-service serve starts one) or fix --llm-url / MEMORY_LLM_URL",
            )
        )
        return None
    try:
        return await client.props()
    except ExtractionError as exc:
        checks.append(Check("server", FAIL, f"/props failed: {exc}", "use llama-server b4000 or newer"))
        return None


def _finish(report: dict[str, Any]) -> dict[str, Any]:
    checks: list[Check] = report["checks"]
    verdicts = [c.verdict for c in checks]
    report["result"] = FAIL if FAIL in verdicts else WARN if WARN in verdicts else OK
    report["exit_code"] = 1 if FAIL in verdicts else 0
    report["checks"] = [asdict(c) for c in checks]
    return report


async def _diagnose_url(url: str, settings: Settings) -> dict[str, Any]:
    client = LlamaClient.for_settings(url, settings)
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
        from ..embedding.selection import data_dir_status  # whether the data dir's vectors are the queries' model
        from ..storage.datadir import DataDir

        status = data_dir_status(settings, DataDir(settings.data_dir.absolute()))
        report["checks"].append(asdict(Check("embedder", *status)))
        if report["checks"][-1]["verdict"] == WARN and report["result"] == OK:
            report["result"] = WARN
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
    from ..llm.runtime.gguf import resolve_model
    from ..llm.runtime.server import build_variant, launch

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
