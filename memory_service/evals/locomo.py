"""LoCoMo retrieval eval through the real API: does recall find the turns that answer a question?

Each conversation's turns are saved in order through POST /v1/remember (one
team per conversation, or one agent per conversation when only one API key is
given), extraction is waited for, then every question (category 5,
adversarial, skipped) is asked through POST /v1/recall with k=20 in up to five
configurations in the same run: raw turns only (`kinds: ["passage"]`), facts
only (`kinds: ["fact"]`), consolidated items only, the product default (facts and passages) and all
three kinds (the two naming consolidated items only when the service consolidates). Items map back to
turn ids through provenance (memory_id / source_memory_ids -> dia_id, from our
own map of remember responses), so facts are judged by the turns they came
from. Metrics (testbed/locomo_metrics.py): evidence recall@1/5/10/20, hit@10, MRR, overall and per category.
With a tokenizer, evidence recall within 256/512/1,024 tokens of context (budget.py), and with a reader,
its answers scored by F1 (and a judge) (reader.py). The data set's parsing is in testbed/locomo_data.py; the goals
and the figure in locomo_report.

    memory-service eval --data locomo.json --out DIR [--limit N] [--url URL --api-key KEY]
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..client.service import service_client
from ..testbed.locomo_data import SKIP_CATEGORIES, Conversation, agent_id_for, session_time, turn_text
from ..testbed.locomo_metrics import K, aggregate, ranked_dia_ids, score_question, top_diagnostics
from ..testbed.stats import latency_summary
from .budget import BUDGET_K, BudgetRun, baseline_budget, service_scores
from .locomo_baseline import PUBLISHED_BASELINE, embedding_baseline
from .locomo_facts import match as match_observations
from .locomo_report import goals, plot

__all__ = ["CONFIGS", "goals", "plot", "run"]

# name -> `kinds` sent to /v1/recall (None: the product default, fields left out)
# "all" adds consolidated items (MEMORY_CONSOLIDATE) to the default facts and passages: what they add
CONFIGS: dict[str, list[str] | None] = {
    "passages": ["passage"],
    "facts": ["fact"],
    "consolidated": ["consolidated"],
    "default": None,
    "all": ["fact", "passage", "consolidated"],
}


def _post(client: httpx.Client, path: str, body: dict[str, Any], attempts: int = 6) -> dict[str, Any]:
    """POST with a retry on back-pressure (429/503): the eval must not drop a turn silently."""
    delay = 0.5
    for attempt in range(attempts):
        response = client.post(path, json=body)
        if response.status_code < 400:
            return response.json()
        if response.status_code not in (429, 503) or attempt == attempts - 1:
            raise RuntimeError(f"{path} answered {response.status_code}: {response.text[:500]}")
        time.sleep(float(response.headers.get("retry-after") or delay))
        delay = min(delay * 2, 10)
    raise AssertionError("unreachable")


def _log(message: str) -> None:
    print(f"[locomo] {message}", file=sys.stderr, flush=True)


def ingest(client: httpx.Client, conv: Conversation, isolation: str) -> dict[str, str]:
    """Save every turn in order; returns memory id -> dia_id."""
    memory_to_dia: dict[str, str] = {}
    agent = agent_id_for(conv.sample_id)
    for n, turn in enumerate(conv.turns, start=1):
        body = {
            "text": turn_text(turn),
            "agent_id": agent,
            # one chat session is one run: extraction sees the turns just before in the same session
            "run_id": f"{conv.sample_id}-s{turn.session}",
            "metadata": {"dia_id": turn.dia_id, "sample_id": conv.sample_id, "session": turn.session},
            "idempotency_key": f"locomo:{conv.sample_id}:{turn.dia_id}:{isolation}",
        }
        said = session_time(turn.date)
        if said is not None:
            body["occurred_at"] = said
        memory_to_dia[_post(client, "/v1/remember", body)["id"]] = turn.dia_id
        if n % 100 == 0:
            _log(f"{conv.sample_id}: saved {n}/{len(conv.turns)} turns")
    return memory_to_dia


def extraction_stats(
    client: httpx.Client, memory_to_dia: dict[str, str], observations: list[tuple[str, str]] | None = None
) -> dict[str, Any]:
    """Per-job outcome from GET /v1/memories: status, facts, tokens, cache share; and the facts' precision
    and recall against LoCoMo's observations of the same turns (locomo_facts)."""
    memory_ids = list(memory_to_dia)
    drawn: list[tuple[str, str]] = []  # (fact text, dia_id of the turn it was drawn from)
    statuses: dict[str, int] = {}
    facts, predicted, proposed, stored, cache, model_s = [], [], 0, 0, [], []
    skipped = deferrals = attempts = calls = 0
    for memory_id in memory_ids:
        body = client.get(f"/v1/memories/{memory_id}").json()
        statuses[body.get("status", "?")] = statuses.get(body.get("status", "?"), 0) + 1
        facts.append(len(body.get("facts") or []))
        drawn += [(str(f.get("text", "")), memory_to_dia[memory_id]) for f in body.get("facts") or []]
        timings = body.get("timings") or {}
        if timings.get("predicted_n") is not None:
            predicted.append(float(timings["predicted_n"]))
            model_s.append(((timings.get("prompt_ms") or 0) + (timings.get("predicted_ms") or 0)) / 1000)
        report = body.get("extraction") or {}
        proposed += int(report.get("proposed") or 0)
        stored += int(report.get("stored") or 0)
        if report.get("cache_ratio") is not None:
            cache.append(float(report["cache_ratio"]))
        skipped += bool(report.get("skipped"))
        calls += len(report.get("calls") or [])
        deferrals += int(body.get("deferrals") or 0)
        attempts += int(body.get("attempts") or 0)
    return {
        "memories": len(memory_ids),
        "status": statuses,
        "facts_per_turn_mean": round(statistics.fmean(facts), 3) if facts else None,
        "turns_with_no_fact": sum(1 for f in facts if f == 0),
        "proposed": proposed,
        "stored_new": stored,
        "predicted_tokens_median": statistics.median(predicted) if predicted else None,
        # llama.cpp's own prompt + generation time of each save's extraction (model seconds per save)
        "model_s_per_save_mean": round(statistics.fmean(model_s), 3) if model_s else None,
        "model_s_total": round(sum(model_s), 1),
        "cache_ratio_median": statistics.median(cache) if cache else None,
        "model_calls": calls,
        "skipped_small_talk": skipped,
        "deferrals": deferrals,
        "attempts": attempts,
        "vs_observations": match_observations(drawn, observations) if observations else None,
    }


def configs_for(consolidation: dict[str, Any]) -> dict[str, list[str] | None]:
    """The recall modes worth asking: those naming consolidated items only when the service consolidated."""
    if consolidation.get("enabled"):
        return CONFIGS
    return {name: kinds for name, kinds in CONFIGS.items() if name not in ("consolidated", "all")}


def ask(
    client: httpx.Client,
    conv: Conversation,
    memory_to_dia: dict[str, str],
    isolation: str,
    configs: dict[str, list[str] | None] = CONFIGS,
    budget: BudgetRun | None = None,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[float]]]:
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    latencies: dict[str, list[float]] = {name: [] for name in configs}
    for question in conv.questions:
        for name, kinds in configs.items():
            body: dict[str, Any] = {"query": question.question, "k": K}
            if kinds is not None:
                body["kinds"] = kinds
            if isolation == "agent":
                body.update(agent_id=agent_id_for(conv.sample_id), scope="agent")
            started = time.perf_counter()
            items = _post(client, "/v1/recall", body)["items"]
            latencies[name].append(time.perf_counter() - started)
            ranked = ranked_dia_ids(items, memory_to_dia)
            row: dict[str, Any] = {
                "sample_id": conv.sample_id,
                "q": question.index,
                "category": question.category,
                "evidence": question.evidence,
                "top": ranked[:10],
                "scores": score_question(ranked, question.evidence),
                "diag": top_diagnostics(items, memory_to_dia),
            }
            if budget is not None and budget.counter is not None:  # once more per budget: the context as pasted
                deep = {**body, "k": BUDGET_K}
                extra, row["reader_context"] = service_scores(
                    lambda tokens: _post(client, "/v1/recall", {**deep, "max_tokens": tokens}),  # noqa: B023
                    memory_to_dia,
                    question.evidence,
                    budget.reader_budget,
                )
                row["scores"].update(extra)
            rows[name].append(row)
    return rows, latencies


def wait_consolidated(client: httpx.Client, timeout_s: float, settle_s: float = 8.0) -> dict[str, Any]:
    """When the service consolidates: until no pass runs and the item count held for `settle_s` (a pass with
    nothing due writes no run); the last stats either way."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    seen: tuple | None = None
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        last = client.get("/v1/stats").json().get("consolidation") or {}
        if not last.get("enabled"):
            return last
        runs = last.get("runs") or []
        now = (
            last.get("items"),
            len(runs),
            runs[0].get("id") if runs else None,
            runs[0].get("outcome") if runs else None,
        )
        busy = last.get("running") or (runs and runs[0].get("outcome") == "running")
        if busy or now != seen:
            seen, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= settle_s:
            return last
        time.sleep(2.0)
    return last


def run(
    conversations: list[Conversation],
    *,
    url: str,
    keys: dict[str, str | None],
    isolation: str = "team",
    extraction_timeout_s: float | None = None,
    budget: BudgetRun | None = None,
) -> dict[str, Any]:
    """The whole eval against a running service; `keys` maps sample_id -> API key. `budget`: the budgeted
    figures (its tokenizer) and the reader's answers, when given."""
    started = time.monotonic()
    timing: dict[str, float] = {}
    clients = {c.sample_id: service_client(url, keys.get(c.sample_id), timeout=180.0) for c in conversations}
    try:
        maps = {conv.sample_id: ingest(clients[conv.sample_id], conv, isolation) for conv in conversations}
        timing["ingest"] = time.monotonic() - started
        ready, consolidation = _wait_for_service(
            url, clients[conversations[0].sample_id], conversations, extraction_timeout_s, timing, keys
        )
        configs = configs_for(consolidation)
        q_started = time.monotonic()
        asked = ask_all(clients, conversations, maps, isolation, configs, budget)
        timing["questions"] = time.monotonic() - q_started
    finally:
        for client in clients.values():
            client.close()
    results = {
        name: {**aggregate(asked.rows[name]), "recall_latency": latency_summary(asked.latencies[name])}
        for name in configs
    }
    _log("computing the embedding baseline (raw turns, MiniLM, exact cosine) in-process")
    counter = budget.counter if budget is not None else None
    baseline_rows = embedding_baseline(conversations, BUDGET_K if counter is not None else K)
    if budget is not None and counter is not None:
        baseline_budget(conversations, baseline_rows, counter, budget.reader_budget)
    results["embedding_baseline"] = aggregate(baseline_rows)
    answers = None
    if budget is not None:
        answers = budget.answer({**asked.rows, "embedding_baseline": baseline_rows}, conversations)
        budget.close()
    return {
        "dataset": "locomo",
        "conversations": asked.per_conversation,
        "questions": sum(len(c.questions) for c in conversations),
        "turns": sum(len(c.turns) for c in conversations),
        "results": results,
        "goal": goals(results),
        "published_baseline": PUBLISHED_BASELINE,
        "settings": {
            "k": K,
            "configs": {n: (k or "default (fact+passage)") for n, k in configs.items()},
            "isolation": isolation,
            "skip_categories": sorted(SKIP_CATEGORIES),
            "text_format": "[<session date>] <speaker>: <text> (shared a photo: <blip_caption>)",
        },
        "ready_after_extraction": {k: ready.get(k) for k in ("model_server", "jobs", "throughput", "extract_budget_s")},
        "consolidation": consolidation,
        "timing_s": {
            "ingest": round(timing["ingest"], 1),
            "extraction_wait": round(timing["extraction_wait"], 1),
            "consolidation_wait_at_idle": round(timing["consolidation_wait"], 1)
            if consolidation.get("enabled")
            else None,
            "questions": round(timing["questions"], 1),
            "total": round(time.monotonic() - started, 1),
        },
        "sample_rows": {name: asked.rows[name][:5] for name in configs},
        "budget": budget.describe() if budget is not None else None,
        "answers": answers,
    }


def _wait_for_service(
    url: str,
    client: httpx.Client,
    conversations: list[Conversation],
    extraction_timeout_s: float | None,
    timing: dict[str, float],
    keys: dict[str, str | None],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Until extraction has emptied the queue, then until consolidation settles; /ready and its stats."""
    from ..testbed.service_runner import wait_queue_empty

    total_turns = sum(len(c.turns) for c in conversations)
    _log(f"saved {total_turns} turns in {timing['ingest']:.1f}s; waiting for extraction")
    started = time.monotonic()
    ready = wait_queue_empty(
        url,
        extraction_timeout_s or max(600.0, total_turns * 30.0),
        progress="locomo extraction",
        total=total_turns,
        keys=[keys.get(c.sample_id) for c in conversations],  # /ready counts each key's team's jobs
    )
    timing["extraction_wait"] = time.monotonic() - started
    _log(f"extraction finished in {timing['extraction_wait']:.0f}s")
    idle_started = time.monotonic()
    consolidation = wait_consolidated(client, extraction_timeout_s or max(600.0, total_turns * 10.0))
    timing["consolidation_wait"] = time.monotonic() - idle_started  # the model's time at idle (with the settle)
    _log(f"consolidation: {consolidation}; asking questions")
    return ready, consolidation


@dataclass
class Asked:
    """Every question's scored row and recall latency per configuration, and each conversation's summary."""

    rows: dict[str, list[dict[str, Any]]]
    latencies: dict[str, list[float]]
    per_conversation: list[dict[str, Any]] = field(default_factory=list)


def ask_all(
    clients: dict[str, httpx.Client],
    conversations: list[Conversation],
    maps: dict[str, dict[str, str]],
    isolation: str,
    configs: dict[str, list[str] | None],
    budget: BudgetRun | None = None,
) -> Asked:
    """Each conversation's extraction outcome, then its questions in every configuration."""
    asked = Asked({name: [] for name in configs}, {name: [] for name in configs})
    for conv in conversations:
        client = clients[conv.sample_id]
        stats = extraction_stats(client, maps[conv.sample_id], conv.observations)
        rows, latencies = ask(client, conv, maps[conv.sample_id], isolation, configs, budget)
        for name in configs:
            asked.rows[name] += rows[name]
            asked.latencies[name] += latencies[name]
        summary: dict[str, Any] = {
            "sample_id": conv.sample_id,
            "turns": len(conv.turns),
            "questions": len(conv.questions),
            "skipped_questions": conv.skipped,
            "extraction": stats,
            "recall@10": {name: aggregate(rows[name])["overall"].get("recall@10") for name in configs},
        }
        asked.per_conversation.append(summary)
        _log(
            f"{conv.sample_id}: {len(conv.questions)} questions, recall@10 "
            + ", ".join(f"{n} {summary['recall@10'][n]}" for n in configs)
        )
    return asked
