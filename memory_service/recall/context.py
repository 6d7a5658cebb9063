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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..contract.text import normalize
from .rank import Hit
from .words import stem, stems

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
    kept: list[int]  # ranks (indexes into the hits) of the items said in `text`, in the order it says them
    tokens: int | None = None
    counter: str | None = None  # "model" or "estimate"; None without a budget


@dataclass
class Piece:
    """One hit's share of the context: a new line (`[YYYY-MM-DD agent] text`), or a fact added to the line
    of an earlier fact from the same saved text (`; text`), said under that line's attribution once."""

    rank: int  # the hit's index in the ranked hits
    line: int  # the line it is on: the index of that line's first piece
    text: str  # as it appears in the context, without the newline before a line

    @property
    def starts_line(self) -> bool:
        return self.line == self.rank


SAID_APART = "\x00"  # between two pieces' texts in the one string searched for repeats (a NUL in a text: a space)
JOIN = "; "  # between two facts of one saved text on one line, unless the first ends a sentence


def _collapse(text: str) -> str:
    """One line: every whitespace run a single space."""
    return " ".join(text.split())


_DIGIT_WORD = re.compile(r"[0-9a-z']*[0-9][0-9a-z']*")


def _says(text: str) -> frozenset[str]:
    """What a text says, for near-duplicates: its content words' stems, and each word with a digit whole and
    counted ("8#2": its second "8"), so "depot 7" and "depot 8" differ, and so does "8 May ... 8 friends"
    from "8 May ... 2 friends"."""
    words = normalize(text)
    out = {root for root in map(stem, words.split()) if root is not None}
    seen: dict[str, int] = {}
    for word in _DIGIT_WORD.findall(words):
        seen[word] = seen.get(word, 0) + 1
        out.add(f"{word}#{seen[word]}")
    return frozenset(out)


def pieces_of(hits: Sequence[Hit], occurred: dict[str, float], query: str = "", cheapest: bool = False) -> list[Piece]:
    """The hits as context, each source said once and as cheaply as it says what was asked.

    In rank order, a hit is left out when (1) its text, case and whitespace aside, equals or is part of an
    earlier piece's, or every word it says is in one earlier piece (a near-duplicate); (2) it is a passage
    whose facts are among the hits and hold every word of the query the passage holds (the date of the
    line counts as held): the facts say what was asked in fewer tokens, and take the passage's place;
    (3) it is a fact drawn from a saved text whose passage is said (the passage holds it). A passage
    holding a query word its facts lack (a detail they dropped) is said. Facts of one saved text share
    one line and its attribution. Dated by when the text tells it happened (`occurred` of its memory),
    else when it was saved; UTC. `cheapest`: every passage whose facts are among the hits is left out for
    them, whatever words it holds (the form `fitted` weighs against this one under a budget).
    """
    asked = stems(query)
    facts_from: dict[str, list[int]] = {}  # memory -> ranks of the fact hits drawn from it
    for rank, hit in enumerate(hits):
        if hit.kind == "fact":
            for memory in dict.fromkeys(hit.source_memory_ids or [hit.memory_id]):
                facts_from.setdefault(memory, []).append(rank)
    stood_for = {
        rank
        for rank, hit in enumerate(hits)
        if hit.kind == "passage"
        and (
            bool(facts_from.get(hit.memory_id))
            if cheapest
            else _facts_say_it(
                hit, [hits[i].text for i in facts_from.get(hit.memory_id, [])], asked, _when(hit, occurred)
            )
        )
    }
    said = ""  # every piece's folded text, each after SAID_APART
    said_words: list[frozenset[str]] = []  # what each piece says (`_says`)
    holding: dict[str, list[int]] = {}  # a word -> the pieces (indexes into `said_words`) that say it
    passages: set[str] = set()  # memories whose passage is said
    fact_lines: dict[str, int] = {}  # memory -> the line its facts are on
    ends: dict[int, str] = {}  # a fact line -> its last fact so far
    out: list[Piece] = []
    for rank in _in_place(hits, facts_from, stood_for):
        hit = hits[rank]
        body = _collapse(hit.text)
        folded = body.casefold().replace(SAID_APART, " ")
        if rank in stood_for or not folded or folded in said:  # said: one search, not one per piece
            continue
        words = _says(body)
        if words and any(
            words <= said_words[i] for i in holding.get(min(words, key=lambda w: len(holding.get(w, ()))), ())
        ):
            continue  # a near-duplicate: an earlier piece holding its rarest word says all it says
        if hit.kind == "fact" and any(m in passages for m in hit.source_memory_ids or [hit.memory_id]):
            continue
        for word in words:
            holding.setdefault(word, []).append(len(said_words))
        said += SAID_APART + folded
        said_words.append(words)
        if hit.kind == "passage":
            passages.add(hit.memory_id)
        elif hit.kind == "fact" and hit.memory_id in fact_lines:
            line = fact_lines[hit.memory_id]
            joint = " " if ends[line][-1:] in ".!?" else JOIN  # a sentence ends itself
            out.append(Piece(rank, line, joint + body))
            ends[line] = body
            continue
        elif hit.kind == "fact":
            fact_lines[hit.memory_id], ends[rank] = rank, body
        out.append(Piece(rank, rank, f"[{_when(hit, occurred):%Y-%m-%d} {hit.agent_id}] {body}"))
    return out


def _when(hit: Hit, occurred: dict[str, float]) -> datetime:
    return datetime.fromtimestamp(occurred.get(hit.memory_id, hit.created_at), tz=UTC)


def _facts_say_it(passage: Hit, facts: list[str], asked: frozenset[str], when: datetime) -> bool:
    """Whether these facts of the passage's text hold every query word the passage holds; the line's date
    ("July", "2023") is said by the line, so it counts as held."""
    if not facts:
        return False
    held = frozenset().union(*map(stems, facts)) | stems(when.strftime("%B %d %Y %A"))
    return not (stems(passage.text) & asked) - held


def _in_place(hits: Sequence[Hit], facts_from: dict[str, list[int]], stood_for: set[int]) -> list[int]:
    """Rank order, except that the facts standing for a left-out passage take its place (in their order)."""
    out: list[int] = []
    placed: set[int] = set()
    for rank, hit in enumerate(hits):
        for i in facts_from.get(hit.memory_id, []) if rank in stood_for else []:
            if i not in placed:
                placed.add(i)
                out.append(i)
        if rank not in placed:
            placed.add(rank)
            out.append(rank)
    return out


def _render(pieces: Sequence[Piece]) -> tuple[str, list[int]]:
    """The context's text, line by line (a line's pieces in rank order), and the ranks in that order."""
    lines: dict[int, list[Piece]] = {}
    for piece in pieces:
        lines.setdefault(piece.line, []).append(piece)
    text = SEPARATOR.join("".join(p.text for p in parts) for parts in lines.values())
    return text, [p.rank for parts in lines.values() for p in parts]


def unbudgeted(pieces: list[Piece]) -> Context:
    return Context(*_render(pieces))


async def fitted(
    hits: Sequence[Hit],
    occurred: dict[str, float],
    query: str,
    budget: int,
    tokenize: Tokenizer,
    timeout_s: float = TOKENIZE_TIMEOUT_S,
) -> Context:
    """The context within `budget` that says the most saved texts: the hits as ranked (`pieces_of`), or each
    text in its cheapest form (its facts among the hits instead of its passage), whichever fits more
    sources; a tie keeps the ranked form. A passage costs two or three of its facts' tokens, so a small
    budget filled in rank order says fewer sources than the facts could; a large one holds both forms'
    sources and keeps the passages' detail. Counts nothing about the text's shape, only sources and tokens.
    Both forms are counted in one /tokenize call and only the chosen one is counted again: the second form
    costs its assembly and the few texts it adds to the count."""
    ranked = pieces_of(hits, occurred, query)
    cheap = pieces_of(hits, occurred, query, cheapest=True)
    forms = [ranked] if [p.text for p in cheap] == [p.text for p in ranked] else [ranked, cheap]
    return await budgeted(forms, budget, tokenize, timeout_s, lambda chosen: _sources(hits, chosen))


def _sources(hits: Sequence[Hit], ranks: Iterable[int]) -> int:
    """How many saved texts these hits say something of."""
    return len({m for rank in ranks for m in (hits[rank].source_memory_ids or [hits[rank].memory_id])})


async def budgeted(
    forms: list[list[Piece]],
    budget: int,
    tokenize: Tokenizer,
    timeout_s: float = TOKENIZE_TIMEOUT_S,
    worth: Callable[[list[int]], int] = len,
) -> Context:
    """Of each form (a list of pieces), the pieces in order that fit in `budget` tokens together with their
    line separators; a piece that does not fit is skipped and the shorter ones after it are still tried (a
    fact whose line was skipped is skipped with it). The form whose fitted ranks are `worth` most is
    answered (a tie: the first). By the model's tokenizer when it answers within `timeout_s`
    (MEMORY_RECALL_TOKENIZE_TIMEOUT_S), else by `estimate_tokens`."""
    forms = [f for f in forms if f]
    if not forms:
        return Context("", [], 0, "estimate")  # nothing to count: the model is not asked
    try:
        async with asyncio.timeout(timeout_s):
            counted = await _by_model(forms, budget, tokenize, worth)
        if counted is not None:
            return counted
    except Exception:  # down, slow or odd: the estimate answers instead; recall never fails on it
        pass
    # a line with its separator; the last line has none
    fits = [_greedy(f, [estimate_tokens(p.text) + (1 if p.starts_line else 0) for p in f], budget + 1) for f in forms]
    best = _best(forms, fits, worth)
    text, kept = _render([forms[best][i] for i in fits[best]])
    return Context(text, kept, estimate_tokens(text), "estimate")


def _best(forms: list[list[Piece]], fits: list[list[int]], worth: Callable[[list[int]], int]) -> int:
    """The form whose fitted pieces' ranks are worth most; the first of equals."""
    values = [worth([forms[n][i].rank for i in fit]) for n, fit in enumerate(fits)]
    return values.index(max(values))


def _greedy(
    pieces: list[Piece], costs: list[int], budget: int, left_out: set[int] | frozenset[int] = frozenset()
) -> list[int]:
    chosen: list[int] = []
    lines: set[int] = set()
    total = 0
    for i, (piece, cost) in enumerate(zip(pieces, costs, strict=True)):
        if i in left_out or not (piece.starts_line or piece.line in lines):
            continue
        if total + cost <= budget:
            chosen.append(i)
            lines.add(piece.line)
            total += cost
    return chosen


async def _by_model(
    forms: list[list[Piece]], budget: int, tokenize: Tokenizer, worth: Callable[[list[int]], int]
) -> Context | None:
    """Count every piece of every form in one /tokenize call (each token belongs to the piece its text starts
    in; a text in both forms is counted once), choose the form, then count its chosen text itself; while a
    merge across a boundary makes it exceed, leave out the last piece chosen and choose again (the pieces
    after it are tried again)."""
    texts = list(dict.fromkeys(p.text for form in forms for p in form))  # the forms share most of their pieces
    joined = SEPARATOR.join(texts) + SEPARATOR
    counted_pieces = await tokenize(joined)
    if counted_pieces is None:
        return None
    cost_of = dict(zip(texts, _costs_per_line(joined, counted_pieces, texts), strict=True))
    costs = [[cost_of[p.text] for p in form] for form in forms]
    # a continuation is counted here with a separator it will not have: it never under-counts
    best = _best(forms, [_greedy(f, c, budget + 1) for f, c in zip(forms, costs, strict=True)], worth)
    pieces = forms[best]
    left_out: set[int] = set()
    while True:
        chosen = _greedy(pieces, costs[best], budget + 1, left_out)  # each cost counts its separator
        text, kept = _render([pieces[i] for i in chosen])
        counted = await tokenize(text) if text else []
        if counted is None:
            return None
        if len(counted) <= budget:
            return Context(text, kept, len(counted), "model")
        left_out.add(chosen[-1])


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
