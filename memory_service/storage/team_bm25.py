"""BM25 over one team's keyword candidates, every statistic taken from those candidates only.

FTS5's own `bm25()` weighs words by counts over the whole table, every team's rows: whether another team
stores a word changed this team's order and scores (a side channel: does team B hold this codename?). Here
the document frequencies and the average length are those of the candidates, all rows of the asking team
(at most `KEYWORD_MAX_RANKED`), so the order follows the team's own words and costs a regex per text.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence

K1 = 1.2  # BM25's usual constants (FTS5's too)
B = 0.75
SCORED_CHARS = 16_384  # a text's head that is scored: a long text costs no more than this (64 KiB max)


def word_prefixes(words: Sequence[str], stems: Sequence[tuple[str, ...]]) -> list[str]:
    """What a text's word must start with to count as each query word: the part the word shares with its
    index terms (porter stems: "deploy" -> "deploi" -> "deplo"), never shorter than 3 letters."""
    out = []
    for word, terms in zip(words, stems, strict=True):
        prefix = os.path.commonprefix([word, *terms]) if terms else word
        out.append(prefix if len(prefix) >= 3 else word)
    return out


def scores(prefixes: Sequence[str], texts: Sequence[str]) -> list[float]:
    """Each text's BM25 for the query words (as `word_prefixes`), idf and average length among `texts`."""
    if not texts or not prefixes:
        return [0.0] * len(texts)
    index = {p: i for i, p in enumerate(dict.fromkeys(prefixes))}
    alternatives = "|".join(re.escape(p) for p in sorted(index, key=len, reverse=True))
    pattern = re.compile(rf"(?<!\w)({alternatives})\w*")
    counts: list[list[int]] = []
    lengths: list[int] = []
    for text in texts:
        head = text[:SCORED_CHARS].lower()
        tf = [0] * len(index)
        for match in pattern.finditer(head):
            tf[index[match.group(1)]] += 1
        counts.append(tf)
        lengths.append(max(len(head), 1))
    n = len(texts)
    average = sum(lengths) / n
    df = [sum(1 for tf in counts if tf[i]) for i in range(len(index))]
    idf = [math.log(1.0 + (n - d + 0.5) / (d + 0.5)) for d in df]
    out = []
    for tf, length in zip(counts, lengths, strict=True):
        norm = K1 * (1.0 - B + B * length / average)
        out.append(sum(idf[i] * f * (K1 + 1.0) / (f + norm) for i, f in enumerate(tf) if f))
    return out
