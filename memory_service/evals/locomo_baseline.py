"""The baselines the LoCoMo eval stands beside: the data set's published figures, and the same method in this run.

The in-run baseline embeds the raw turns (the same text as ingested) with all-MiniLM-L6-v2 and ranks
them by exact cosine: no extraction, no keyword search. Measured on the same machine and data, it is
the fair comparison; the published figures are for all 5 conversations only.
"""

from __future__ import annotations

from typing import Any

from ..testbed.locomo_data import Conversation, turn_text
from ..testbed.locomo_metrics import K, score_question

# for comparison only: README of the data set, raw-turn MiniLM exact cosine, all 5 conversations (760 questions)
PUBLISHED_BASELINE = {
    "recall@10": 0.493,
    "recall@10_date_prefixed": 0.522,
    "recall@5": 0.401,
    "recall@20": 0.603,
    "mrr": 0.314,
    "questions": 760,
}


def embedding_baseline(conversations: list[Conversation], depth: int = K) -> list[dict[str, Any]]:
    """The data set's own baseline, in the same run: raw turns (same text as ingested) embedded with
    all-MiniLM-L6-v2 (sentence-transformers), exact cosine, no extraction, no keyword search. With `depth`
    above K, each row also keeps its first `depth` turns as `ranked` (for the budgeted figures)."""
    import numpy as np

    from ..embedding.embedder import TorchEmbedder

    embedder = TorchEmbedder(threads=1)
    rows: list[dict[str, Any]] = []
    for conv in conversations:
        turn_vectors = embedder.embed([turn_text(t) for t in conv.turns])
        dia_ids = [t.dia_id for t in conv.turns]
        question_vectors = embedder.embed([q.question for q in conv.questions])
        for question, qv in zip(conv.questions, question_vectors):
            order = np.argsort(-(turn_vectors @ qv))[: max(K, depth)]
            ranked = [dia_ids[i] for i in order]
            row: dict[str, Any] = {
                "sample_id": conv.sample_id,
                "q": question.index,
                "category": question.category,
                "evidence": question.evidence,
                "top": ranked[:10],
                "scores": score_question(ranked[:K], question.evidence),
            }
            if depth > K:
                row["ranked"] = ranked
            rows.append(row)
    return rows
