"""Evidence recall within a context budget: how much of the evidence fits in what an agent can spare.

An agent on a 4B model in an 8-16k context pastes a few hundred tokens of memory, so recall@k alone says
little: ten long turns may not fit where ten short facts do. For each question and budget B the eval asks
/v1/recall once more with k = BUDGET_K and `max_tokens` = B, so the context is the one the service
assembles within B (recall/context.py) and is measured as an agent receives it: the turns its items stand
for are scored against the question's evidence. The raw-turn baseline's turns are rendered as passage
lines and cut by the same rule (in rank order, a line that would pass B skipped), counted by the default
model's tokenizer (llama-server's /tokenize), as the service counts.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from ..testbed.locomo_data import Conversation, Turn, agent_id_for, session_time, turn_text
from ..testbed.locomo_metrics import ranked_dia_ids

BUDGETS = (256, 512, 1024)
BUDGET_K = 100  # items asked for the budgeted context: more than 1,024 tokens of the shortest facts
ALL_TOKENS = 32768  # recall's largest max_tokens: every one of the BUDGET_K items' lines is counted


Answers = Callable[[dict[str, list[dict[str, Any]]], list[Conversation]], dict[str, Any]]


class TokenCounter:
    """Tokens of a text by a llama-server's /tokenize (the default model's tokenizer); each text once."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout, trust_env=False)
        self._seen: dict[str, int] = {}

    def count(self, text: str) -> int:
        if text not in self._seen:
            response = self._client.post(self.url + "/tokenize", json={"content": text, "add_special": False})
            response.raise_for_status()
            self._seen[text] = len(response.json()["tokens"])
        return self._seen[text]

    def check(self) -> str | None:
        """None when /tokenize answers, else why not (the budgeted figures are then left out, said so)."""
        try:
            self.count("budget probe")
            return None
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            return f"{self.url}/tokenize did not answer: {type(exc).__name__}: {exc}"

    def close(self) -> None:
        self._client.close()


def fits(costs: list[int], budget: int) -> list[int]:
    """The lines, by index in rank order, that fit in `budget` tokens with a newline between each two: one
    that would pass it is skipped and the shorter ones after it are still tried, as recall's own context
    does (recall/context.py), so the raw-turn baseline is cut by the service's rule."""
    chosen: list[int] = []
    total = 0
    for n, cost in enumerate(costs):
        if total + cost + (1 if chosen else 0) <= budget:
            total += cost + (1 if chosen else 0)
            chosen.append(n)
    return chosen


def _recall_of(covered: set[str], gold: list[str]) -> float:
    wanted = set(gold)
    return len(covered & wanted) / len(wanted) if wanted else 0.0


def line_scores(
    lines: list[tuple[list[str], str]], gold: list[str], counter: TokenCounter, reader_budget: int | None = None
) -> tuple[dict[str, float], str]:
    """Budgeted evidence recall of ranked lines cut by `fits` (the raw-turn baseline): at each of BUDGETS,
    over all lines (`recall@all`), lines that fit and mean tokens per line; and the reader's context."""
    costs = [counter.count(line) for _, line in lines]
    scores: dict[str, float] = {}
    for budget in BUDGETS:
        chosen = fits(costs, budget)
        scores[f"recall@{budget}tok"] = _recall_of({d for i in chosen for d in lines[i][0]}, gold)
        scores[f"items@{budget}tok"] = float(len(chosen))
    scores["recall@all"] = _recall_of({d for dias, _ in lines for d in dias}, gold)
    scores["tokens_per_item"] = statistics.fmean(costs) if costs else 0.0
    shown = fits(costs, reader_budget) if reader_budget else []
    return scores, "\n".join(lines[i][1] for i in shown)


def service_scores(
    ask: Callable[[int], dict[str, Any]],
    memory_to_dia: dict[str, str],
    gold: list[str],
    reader_budget: int | None = None,
) -> tuple[dict[str, float], str]:
    """Budgeted evidence recall as an agent gets it: recall asked with `max_tokens` = B (`ask(B)`), its
    context assembled by the service within B, and the turns of the items that context holds (facts by
    provenance) scored; the API's largest budget (every item of k) gives recall@all and tokens per item."""
    scores: dict[str, float] = {}
    estimated = 0
    for budget in BUDGETS:
        answer = ask(budget)
        scores[f"recall@{budget}tok"] = _recall_of(set(ranked_dia_ids(answer["items"], memory_to_dia)), gold)
        scores[f"items@{budget}tok"] = float(len(answer["items"]))
        estimated += answer.get("token_counter") == "estimate"
    scores["counted_by_estimate"] = estimated / len(BUDGETS)  # the service's tokenizer was late: fewer fit
    everything = ask(ALL_TOKENS)
    scores["recall@all"] = _recall_of(set(ranked_dia_ids(everything["items"], memory_to_dia)), gold)
    items = len(everything["items"])
    scores["tokens_per_item"] = (everything["tokens"] or 0) / items if items else 0.0
    return scores, (ask(reader_budget)["context"] if reader_budget else "")


def turn_line(conv: Conversation, turn: Turn) -> str:
    """A raw turn as recall's context would show its passage: `[YYYY-MM-DD agent] <saved text>`; the date is
    the session's (saved as occurred_at), else today's (the save date)."""
    said = session_time(turn.date)
    day = said[:10] if said else datetime.now(UTC).strftime("%Y-%m-%d")
    return f"[{day} {agent_id_for(conv.sample_id)}] {turn_text(turn)}"


def baseline_budget(
    conversations: list[Conversation], rows: list[dict[str, Any]], counter: TokenCounter, reader_budget: int | None
) -> None:
    """The raw-turn baseline's rows get the same budgeted scores from their ranked turns (`ranked`, removed)."""
    lines = {(c.sample_id, t.dia_id): turn_line(c, t) for c in conversations for t in c.turns}
    for row in rows:
        ranked = row.pop("ranked")
        extra, context = line_scores(
            [([dia], lines[(row["sample_id"], dia)]) for dia in ranked], row["evidence"], counter, reader_budget
        )
        row["scores"].update(extra)
        row["reader_context"] = context


@dataclass
class BudgetRun:
    """What one eval run measures beyond recall@k: budgeted recall when `counter` is set (else `note` says
    why not), and the reader's answers from the context within `reader_budget` when `answers` is set."""

    counter: TokenCounter | None
    note: str | None = None
    reader_budget: int | None = None
    answers: Answers | None = None
    about: dict[str, Any] = field(default_factory=dict)  # the reader and the judge, named

    def answer(self, rows: dict[str, list[dict[str, Any]]], conversations: list[Conversation]) -> dict[str, Any] | None:
        if self.answers is None or self.counter is None:
            return None
        return self.answers(rows, conversations)

    def close(self) -> None:
        if self.counter is not None:
            self.counter.close()

    def describe(self) -> dict[str, Any]:
        return {
            "budgets_tokens": list(BUDGETS),
            "k": BUDGET_K,
            "tokenizer": f"{self.counter.url}/tokenize" if self.counter else None,
            "note": self.note,
            "rule": "recall asked with max_tokens=B: the context the service assembles within B; the raw-turn "
            "baseline's turns rendered as passage lines, in rank order, a line that would pass B skipped",
            "reader_budget_tokens": self.reader_budget,
            **self.about,
        }
