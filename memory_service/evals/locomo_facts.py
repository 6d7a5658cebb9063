"""Fact precision and recall against LoCoMo's observations: would a person sign what extraction stored?

LoCoMo's annotators wrote, per session, statements about each speaker, each citing the turn it comes from
(`observation`). They are a silver standard: a fact extracted from a turn is matched one to one with an
observation citing the same turn when their token F1 (reader.token_f1, LoCoMo's normalisation) is at least
MATCH_F1, best pairs first. Precision is the share of stored facts matched, recall the share of
observations matched. Silver, not gold: a true fact the annotators did not write down counts against
precision, so the figure is for comparing two extractions of the same turns, not an absolute.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from .reader import token_f1

MATCH_F1 = 0.5


def match(facts: Iterable[tuple[str, str]], observations: Iterable[tuple[str, str]]) -> dict[str, float | int]:
    """`facts` and `observations` as (text, dia_id); matched one to one within each turn, best F1 first."""
    by_turn: dict[str, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    n_facts = n_observations = 0
    for text, dia_id in facts:
        by_turn[dia_id][0].append(text)
        n_facts += 1
    for text, dia_id in observations:
        by_turn[dia_id][1].append(text)
        n_observations += 1
    matched = 0
    for mine, theirs in by_turn.values():
        pairs = sorted(((token_f1(f, o), i, j) for i, f in enumerate(mine) for j, o in enumerate(theirs)), reverse=True)
        used_f: set[int] = set()
        used_o: set[int] = set()
        for f1, i, j in pairs:
            if f1 < MATCH_F1:
                break
            if i not in used_f and j not in used_o:
                used_f.add(i)
                used_o.add(j)
                matched += 1
    return {
        "facts": n_facts,
        "observations": n_observations,
        "matched": matched,
        "precision": round(matched / n_facts, 4) if n_facts else 0.0,
        "recall": round(matched / n_observations, 4) if n_observations else 0.0,
    }
