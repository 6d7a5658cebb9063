"""Two facts of one save that give one subject's attribute two values: the later line wins, and it is said.

"The standup moved to 10:00." then "The standup moved to 10:30." in one ops log are an update, not two
truths; storing both leaves recall to pick one at random. Across saves, dedup already supersedes a fact by
a newer one of the same shape (pipeline/dedup.py); within one save there is no "newer" but the source's
order, so the fact whose span comes later wins and the earlier is not stored, and the job's report lists
each pair (`extraction.conflicts`). Two facts conflict when
- they have the same shape and differ in their last value number only (grounding.shape; numbers that name
  things, such as "ticket 12", or an earlier number, "Crate 1 ... shelf 3" / "Crate 2 ... shelf 6", make
  them facts about different things, not a conflict); or
- they say "<subject and attribute> is/was/are/were <value>" with the same words up to the verb (at least
  two words before it: "Dana's role is", not "Dana is", which may hold many things) and a different short
  value ("Dana's role is lead." / "Dana's role is manager.").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..contract.text import normalize
from .grounding import GroundedFact, identifiers, numbers, shape
from .guard import reads_nothing_on_error

_COPULA = re.compile(r"^(?P<key>(?:\S+ ){2,}?(?:is|was|are|were|is now|was set to|moved to|changed to)) (?P<value>.+)$")
MAX_VALUE_WORDS = 4


@dataclass
class Conflicts:
    facts: list[GroundedFact]  # the facts to store, in their order
    pairs: list[dict[str, str]]  # {"kept": later fact, "superseded": earlier fact}


def _key(fact: GroundedFact) -> tuple[str, str] | None:
    """(what the fact is about, its value), or None when it states no single value."""
    norm = normalize(fact.text)
    if numbers(fact.text) and shape(norm) != norm:
        # the value is the last number; the ones before it say which thing ("Crate 1 ... shelf 3" and
        # "Crate 2 ... shelf 6" are two crates, "Crate 1 ... shelf 4" moves the first)
        values = [t for t, masked in zip(norm.split(), shape(norm).split()) if masked == "#"]
        return "shape:" + shape(norm) + "|" + " ".join(identifiers(norm) + values[:-1]), norm
    match = _COPULA.match(norm)
    if match and len(match.group("value").split()) <= MAX_VALUE_WORDS:
        return "copula:" + match.group("key"), match.group("value")
    return None


@reads_nothing_on_error(lambda facts: Conflicts(list(facts), []))  # unread: every fact is stored
def resolve_conflicts(facts: list[GroundedFact]) -> Conflicts:
    """`facts` without the earlier of each conflicting pair (by where in the source it rests)."""
    order = sorted(range(len(facts)), key=lambda i: (facts[i].spans[0][0] if facts[i].spans else 0, i))
    latest: dict[str, tuple[int, str]] = {}
    dropped: dict[int, int] = {}  # earlier index -> the later one that wins
    for index in order:
        found = _key(facts[index])
        if found is None:
            continue
        key, value = found
        if key in latest and latest[key][1] != value:
            dropped[latest[key][0]] = index
        latest[key] = (index, value)
    pairs = [{"kept": facts[later].text, "superseded": facts[earlier].text} for earlier, later in dropped.items()]
    return Conflicts([f for i, f in enumerate(facts) if i not in dropped], pairs)
