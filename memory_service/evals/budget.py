"""Evidence recall within a context budget: how much of the evidence fits in what an agent can spare.

An agent on a 4B model in an 8-16k context pastes a few hundred tokens of memory, so recall@k alone says
little: ten long turns may not fit where ten short facts do. For each question the eval asks /v1/recall
once more with k = BUDGET_K and reads the `context` it answers (one dated, attributed line per item, a
source said once: recall/context.py), so each item is measured as the agent receives it. Lines are taken
in rank order until the next would pass B tokens (each line's own count, plus one per separating newline),
counted by the default model's tokenizer (llama-server's /tokenize); the turns those lines stand for are
scored against the question's evidence. The raw-turn baseline's turns are rendered the same way.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from .locomo_data import Conversation, Turn, agent_id_for, session_time, turn_text
from .locomo_metrics import ranked_dia_ids

BUDGETS = (256, 512, 1024)
BUDGET_K = 100  # items asked for the budgeted context: more than 1,024 tokens of the shortest facts


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


def item_lines(items: list[dict[str, Any]], context: str) -> list[tuple[dict[str, Any], str]]:
    """Each item that has a line in `context`, with that line, in rank order. The service leaves out an item
    whose source an earlier line already says, so an item owns the next line exactly when the line ends with
    its (whitespace-collapsed) text; a line owned by no item means the layouts disagree, and is refused."""
    lines = context.split("\n") if context else []
    out: list[tuple[dict[str, Any], str]] = []
    for item in items:
        if len(out) < len(lines) and lines[len(out)].endswith("] " + " ".join(str(item["text"]).split())):
            out.append((item, lines[len(out)]))
    if len(out) != len(lines):
        raise ValueError(f"recall's context has {len(lines)} lines but only {len(out)} match its items in order")
    return out


def fits(costs: list[int], budget: int) -> int:
    """How many lines, in rank order, fit in `budget` tokens with a newline between each two: the first
    that would pass it ends the context (the issue's rule: items in rank order until B is reached)."""
    total = 0
    for n, cost in enumerate(costs):
        total += cost + (1 if n else 0)
        if total > budget:
            return n
    return len(costs)


def budget_scores(
    lines: list[tuple[list[str], str]], gold: list[str], counter: TokenCounter, reader_budget: int | None = None
) -> tuple[dict[str, float], str]:
    """Budgeted evidence recall at each of BUDGETS, over all lines (`recall@all`), items that fit and mean
    tokens per item; and the context an agent (the reader) would get within `reader_budget`."""
    costs = [counter.count(line) for _, line in lines]
    wanted = set(gold)

    def recall_of(n: int) -> float:
        covered = {dia for dias, _ in lines[:n] for dia in dias}
        return len(covered & wanted) / len(wanted) if wanted else 0.0

    scores: dict[str, float] = {}
    for budget in BUDGETS:
        n = fits(costs, budget)
        scores[f"recall@{budget}tok"] = recall_of(n)
        scores[f"items@{budget}tok"] = float(n)
    scores["recall@all"] = recall_of(len(lines))
    scores["tokens_per_item"] = statistics.fmean(costs) if costs else 0.0
    shown = fits(costs, reader_budget) if reader_budget else 0
    return scores, "\n".join(line for _, line in lines[:shown])


def service_lines(answer: dict[str, Any], memory_to_dia: dict[str, str]) -> list[tuple[list[str], str]]:
    """A /v1/recall answer's context lines, each with the turns its item stands for (facts by provenance)."""
    return [
        (ranked_dia_ids([item], memory_to_dia), line) for item, line in item_lines(answer["items"], answer["context"])
    ]


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
        extra, context = budget_scores(
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
            "rule": "recall's context lines in rank order until the next would pass B tokens (each line's "
            "count plus 1 per separating newline); the raw-turn baseline's turns rendered as passage lines",
            "reader_budget_tokens": self.reader_budget,
            **self.about,
        }
