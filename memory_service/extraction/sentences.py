"""Where sentences end: at . ! ? before a space or the end, and at every line break; never inside an email,
a URL, a number, a version or an abbreviation.

The old rule cut at every "." (an email address fell apart in the console's span view, "v1.2.3" in three).
A mark ends a sentence only when whitespace or the end follows it (with closing quotes and brackets in
between), so "alice@example.com", "https://x.io/a.b?c=1", "1.50" and "1.2.3" stay whole. A "." also does not
end one before a lower-case word ("e.g. the", "approx. five") or after a title or an initial ("Dr. Smith",
"J. R. Tolkien"). A line break always ends one: chat lines, log lines and list items are statements of
their own.

pysbd (0.3.4, the maintained-looking choice on PyPI) was measured first: it splits "https://x.com/a.b?x=1"
at its "?", takes 26 ms for a three-line text on this CPU, and has had no release since 2021; these rules
take microseconds and are tested on every case above (tests/test_sentences.py).
"""

from __future__ import annotations

import re

from .guard import reads_nothing_on_error

# a run of end marks, then closing quotes/brackets, then whitespace or the end of the text
_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)")
# words after which a "." is part of the word: titles, common abbreviations (compared in lower case)
ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx dept est fig no nos vol pp ca inc ltd co corp
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun""".split()
)
_WORD_BEFORE = re.compile(r"(\S+)$")


def _ends_sentence(text: str, mark: re.Match[str]) -> bool:
    """Whether the end marks at `mark` close a sentence (see the module's docstring)."""
    if "." not in mark.group() or any(c in mark.group() for c in "!?…"):
        return True
    after = text[mark.end() :].lstrip(" \t")
    if after[:1].islower():
        return False  # "e.g. the", "approx. five", "3 p.m. today"
    word = _WORD_BEFORE.search(text, 0, mark.start())
    if word is None:
        return True
    token = word.group(1).lstrip("\"'([").lower()
    if token in ABBREVIATIONS or token.rstrip(".") in ABBREVIATIONS:
        return not after  # a title or an abbreviation; the last word of a text still ends it
    return not (len(token) == 1 and token.isalpha() and word.group(1)[-1:].isupper() and after)


@reads_nothing_on_error(lambda text: [(0, len(text))] if text.strip() else [])
def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text`, surrounding whitespace left out, in order."""
    spans: list[tuple[int, int]] = []
    for line in re.finditer(r"[^\n]+", text):
        start = line.start()
        for mark in _END.finditer(text, line.start(), line.end()):
            if _ends_sentence(text[: line.end()], mark):
                spans.append((start, mark.end()))
                start = mark.end()
        spans.append((start, line.end()))
    out = []
    for start, end in spans:
        piece = text[start:end]
        stripped = piece.strip()
        if stripped:
            begin = start + len(piece) - len(piece.lstrip())
            out.append((begin, begin + len(stripped)))
    return out


def sentences(text: str) -> list[str]:
    """The sentences of `text`, as `sentence_spans` finds them."""
    return [text[start:end] for start, end in sentence_spans(text)]
