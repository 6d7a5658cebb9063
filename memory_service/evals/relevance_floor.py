"""The relevance floor on LoCoMo: evidence recall@10 and items returned, per floor, on raw turns.

Each conversation's turns are saved into a team of their own in a service opened in this process (real
stores, real embedder, no model: no facts are extracted, so what is measured is recall over the raw turns
as passages, the default kinds), then every question (adversarial ones skipped) and every out-of-domain
question (`out_of_domain`) is asked at k=10 once per floor. The floor is chosen on `--choose`
conversations and reported on `--report` ones, which played no part in choosing it.

    python -m memory_service.evals.relevance_floor --data locomo.json --choose conv-26,conv-30 \
        --report conv-41,conv-42,conv-43 [--floors -1,0.1,0.15,0.2,0.25,0.3] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from ..config import Settings
from ..pipeline.passages import index_passages
from ..recall.floor import OFF
from ..recall.search import RecallQuery, recall
from ..services import Services
from ..testbed.locomo_data import Conversation, agent_id_for, load, session_time, turn_text
from ..testbed.locomo_metrics import recall_at
from .out_of_domain import QUESTIONS

K = 10
FLOORS = (OFF, 0.15, 0.2, 0.25, 0.3, 0.35)
UNREACHABLE = "http://127.0.0.1:9"  # no model is asked: nothing is extracted


def _log(message: str) -> None:
    print(f"[floor] {message}", file=sys.stderr, flush=True)


def save_turns(services: Services, conv: Conversation) -> dict[str, str]:
    """Every turn as a saved text of team `sample_id`, embedded as passages now; memory id -> dia_id."""
    to_dia: dict[str, str] = {}
    for turn in conv.turns:
        said = session_time(turn.date)
        memory, _ = services.journal.insert(
            team=conv.sample_id,
            agent_id=agent_id_for(conv.sample_id),
            text=turn_text(turn),
            run_id=f"{conv.sample_id}-s{turn.session}",
            tags=[],
            metadata={},
            idempotency_key=None,
            budget_s=20.0,
            occurred_at=datetime.fromisoformat(said).timestamp() if said else None,
        )
        to_dia[memory.id] = turn.dia_id
    while batch := services.journal.unindexed(256):
        index_passages(batch, services.embedder, services.vectors)
        services.journal.mark_indexed([m.id for m in batch])
    return to_dia


def _settle(services: Services, team: str) -> None:
    """Ask once and wait for the team's hubness pass, so every floor sees the same ranking."""
    ask(services, team, "warm up", OFF)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = services.search.hub_scores.states.get((team, "passage"))
        if state is not None and not state.running and state.live_at >= 0:
            return
        time.sleep(0.05)


def ask(services: Services, team: str, question: str, floor: float) -> list[str]:
    """The memory ids of one recall at k=10 with this floor, best first."""
    found = recall(
        RecallQuery(team=team, query=question, k=K),
        journal=services.journal,
        embedder=services.embedder,
        search=services.search,
        queries=services.query_embeddings,
        floor=floor,
    )
    return [h.memory_id for h in found.hits]


def measure(services: Services, conv: Conversation, to_dia: dict[str, str], floors: tuple[float, ...]) -> dict:
    """Per floor: each question's recall@10, items returned, and items for the out-of-domain questions."""
    out: dict[str, Any] = {}
    for floor in floors:
        scores, items, ood = [], [], []
        for q in conv.questions:
            ids = ask(services, conv.sample_id, q.question, floor)
            ranked = list(dict.fromkeys(to_dia[i] for i in ids if i in to_dia))
            scores.append(recall_at(ranked, q.evidence, K))
            items.append(len(ids))
        for question in QUESTIONS:
            ood.append(len(ask(services, conv.sample_id, question, floor)))
        out[f"{floor:g}"] = {"recall": scores, "items": items, "ood_items": ood}
    return out


def summary(per_conv: dict[str, dict], names: list[str]) -> dict[str, dict[str, float]]:
    """The conversations' questions pooled, per floor."""
    table: dict[str, dict[str, float]] = {}
    for floor in per_conv[names[0]]:
        rows = [per_conv[n][floor] for n in names]
        table[floor] = {
            "questions": sum(len(r["recall"]) for r in rows),
            "recall@10": round(statistics.fmean(x for r in rows for x in r["recall"]), 4),
            "items_mean": round(statistics.fmean(x for r in rows for x in r["items"]), 2),
            "ood_items_mean": round(statistics.fmean(x for r in rows for x in r["ood_items"]), 2),
            "ood_empty_share": round(statistics.fmean(x == 0 for r in rows for x in r["ood_items"]), 3),
        }
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memory_service.evals.relevance_floor", description=__doc__)
    parser.add_argument("--data", type=Path, required=True, help="a LoCoMo .json file")
    parser.add_argument("--choose", required=True, help="comma-separated sample ids the floor is chosen on")
    parser.add_argument("--report", required=True, help="comma-separated sample ids it is reported on")
    parser.add_argument("--floors", default=",".join(f"{f:g}" for f in FLOORS), help="floors to measure")
    parser.add_argument("--out", type=Path, help="write the result here as JSON too")
    args = parser.parse_args(argv)
    splits = {"choose": args.choose.split(","), "report": args.report.split(",")}
    floors = tuple(float(f) for f in args.floors.split(","))
    wanted = {n for names in splits.values() for n in names}
    conversations = [c for c in load(args.data) if c.sample_id in wanted]
    per_conv: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), llm_url=UNREACHABLE, chroma_process=False)
        services = Services.open(settings)
        try:
            for conv in conversations:
                started = time.monotonic()
                to_dia = save_turns(services, conv)
                _settle(services, conv.sample_id)
                per_conv[conv.sample_id] = measure(services, conv, to_dia, floors)
                _log(
                    f"{conv.sample_id}: {len(conv.turns)} turns, {len(conv.questions)} questions, "
                    f"{time.monotonic() - started:.0f}s"
                )
        finally:
            services.close()
    result = {
        "k": K,
        "measured": "raw turns as passages (no facts extracted), default kinds, in process",
        "splits": splits,
        "out_of_domain_questions": len(QUESTIONS),
        **{name: summary(per_conv, names) for name, names in splits.items()},
    }
    print(json.dumps({k: v for k, v in result.items()}, indent=2))
    if args.out:
        args.out.write_text(json.dumps({**result, "per_conversation": per_conv}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
