"""Repetition loops: a reply that has started to repeat itself verbatim, caught on the stream.

Why: at temperature 0 a small model that falls into a loop repeats the same span of text exactly, token
for token, until the output cap. Every token after the second copy is wasted time on a busy slot, and the
reply ends cut with nothing new in it. Greedy decoding makes the repetition exact, so the test is exact:
the reply's tail is periodic, several copies of one span back to back, over a stretch longer than
anything a normal answer repeats.

It is general, not tuned to one text: a list of facts drawn from log lines, a table, chat lines or notes
repeats its *structure* (a prefix, a date, a speaker's name) with different content in between, so its
tail is never periodic over `min_chars`; only a span copied whole, again and again, is.
"""

from __future__ import annotations

from dataclasses import dataclass

# A loop is at least this many characters of back-to-back copies: no normal sentence or fact repeats this
# much verbatim (a run of 120 identical characters, or 3 copies of a 40-character clause in a row).
MIN_LOOP_CHARS = 120
MIN_COPIES = 3
# Longest span looked for: a whole fact of MEMORY_MAX_FACT_CHARS (300) and its separator, repeated.
MAX_PERIOD = 400
# llama.cpp's DRY sampler (it penalises extending a sequence already seen): the last resort for a smallest piece
# that looped before any fact. Not on every call: it also penalises copying the text, which facts do
# (measured in docs/extraction.md).
ANTI_LOOP = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2}


@dataclass(frozen=True)
class Loop:
    """The repeated span (`period` characters) and how many characters of copies the tail holds."""

    period: int
    chars: int
    span: str

    def describe(self) -> str:
        return f"{self.chars // self.period} copies of a {self.period}-char span {self.span[:60]!r}"


def find_loop(
    text: str, *, min_chars: int = MIN_LOOP_CHARS, min_copies: int = MIN_COPIES, max_period: int = MAX_PERIOD
) -> Loop | None:
    """The loop `text` ends in, if any: its last `max(min_chars, min_copies * p)` characters have period `p`.

    The shortest such period is reported. Cheap enough to run on every streamed token: a candidate period
    is compared only when the character one period back equals the last one.
    """
    n = len(text)
    if n < min_chars:
        return None
    last = text[-1]
    for period in range(1, min(max_period, n // min_copies) + 1):
        if text[n - 1 - period] != last:
            continue
        need = max(min_chars, min_copies * period)
        if need > n:
            break
        region = text[n - need :]
        if region[period:] == region[:-period]:
            return Loop(period, _periodic_length(text, period), text[n - period :])
    return None


def _periodic_length(text: str, period: int) -> int:
    """How far back from the end `text` keeps the period (for the record: the characters the loop cost)."""
    i = len(text) - 1 - period
    while i >= 0 and text[i] == text[i + period]:
        i -= 1
    return len(text) - 1 - i


def _answer(text: str) -> str:
    """The part of a reply that is its answer: a `<think>` block is not watched (a model that thinks with
    thinking off is its own failure, which the parser and the thinking check explain)."""
    if not text.lstrip()[:7].lower().startswith("<think>"):
        return text
    end = text.lower().rfind("</think>")
    return "" if end < 0 else text[end + len("</think>") :]


class LoopGuard:
    """Fed a reply as it streams in; says when its answer has fallen into a loop (then the caller stops reading)."""

    def __init__(self, *, min_chars: int = MIN_LOOP_CHARS, check_every: int = 8) -> None:
        self.min_chars = min_chars
        self.check_every = check_every  # characters between checks: a loop is caught within a few tokens
        self._parts: list[str] = []
        self._chars = 0
        self._checked = 0
        self.loop: Loop | None = None

    def feed(self, piece: str) -> Loop | None:
        if not piece or self.loop is not None:
            return self.loop
        self._parts.append(piece)
        self._chars += len(piece)
        if self._chars - self._checked >= self.check_every and self._chars >= self.min_chars:
            self._checked = self._chars
            text = "".join(self._parts)
            self._parts = [text]
            self.loop = find_loop(_answer(text), min_chars=self.min_chars)
        return self.loop
