"""What a LoCoMo eval's result is read against (its goals) and its figure: retrieval, and budgeted recall."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..testbed.locomo_metrics import CUTOFFS
from ..testbed.results import pyplot, write_figure
from .budget import BUDGETS
from .locomo_baseline import PUBLISHED_BASELINE


def goals(results: dict[str, Any]) -> dict[str, Any]:
    """The default configuration against the embedding baseline, passages alone and the published figure."""
    default_r10 = results["default"]["overall"].get("recall@10")
    passage_r10 = results["passages"]["overall"].get("recall@10")
    baseline_r10 = results["embedding_baseline"]["overall"].get("recall@10")
    return {
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
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """recall@k overall and per category; with budgeted figures, a second row: recall within B tokens."""
    plt = pyplot()
    budgeted = f"recall@{BUDGETS[0]}tok" in result["results"]["default"]["overall"]
    fig, axes = plt.subplots(2 if budgeted else 1, 2, figsize=(12, 9 if budgeted else 4.5), squeeze=False)
    left, right = axes[0]
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
    if budgeted:
        _plot_budget(result, axes[1][0], axes[1][1])
    write_figure(fig, path)


def _plot_budget(result: dict[str, Any], left: Any, right: Any) -> None:
    """Evidence recall within B tokens per mode (mean tokens per item in the legend); per category at 512."""
    names = [n for n in result["results"] if f"recall@{BUDGETS[0]}tok" in result["results"][n]["overall"]]
    for name in names:
        overall = result["results"][name]["overall"]
        label = f"{name} ({overall.get('tokens_per_item', 0):.0f} tok/item)"
        left.plot(BUDGETS, [overall.get(f"recall@{b}tok", 0) for b in BUDGETS], marker="o", label=label)
    left.set_xscale("log", base=2)
    left.set_xticks(BUDGETS, [str(b) for b in BUDGETS])
    left.set_ylim(0, 1)
    left.set_xlabel("context budget (tokens of the default model)")
    left.set_title("evidence recall within B tokens")
    left.legend(fontsize=8)
    cats = list(result["results"]["default"]["per_category"])
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        per = result["results"][name]["per_category"]
        heights = [per[c].get("recall@512tok", 0) for c in cats]
        right.bar([c + i * width for c in range(len(cats))], heights, width, label=name)
    right.set_xticks([c + width for c in range(len(cats))], cats, fontsize=8)
    right.set_ylim(0, 1)
    right.set_title("evidence recall within 512 tokens, per category")
    right.legend(fontsize=8)
