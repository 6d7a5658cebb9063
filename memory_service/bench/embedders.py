"""What each embedding model costs and finds, measured in one run so every model sees the same machine load.

    python -m memory_service.bench.embedders --locomo data/locomo_dev5.json [--models minilm,paraphrase-minilm-l3]

For each model of the registry (embedding/models.py) that is installed, on the LoCoMo conversations:
- `query_ms_p50`: one question embedded on one thread (median over `--queries` questions; the cost a
  recall pays before it searches), and its p90;
- `index_texts_per_s`: the conversations' turns embedded one by one, as the service's indexer does;
- `raw_turn_recall@10`: the data set's own baseline with this model (raw turns, exact cosine, no
  extraction, no keyword search): pure retrieval, beside the service's passages-only eval
  (`memory-service eval --set MEMORY_EMBEDDER_MODEL=...`).
The MiniLM is always measured first: the in-run baseline every other figure is read against.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..embedding.embedder import EmbedderError, load_embedder
from ..embedding.models import DEFAULT_MODEL, MODELS
from ..testbed.locomo_data import Conversation, load, turn_text
from ..testbed.locomo_metrics import recall_at


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def measure(model: str, backend: str, conversations: list[Conversation], queries: int) -> dict[str, Any]:
    """One model's figures (see the module's docstring); the load time is not part of any of them."""
    embedder = load_embedder(backend, threads=1, model=model)
    questions = [q.question for conv in conversations for q in conv.questions][:queries]
    embedder.embed(questions[:5])  # warm-up: the first runs allocate
    latencies = []
    for text in questions:
        start = time.perf_counter()
        embedder.embed_one(text)
        latencies.append((time.perf_counter() - start) * 1000)
    turns, found, started = 0, [], time.perf_counter()
    rows: list[tuple[int, float]] = []
    for conv in conversations:
        texts = [turn_text(t) for t in conv.turns]
        turn_vectors = embedder.embed(texts)
        turns += len(texts)
        found.append((conv, turn_vectors))
    index_s = time.perf_counter() - started
    for conv, turn_vectors in found:
        dia_ids = [t.dia_id for t in conv.turns]
        for question, qv in zip(conv.questions, embedder.embed([q.question for q in conv.questions])):
            ranked = [dia_ids[i] for i in np.argsort(-(turn_vectors @ qv))[:10]]
            rows.append((question.category, recall_at(ranked, question.evidence, 10)))
    spec = MODELS[model]
    return {
        "model": model,
        "backend": backend if model == DEFAULT_MODEL else "onnx",
        "package": spec.pip,
        "verified": spec.verified,
        "query_ms_p50": round(statistics.median(latencies), 2),
        "query_ms_p90": round(_percentile(latencies, 90), 2),
        "queries": len(latencies),
        "index_texts_per_s": round(turns / index_s, 1),
        "turns": turns,
        "raw_turn_recall@10": round(float(np.mean([r for _, r in rows])), 4),
        "questions": len(rows),
    }


def run(locomo: Path, models: list[str], backend: str, queries: int) -> dict[str, Any]:
    conversations = load(locomo)
    results, missing = [], {}
    for model in [DEFAULT_MODEL, *(m for m in models if m != DEFAULT_MODEL)]:
        try:
            results.append(measure(model, backend, conversations, queries))
        except EmbedderError as exc:  # a model whose package is not installed: say so, measure the rest
            missing[model] = str(exc)
    base = results[0]
    for r in results:
        r["query_cost_vs_minilm"] = round(r["query_ms_p50"] / base["query_ms_p50"], 2)
        r["recall_gain_vs_minilm"] = round(r["raw_turn_recall@10"] - base["raw_turn_recall@10"], 4)
    return {"data": str(locomo), "conversations": len(conversations), "results": results, "not_installed": missing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memory_service.bench.embedders", description=__doc__)
    parser.add_argument("--locomo", type=Path, required=True, help="LoCoMo-format JSON (the dev conversations)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated registry names")
    parser.add_argument("--backend", default="onnx-q8", help="the MiniLM's backend (other models run as onnx)")
    parser.add_argument("--queries", type=int, default=200, help="questions timed one by one")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    report = run(args.locomo, [m for m in args.models.split(",") if m], args.backend, args.queries)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
