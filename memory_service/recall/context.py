"""A recall's ready-to-paste `context`: one dated, attributed line per item, repeats left out, within a budget.

An agent on a small model pastes what recall found into a prompt it must keep short, so the service does the
counting: with `max_tokens`, the best items in rank order whose lines fit. Tokens are counted by the extraction
model's own tokenizer (llama-server's `/tokenize`, answered without a slot, so a busy server still answers:
5 ms median, 35 ms at most while it generated), within MEMORY_RECALL_TOKENIZE_TIMEOUT_S; when it is down or
slow, by `estimate_tokens`, a rule that over-counts.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .rank import Hit

TOKENIZE_TIMEOUT_S = 0.2  # both /tokenize calls of one recall together; then the estimate (the setting's default)
LETTERS_PER_TOKEN = 3  # a run of ASCII letters: at most this many per token in the estimate
SEPARATOR = "\n"

# pieces of the estimate: a run of ASCII letters, one digit, a run of whitespace, one other character
_PIECE = re.compile(r"[A-Za-z]+|[0-9]|\s+|.", re.DOTALL)
_VOWELS = re.compile(r"[AEIOUYaeiouy]")

# the token pieces of a text (string pieces, byte lists for part of a character), or None: no server is up
Tokenizer = Callable[[str], Awaitable[list[Any] | None]]


def estimate_tokens(text: str) -> int:
    """Tokens of `text` by a rule that over-counts what BPE tokenizers of English make of it.

    A run of ASCII letters counts ceil(len / 3) (a common word is one token, a rare one seldom more), one
    without a vowel ceil(2 * len / 3) (`xqzj`: 2-3 tokens); a digit 1 (Qwen and Llama 3 split numbers into
    digits or groups); one space 0 (it joins the next word's token), any other whitespace run 1; any other
    ASCII character 1; a non-ASCII character its UTF-8 bytes (a byte-level tokenizer never needs more).
    Additive over lines: a context counts its lines plus 1 per "\\n". On the dev data's 3,430 dated lines it
    over-counts the default model's tokenizer by 43% (1.00-1.82x a line), never under.
    """
    total = 0
    for match in _PIECE.finditer(text):
        piece = match.group()
        first = piece[0]
        if first.isascii() and first.isalpha():
            vowels = _VOWELS.search(piece) is not None  # without any, it is an abbreviation or a code: denser
            total += math.ceil(len(piece) / LETTERS_PER_TOKEN) if vowels else math.ceil(len(piece) * 2 / 3)
        elif first.isspace():
            total += 0 if piece == " " else 1
        else:
            total += len(piece.encode("utf-8", "surrogatepass"))  # a stored lone surrogate: 3 bytes, no error
    return total


@dataclass
class Context:
    text: str
    kept: list[int]  # ranks (indexes into the hits) of the items whose line is in `text`
    tokens: int | None = None
    counter: str | None = None  # "model" or "estimate"; None without a budget


def _collapse(text: str) -> str:
    """One line: every whitespace run a single space."""
    return " ".join(text.split())


def lines_of(hits: Sequence[Hit], occurred: dict[str, float]) -> list[tuple[int, str]]:
    """Each hit's line, `[YYYY-MM-DD agent] text`, in rank order, repeats left out (rank, line).

    Dated by when the text tells it happened (`occurred` of its memory), else when it was saved; UTC. A hit
    is left out when (1) its text, case and whitespace aside, equals or is part of an earlier line's text;
    (2) it is a passage of a saved text that an earlier fact line was drawn from; or (3) it is a fact drawn
    from a saved text whose passage is already a line. A fact is the distilled form of its source, so one of
    the two says it; the higher ranked is kept.
    """
    shown: list[str] = []
    passages: set[str] = set()  # memories whose passage is a line
    drawn_from: set[str] = set()  # memories that a fact line was drawn from
    out: list[tuple[int, str]] = []
    for rank, hit in enumerate(hits):
        body = _collapse(hit.text)
        folded = body.casefold()
        sources = hit.source_memory_ids or [hit.memory_id]
        if not folded or any(folded in earlier for earlier in shown):
            continue
        if hit.kind == "passage" and hit.memory_id in drawn_from:
            continue
        if hit.kind == "fact" and any(m in passages for m in sources):
            continue
        shown.append(folded)
        if hit.kind == "passage":
            passages.add(hit.memory_id)
        elif hit.kind == "fact":
            drawn_from.update(sources)
        when = occurred.get(hit.memory_id, hit.created_at)
        day = datetime.fromtimestamp(when, tz=UTC).strftime("%Y-%m-%d")
        out.append((rank, f"[{day} {hit.agent_id}] {body}"))
    return out


def unbudgeted(lines: list[tuple[int, str]]) -> Context:
    return Context(SEPARATOR.join(line for _, line in lines), [rank for rank, _ in lines])


async def budgeted(
    lines: list[tuple[int, str]], budget: int, tokenize: Tokenizer, timeout_s: float = TOKENIZE_TIMEOUT_S
) -> Context:
    """The lines, in rank order, that fit in `budget` tokens together with their separators; a line that does
    not fit is skipped and the shorter ones after it are still tried. By the model's tokenizer when it answers
    within `timeout_s` (MEMORY_RECALL_TOKENIZE_TIMEOUT_S), else by `estimate_tokens`."""
    if not lines:
        return Context("", [], 0, "estimate")  # nothing to count: the model is not asked
    try:
        async with asyncio.timeout(timeout_s):
            fitted = await _by_model(lines, budget, tokenize)
        if fitted is not None:
            return fitted
    except Exception:  # down, slow or odd: the estimate answers instead; recall never fails on it
        pass
    costs = [estimate_tokens(line) + 1 for _, line in lines]  # each with its separator
    chosen = _greedy(costs, budget + 1)  # the last line has no separator
    text = SEPARATOR.join(lines[i][1] for i in chosen)
    return Context(text, [lines[i][0] for i in chosen], estimate_tokens(text), "estimate")


def _greedy(costs: list[int], budget: int) -> list[int]:
    chosen, total = [], 0
    for i, cost in enumerate(costs):
        if total + cost <= budget:
            chosen.append(i)
            total += cost
    return chosen


async def _by_model(lines: list[tuple[int, str]], budget: int, tokenize: Tokenizer) -> Context | None:
    """Count every line in one /tokenize call (each token belongs to the line its piece starts in), choose,
    then count the chosen text itself and drop its last lines while a merge across a line end makes it exceed."""
    texts = [line for _, line in lines]
    joined = SEPARATOR.join(texts) + SEPARATOR
    pieces = await tokenize(joined)
    if pieces is None:
        return None
    costs = _costs_per_line(joined, pieces, texts)
    chosen = _greedy(costs, budget + 1)  # each cost counts its separator; the last line has none
    while True:
        text = SEPARATOR.join(texts[i] for i in chosen)
        counted = await tokenize(text) if text else []
        if counted is None:
            return None
        if len(counted) <= budget:
            return Context(text, [lines[i][0] for i in chosen], len(counted), "model")
        chosen.pop()


def _costs_per_line(joined: str, pieces: list[Any], texts: list[str]) -> list[int]:
    """Tokens per line with its separator: a string piece is found in the text from where the last ended; a
    byte piece (part of a character) belongs where the text stands."""
    ends, end = [], 0
    for text in texts:
        end += len(text) + len(SEPARATOR)
        ends.append(end)
    costs = [0] * len(texts)
    pos, line = 0, 0
    for piece in pieces:
        if isinstance(piece, str) and piece:
            found = joined.find(piece, pos)
            if found < 0:
                raise ValueError("a token piece is not in the text: the pieces cannot be placed")
            start, pos = found, found + len(piece)
        else:
            start = pos
        while line < len(texts) - 1 and start >= ends[line]:
            line += 1
        costs[line] += 1
    return costs
