"""Extraction overhead: the service's whole extraction path vs one direct llama-server call, same texts.

Direct: POST /v1/chat/completions with the byte-identical body LlamaClient.complete_json
sends (system prompt, schema, temperature 0, max_tokens, cache_prompt, thinking off, streamed).
Service: POST /v1/remember, then GET /v1/memories/{id} every 20 ms until done;
wall time from the POST to the first `done` (tokenize, queue, model call,
parse, grounding, fact embedding, dedup, journal commit).

Calls alternate service / direct, and the direct path takes the texts in a
shifted order, so every call follows a call with a *different* text. The
llama-server is started with `--cache-ram 0` (no host-memory prompt cache):
otherwise the second path to see a text is served the first path's whole
prompt from that cache. So both paths get exactly the slot's shared
system-prompt prefix, as consecutive distinct saves do in production.

Figures: ratio of wall times (median per text, and sum over texts; goal <= 1.10),
generated tokens per job (median, goal <= 60), share of prompt tokens served
from cache (goal >= 70%).

    python -m memory_service.bench.extraction [--quick] [--llm-url URL] [--out DIR]
"""

from __future__ import annotations

import json
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..testbed.probes import machine_info
from ..testbed.results import pyplot, write_figure
from ..testbed.service_runner import ServiceRunner, start_llama
from ..testbed.stats import goal
from .report import main_with_llama
from .texts import AGENT_TEXTS

GOALS = {"wall_ratio": 1.10, "predicted_tokens_median": 60, "cache_share": 0.70}
POLL_S = 0.02


def direct_body(text: str, max_tokens: int) -> dict[str, Any]:
    """Exactly what LlamaClient.complete_json sends for one chunk, with the service's default settings."""
    from ..config import Settings
    from ..extraction.prompt import build_messages, facts_schema

    settings = Settings.from_env()
    schema = facts_schema(settings.max_facts, settings.max_fact_chars)
    return {
        "messages": build_messages(text),
        "temperature": 0,
        "max_tokens": max_tokens,
        "cache_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
        "response_format": {"type": "json_schema", "json_schema": {"name": "facts", "strict": True, "schema": schema}},
        "stream": True,
    }


def read_stream(response: httpx.Response) -> dict[str, Any]:
    """The streamed reply's content and llama.cpp timings (carried by its last chunk)."""
    content: list[str] = []
    timings: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        chunk = json.loads(line[5:])
        for choice in chunk.get("choices") or []:
            content.append((choice.get("delta") or {}).get("content") or "")
        timings = chunk.get("timings") or timings
    return {"content": "".join(content), "timings": timings}


def service_cap(llm: httpx.Client) -> int:
    """The service's output cap before any throughput is measured: min(MEMORY_MAX_OUTPUT_TOKENS, n_ctx/4)."""
    from ..config import Settings

    props = llm.get("/props").json()
    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx") or props.get("n_ctx") or 4096
    return min(Settings.from_env().max_output_tokens, max(64, int(n_ctx) // 4))


def via_service(client: httpx.Client, text: str) -> dict[str, Any]:
    started = time.perf_counter()
    response = client.post("/v1/remember", json={"text": text, "agent_id": "bench-extract"})
    response.raise_for_status()
    memory_id = response.json()["id"]
    while True:
        body = client.get(f"/v1/memories/{memory_id}").json()
        if body["status"] in ("done", "failed"):
            wall = time.perf_counter() - started
            break
        time.sleep(POLL_S)
    timings = body.get("timings") or {}
    return {
        "wall_s": wall,
        "status": body["status"],
        "facts": len(body.get("facts") or []),
        "prompt_n": timings.get("prompt_n"),
        "cache_n": timings.get("cache_n"),
        "predicted_n": timings.get("predicted_n"),
        "model_ms": (timings.get("prompt_ms") or 0) + (timings.get("predicted_ms") or 0),
        "extraction": body.get("extraction"),
        "error": body.get("last_error"),
    }


def direct(llm: httpx.Client, text: str, max_tokens: int) -> dict[str, Any]:
    body = direct_body(text, max_tokens)
    started = time.perf_counter()
    with llm.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        data = read_stream(response)
    wall = time.perf_counter() - started
    timings, content = data["timings"], data["content"]
    try:
        facts = len(json.loads(content).get("facts") or [])
    except (ValueError, AttributeError):
        facts = None
    return {
        "wall_s": wall,
        "prompt_n": timings.get("prompt_n"),
        "cache_n": timings.get("cache_n"),
        "predicted_n": timings.get("predicted_n"),
        "model_ms": (timings.get("prompt_ms") or 0) + (timings.get("predicted_ms") or 0),
        "facts_proposed": facts,
    }


def _cache_share(rows: list[dict[str, Any]]) -> float | None:
    cached = sum(r.get("cache_n") or 0 for r in rows)
    processed = sum(r.get("prompt_n") or 0 for r in rows)
    return round(cached / (cached + processed), 3) if cached + processed else None


LLAMA_ARGS = ("--cache-ram", "0")


def run(
    *, llm_url: str | None = None, quick: bool = False, workdir: Path | None = None, model: str = "default"
) -> dict[str, Any]:
    """`llm_url` None: start an own llama-server with LLAMA_ARGS (recommended, see the module doc)."""
    llama = None
    if llm_url is None:
        llama = start_llama(model, extra_args=LLAMA_ARGS)
        llm_url = llama.url
    try:
        return _run(llm_url, quick, workdir, own_llama=llama is not None)
    finally:
        if llama is not None:
            llama.stop()


@dataclass
class Calls:
    """Both paths' measurements of every text, by text index, and the order the calls ran in."""

    service: dict[int, dict[str, Any]] = field(default_factory=dict)
    direct: dict[int, dict[str, Any]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    max_tokens: int = 0


def _run(llm_url: str, quick: bool, workdir: Path | None, own_llama: bool) -> dict[str, Any]:
    texts = list(AGENT_TEXTS[: 6 if quick else len(AGENT_TEXTS)])
    key = secrets.token_urlsafe(12)
    tmp = tempfile.TemporaryDirectory(prefix="bench-extract-") if workdir is None else None
    root = Path(tmp.name) if tmp else workdir
    assert root is not None
    service = ServiceRunner(root / "extract-data", api_keys={key: "bench-extract"}, llm_url=llm_url).start()
    try:
        ready = service.wait_model_ready()
        with (
            service.client(key, timeout=120) as client,
            httpx.Client(base_url=llm_url, timeout=120, trust_env=False) as llm,
        ):
            calls = alternate(client, llm, texts)
        after = service.wait_model_ready()
    finally:
        service.stop()
        if tmp:
            tmp.cleanup()
    return summarize(texts, calls, ready, after, own_llama)


def alternate(client: httpx.Client, llm: httpx.Client, texts: list[str]) -> Calls:
    """Service and direct calls in turn, the direct path's texts shifted by half, after one warm-up of each."""
    n = len(texts)
    shift = n // 2
    calls = Calls(max_tokens=service_cap(llm))
    # warm-up, not measured: model weights paged in, service's embedder and throughput estimate primed
    via_service(client, "Warm-up note: the staging cluster was restarted at 08:00 by Kim.")
    direct(llm, "Warm-up note: the build cache was cleared on Monday by Lee.", calls.max_tokens)
    for i in range(n):
        calls.service[i] = via_service(client, texts[i])
        calls.order.append(f"S{i}")
        j = (i + shift) % n
        calls.direct[j] = direct(llm, texts[j], calls.max_tokens)
        calls.order.append(f"D{j}")
        print(
            f"[extraction] {i + 1}/{n}: service {calls.service[i]['wall_s']:.2f}s, direct(text {j}) "
            f"{calls.direct[j]['wall_s']:.2f}s",
            file=sys.stderr,
            flush=True,
        )
    return calls


def per_text_rows(texts: list[str], calls: Calls) -> list[dict[str, Any]]:
    """One row per text: both paths' wall time, tokens and model time side by side."""
    rows = []
    for i, text in enumerate(texts):
        s, d = calls.service[i], calls.direct[i]
        rows.append(
            {
                "text_chars": len(text),
                "service_wall_s": round(s["wall_s"], 3),
                "direct_wall_s": round(d["wall_s"], 3),
                "ratio": round(s["wall_s"] / d["wall_s"], 3) if d["wall_s"] else None,
                "service_predicted_n": s["predicted_n"],
                "direct_predicted_n": d["predicted_n"],
                "service_prompt_n": s["prompt_n"],
                "service_cache_n": s["cache_n"],
                "direct_prompt_n": d["prompt_n"],
                "direct_cache_n": d["cache_n"],
                "service_model_ms": round(s["model_ms"], 1),
                "direct_model_ms": round(d["model_ms"], 1),
                "facts_stored": s["facts"],
                "facts_proposed_direct": d["facts_proposed"],
                "status": s["status"],
                "extraction": s["extraction"],
                "error": s["error"],
            }
        )
    return rows


def _non_model_ms(rows: dict[int, dict[str, Any]]) -> float:
    """Median wall time minus llama-server's own prompt and generation time, in ms."""
    return round(statistics.median(1000 * (r["wall_s"] - r["model_ms"] / 1000) for r in rows.values()), 1)


def summarize(
    texts: list[str], calls: Calls, ready: dict[str, Any], after: dict[str, Any], own_llama: bool
) -> dict[str, Any]:
    per_text = per_text_rows(texts, calls)
    ratios = [r["ratio"] for r in per_text if r["ratio"]]
    sum_ratio = sum(r["service_wall_s"] for r in per_text) / sum(r["direct_wall_s"] for r in per_text)
    # like for like: the same token counts may differ (llama.cpp batching drift), so also compare per token
    svc_pred = [float(r["service_predicted_n"]) for r in per_text if r["service_predicted_n"] is not None]
    cache = _cache_share(list(calls.service.values()))
    median_ratio = round(statistics.median(ratios), 3) if ratios else None
    pred_median = statistics.median(svc_pred) if svc_pred else None
    shift = len(texts) // 2
    return {
        "benchmark": "extraction_overhead",
        "texts": len(texts),
        "goals": {
            "wall_ratio_median_service_over_direct": goal(median_ratio, GOALS["wall_ratio"]),
            "wall_ratio_sum_service_over_direct": goal(round(sum_ratio, 3), GOALS["wall_ratio"]),
            "predicted_tokens_median": goal(pred_median, GOALS["predicted_tokens_median"]),
            "cache_share_service": goal(cache, GOALS["cache_share"], at_most=False),
        },
        "cache_share_direct": _cache_share(list(calls.direct.values())),
        "predicted_tokens_direct_median": statistics.median(
            [float(r["direct_predicted_n"]) for r in per_text if r["direct_predicted_n"] is not None] or [0]
        ),
        "non_model_ms_median": {
            "service": _non_model_ms(calls.service),
            "direct": _non_model_ms(calls.direct),
            "what": "wall time minus llama-server prompt_ms + predicted_ms",
        },
        "max_tokens": calls.max_tokens,
        "llama_server": "own, started with " + " ".join(LLAMA_ARGS)
        if own_llama
        else "given --llm-url (its host prompt cache may serve a repeated text whole)",
        "call_order": calls.order,
        "per_text": per_text,
        "model": ready["model_server"].get("model"),
        "throughput_after": after.get("throughput"),
        "notes": f"service wall measured by polling GET /v1/memories every {POLL_S * 1000:.0f} ms "
        f"(adds up to {POLL_S * 1000:.0f} ms); direct texts in order shifted by {shift} so no call follows "
        "one with the same text",
        "machine": machine_info(),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = result["per_text"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = range(len(rows))
    left.bar([x - 0.2 for x in xs], [r["service_wall_s"] for r in rows], 0.4, label="service (remember -> done)")
    left.bar([x + 0.2 for x in xs], [r["direct_wall_s"] for r in rows], 0.4, label="direct llama-server call")
    left.set_xlabel("text")
    left.set_ylabel("s")
    left.set_title(
        f"Extraction wall time, median ratio "
        f"{result['goals']['wall_ratio_median_service_over_direct']['value']} (goal <= 1.10)"
    )
    left.legend(fontsize=8)
    right.bar([x - 0.2 for x in xs], [r["service_predicted_n"] or 0 for r in rows], 0.4, label="generated tokens")
    right.bar([x + 0.2 for x in xs], [r["service_cache_n"] or 0 for r in rows], 0.4, label="prompt tokens from cache")
    right.bar(
        [x + 0.2 for x in xs],
        [r["service_prompt_n"] or 0 for r in rows],
        0.4,
        bottom=[r["service_cache_n"] or 0 for r in rows],
        label="prompt tokens processed",
    )
    right.axhline(GOALS["predicted_tokens_median"], color="red", ls="--", lw=1, label="goal: median generated <= 60")
    right.set_title(f"Service tokens per job; cache share {result['goals']['cache_share_service']['value']}")
    right.legend(fontsize=8)
    write_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    return main_with_llama(argv, doc=__doc__, name="extraction", run=run, plot=plot, own_llama=True)


if __name__ == "__main__":
    raise SystemExit(main())
