"""LoCoMo's retrieval metrics: recall items mapped back to turns, scored against a question's evidence."""

from __future__ import annotations

import statistics
from typing import Any

K = 20  # items asked of each recall
CUTOFFS = (1, 5, 10, 20)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


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
