"""LoCoMo retrieval eval through the real API: does recall find the turns that answer a question?

Each conversation's turns are saved in order through POST /v1/remember (one
team per conversation, or one agent per conversation when only one API key is
given), extraction is waited for, then every question (category 5,
adversarial, skipped) is asked through POST /v1/recall with k=20 in three
configurations in the same run: raw turns only (`kinds: ["passage"]`), facts
only (`kinds: ["fact"]`), consolidated items only, the product default (facts and passages) and all
three kinds. Items map back to
turn ids through provenance (memory_id / source_memory_ids -> dia_id, from our
own map of remember responses), so facts are judged by the turns they came
from. Metrics: evidence recall@1/5/10/20, hit@10, MRR, overall and per category.

    memory-service eval --data locomo.json --out DIR [--limit N] [--url URL --api-key KEY]
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from memory_service.bench.common import latency_summary, pyplot, write_figure
from memory_service.client.service import service_client

K = 20
CUTOFFS = (1, 5, 10, 20)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SKIP_CATEGORIES = {5}
# name -> `kinds` sent to /v1/recall (None: the product default, fields left out)
# "all" adds consolidated items (MEMORY_CONSOLIDATE) to the default facts and passages: what they add
CONFIGS: dict[str, list[str] | None] = {
    "passages": ["passage"],
    "facts": ["fact"],
    "consolidated": ["consolidated"],
    "default": None,
    "all": ["fact", "passage", "consolidated"],
}
# for comparison only: README of the data set, raw-turn MiniLM exact cosine, all 5 conversations (760 questions)
PUBLISHED_BASELINE = {
    "recall@10": 0.493,
    "recall@10_date_prefixed": 0.522,
    "recall@5": 0.401,
    "recall@20": 0.603,
    "mrr": 0.314,
    "questions": 760,
}

_EVIDENCE = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_AGENT_OK = re.compile(r"[^A-Za-z0-9._:@/-]")


# ---------------------------------------------------------------- data


@dataclass
class Turn:
    dia_id: str
    session: int
    date: str
    speaker: str
    text: str
    caption: str | None = None


@dataclass
class Question:
    index: int
    question: str
    category: int
    evidence: list[str]
    raw_evidence: list[str]


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[Question]
    skipped: dict[str, int] = field(default_factory=dict)


def normalize_evidence(raw: Iterable[str], valid: set[str] | None = None) -> list[str]:
    """`D8:6; D9:17` -> [D8:6, D9:17]; `D30:05` -> D30:5; `D:11:26` -> D11:26; ids not in `valid` dropped."""
    out: list[str] = []
    for entry in raw:
        for session, turn in _EVIDENCE.findall(str(entry)):
            dia_id = f"D{int(session)}:{int(turn)}"
            if (valid is None or dia_id in valid) and dia_id not in out:
                out.append(dia_id)
    return out


def turn_text(turn: Turn) -> str:
    """What an agent would save: speaker and session date in the text, a shared photo described."""
    text = f"[{turn.date}] {turn.speaker}: {turn.text}"
    if turn.caption:
        text += f" (shared a photo: {turn.caption})"
    return text


def session_time(value: str) -> str | None:
    """LoCoMo's session date ("1:56 pm on 8 May, 2023") as ISO-8601, or None when it reads otherwise."""
    for layout in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(value.strip(), layout).isoformat()
        except ValueError:
            continue
    return None


def agent_id_for(sample_id: str) -> str:
    cleaned = _AGENT_OK.sub("-", sample_id).strip("-") or "conversation"
    return cleaned if cleaned[0].isalnum() else "c" + cleaned


def _session_numbers(conv: dict[str, Any]) -> list[int]:
    nums = []
    for key, value in conv.items():
        match = re.fullmatch(r"session_(\d+)", key)
        if match and isinstance(value, list):
            nums.append(int(match.group(1)))
    return sorted(nums)


def parse_conversation(sample: dict[str, Any]) -> Conversation:
    conv = sample["conversation"]
    turns: list[Turn] = []
    for n in _session_numbers(conv):
        date = str(conv.get(f"session_{n}_date_time") or "").strip()
        for raw in conv[f"session_{n}"]:
            caption = raw.get("blip_caption")
            ids = normalize_evidence([raw["dia_id"]])
            turns.append(
                Turn(
                    dia_id=ids[0] if ids else str(raw["dia_id"]),
                    session=n,
                    date=date,
                    speaker=str(raw.get("speaker", "")),
                    text=str(raw.get("text", "")),
                    caption=str(caption) if caption else None,
                )
            )
    valid = {t.dia_id for t in turns}
    questions: list[Question] = []
    skipped = {"adversarial": 0, "no_valid_evidence": 0}
    for index, qa in enumerate(sample.get("qa", [])):
        category = int(qa.get("category", 0))
        if category in SKIP_CATEGORIES:
            skipped["adversarial"] += 1
            continue
        raw_evidence = [str(e) for e in qa.get("evidence", [])]
        evidence = normalize_evidence(raw_evidence, valid)
        if not evidence:
            skipped["no_valid_evidence"] += 1
            continue
        questions.append(Question(index, str(qa["question"]), category, evidence, raw_evidence))
    return Conversation(str(sample["sample_id"]), turns, questions, skipped)


def load(path: Path, limit: int | None = None) -> list[Conversation]:

    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not data or "conversation" not in data[0]:
        raise ValueError(f"{path} is not LoCoMo-format data (a JSON list of {{sample_id, conversation, qa}})")
    samples = data[:limit] if limit else data
    return [parse_conversation(s) for s in samples]


def is_locomo(path: Path) -> bool:
    """A JSON list whose first element has `conversation` and `qa`."""

    if path.suffix != ".json":
        return False
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "conversation" in data[0]


# ---------------------------------------------------------------- metrics


def ranked_dia_ids(items: list[dict[str, Any]], memory_to_dia: dict[str, str]) -> list[str]:
    """Distinct turn ids in rank order; a fact contributes every turn it came from, at its rank."""
    out: list[str] = []
    for item in items:
        sources = item.get("source_memory_ids") or [item.get("memory_id")]
        for memory_id in sources:
            dia_id = memory_to_dia.get(str(memory_id))
            if dia_id is not None and dia_id not in out:
                out.append(dia_id)
    return out


def recall_at(ranked: list[str], gold: list[str], k: int) -> float:
    return len(set(ranked[:k]) & set(gold)) / len(gold) if gold else 0.0


def hit_at(ranked: list[str], gold: list[str], k: int) -> float:
    return 1.0 if set(ranked[:k]) & set(gold) else 0.0


def reciprocal_rank(ranked: list[str], gold: list[str]) -> float:
    for position, dia_id in enumerate(ranked, start=1):
        if dia_id in gold:
            return 1.0 / position
    return 0.0


def score_question(ranked: list[str], gold: list[str]) -> dict[str, float]:
    scores = {f"recall@{k}": recall_at(ranked, gold, k) for k in CUTOFFS}
    scores["hit@10"] = hit_at(ranked, gold, 10)
    scores["mrr"] = reciprocal_rank(ranked, gold)
    return scores


def top_diagnostics(items: list[dict[str, Any]], memory_to_dia: dict[str, str], k: int = 10) -> dict[str, float]:
    """How the first k items spend their slots: facts among them, distinct turns they cover."""
    top = items[:k]
    return {
        "items": float(len(top)),
        "fact_items": float(sum(1 for i in top if i.get("kind") == "fact")),
        "distinct_turns": float(len(ranked_dia_ids(top, memory_to_dia))),
    }


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean of each metric over questions, overall and per category."""

    def mean_of(subset: list[dict[str, Any]]) -> dict[str, Any]:
        if not subset:
            return {"n": 0}
        keys = subset[0]["scores"].keys()
        return {"n": len(subset), **{k: round(statistics.fmean(r["scores"][k] for r in subset), 4) for k in keys}}

    per_category = {}
    for cat in sorted({r["category"] for r in rows}):
        per_category[f"{cat}-{CATEGORIES.get(cat, 'other')}"] = mean_of([r for r in rows if r["category"] == cat])
    diag: dict[str, Any] = {}
    if rows and "diag" in rows[0]:
        diag = {
            f"top10_{key}_mean": round(statistics.fmean(r["diag"][key] for r in rows), 3) for key in rows[0]["diag"]
        }
    return {"overall": mean_of(rows), "per_category": per_category, "top10_items": diag}


# ---------------------------------------------------------------- running


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


def extraction_stats(client: httpx.Client, memory_ids: list[str]) -> dict[str, Any]:
    """Per-job outcome from GET /v1/memories: status, facts, tokens, cache share."""
    statuses: dict[str, int] = {}
    facts, predicted, proposed, stored, cache, model_s = [], [], 0, 0, [], []
    skipped = deferrals = attempts = calls = 0
    for memory_id in memory_ids:
        body = client.get(f"/v1/memories/{memory_id}").json()
        statuses[body.get("status", "?")] = statuses.get(body.get("status", "?"), 0) + 1
        facts.append(len(body.get("facts") or []))
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
            rows[name].append(
                {
                    "sample_id": conv.sample_id,
                    "q": question.index,
                    "category": question.category,
                    "evidence": question.evidence,
                    "top": ranked[:10],
                    "scores": score_question(ranked, question.evidence),
                    "diag": top_diagnostics(items, memory_to_dia),
                }
            )
    return rows, latencies


def embedding_baseline(conversations: list[Conversation]) -> list[dict[str, Any]]:
    """The data set's own baseline, in the same run: raw turns (same text as ingested) embedded with
    all-MiniLM-L6-v2 (sentence-transformers), exact cosine, no extraction, no keyword search."""
    import numpy as np

    from memory_service.embedding.embedder import TorchEmbedder

    embedder = TorchEmbedder(threads=1)
    rows: list[dict[str, Any]] = []
    for conv in conversations:
        turn_vectors = embedder.embed([turn_text(t) for t in conv.turns])
        dia_ids = [t.dia_id for t in conv.turns]
        question_vectors = embedder.embed([q.question for q in conv.questions])
        for question, qv in zip(conv.questions, question_vectors):
            order = np.argsort(-(turn_vectors @ qv))[:K]
            ranked = [dia_ids[i] for i in order]
            rows.append(
                {
                    "sample_id": conv.sample_id,
                    "q": question.index,
                    "category": question.category,
                    "evidence": question.evidence,
                    "top": ranked[:10],
                    "scores": score_question(ranked, question.evidence),
                }
            )
    return rows


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
) -> dict[str, Any]:
    """The whole eval against a running service; `keys` maps sample_id -> API key."""
    started = time.monotonic()
    clients = {c.sample_id: service_client(url, keys.get(c.sample_id), timeout=180.0) for c in conversations}
    try:
        maps: dict[str, dict[str, str]] = {}
        for conv in conversations:
            maps[conv.sample_id] = ingest(clients[conv.sample_id], conv, isolation)
        ingest_s = time.monotonic() - started
        total_turns = sum(len(c.turns) for c in conversations)
        _log(f"saved {total_turns} turns in {ingest_s:.1f}s; waiting for extraction")
        from memory_service.bench.common import wait_queue_empty

        ready = wait_queue_empty(
            url, extraction_timeout_s or max(600.0, total_turns * 30.0), progress="locomo extraction", total=total_turns
        )
        extraction_s = time.monotonic() - started - ingest_s
        _log(f"extraction finished in {extraction_s:.0f}s")
        idle_started = time.monotonic()
        consolidation = wait_consolidated(
            clients[conversations[0].sample_id], extraction_timeout_s or max(600.0, total_turns * 10.0)
        )
        consolidation_s = time.monotonic() - idle_started  # the model's time at idle (includes the settle wait)
        _log(f"consolidation: {consolidation}; asking questions")
        configs = configs_for(consolidation)
        per_conv: list[dict[str, Any]] = []
        all_rows: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        all_lat: dict[str, list[float]] = {name: [] for name in configs}
        q_started = time.monotonic()
        for conv in conversations:
            client = clients[conv.sample_id]
            stats = extraction_stats(client, list(maps[conv.sample_id]))
            rows, latencies = ask(client, conv, maps[conv.sample_id], isolation, configs)
            for name in configs:
                all_rows[name] += rows[name]
                all_lat[name] += latencies[name]
            per_conv.append(
                {
                    "sample_id": conv.sample_id,
                    "turns": len(conv.turns),
                    "questions": len(conv.questions),
                    "skipped_questions": conv.skipped,
                    "extraction": stats,
                    "recall@10": {name: aggregate(rows[name])["overall"].get("recall@10") for name in configs},
                }
            )
            _log(
                f"{conv.sample_id}: {len(conv.questions)} questions, recall@10 "
                + ", ".join(f"{n} {per_conv[-1]['recall@10'][n]}" for n in configs)
            )
        questions_s = time.monotonic() - q_started
    finally:
        for client in clients.values():
            client.close()

    results = {
        name: {**aggregate(all_rows[name]), "recall_latency": latency_summary(all_lat[name])} for name in configs
    }
    _log("computing the embedding baseline (raw turns, MiniLM, exact cosine) in-process")
    results["embedding_baseline"] = aggregate(embedding_baseline(conversations))
    default_r10 = results["default"]["overall"].get("recall@10")
    passage_r10 = results["passages"]["overall"].get("recall@10")
    baseline_r10 = results["embedding_baseline"]["overall"].get("recall@10")
    return {
        "dataset": "locomo",
        "conversations": per_conv,
        "questions": sum(len(c.questions) for c in conversations),
        "turns": sum(len(c.turns) for c in conversations),
        "results": results,
        "goal": {
            "default_beats_embedding_baseline_recall@10": {
                "default": default_r10,
                "embedding_baseline_same_run": baseline_r10,
                "met": None if default_r10 is None or baseline_r10 is None else default_r10 > baseline_r10,
            },
            "default_beats_service_passage_search_recall@10": {
                "default": default_r10,
                "passages_only_same_run": passage_r10,
                "met": None if default_r10 is None or passage_r10 is None else default_r10 > passage_r10,
            },
            "default_vs_published_raw_turn_baseline_recall@10": {
                "default": default_r10,
                "published": PUBLISHED_BASELINE["recall@10"],
                "met": None if default_r10 is None else default_r10 > PUBLISHED_BASELINE["recall@10"],
                "note": "published figure is over all 5 conversations (760 questions): comparable only without --limit",
            },
        },
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
            "ingest": round(ingest_s, 1),
            "extraction_wait": round(extraction_s, 1),
            "consolidation_wait_at_idle": round(consolidation_s, 1) if consolidation.get("enabled") else None,
            "questions": round(questions_s, 1),
            "total": round(time.monotonic() - started, 1),
        },
        "sample_rows": {name: all_rows[name][:5] for name in configs},
    }


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    metrics = [f"recall@{k}" for k in CUTOFFS] + ["hit@10", "mrr"]
    names = list(result["results"])  # the service's configurations and the embedding baseline
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        overall = result["results"][name]["overall"]
        left.bar([m + i * width for m in range(len(metrics))], [overall.get(m, 0) for m in metrics], width, label=name)
    left.axhline(PUBLISHED_BASELINE["recall@10"], color="grey", ls="--", lw=1, label="published raw-turn r@10")
    left.set_xticks([m + width for m in range(len(metrics))], metrics)
    left.set_ylim(0, 1)
    left.set_title(f"LoCoMo evidence retrieval ({result['questions']} questions)")
    left.legend(fontsize=8)
    cats = list(result["results"]["default"]["per_category"])
    for i, name in enumerate(names):
        per = result["results"][name]["per_category"]
        right.bar(
            [c + i * width for c in range(len(cats))], [per[c].get("recall@10", 0) for c in cats], width, label=name
        )
    right.set_xticks([c + width for c in range(len(cats))], cats, fontsize=8)
    right.set_ylim(0, 1)
    right.set_title("recall@10 per category")
    right.legend(fontsize=8)
    write_figure(fig, path)
