"""Which facts are consolidated together: by agent and subject, newest subjects first, in small parts.

The subject is read from the fact's own words (its leading name: "Caroline attends ..." -> "Caroline"),
not asked of the model: grouping must be cheap, deterministic and the same after a restart, so that a
group whose facts did not change is recognised by its digest and not written again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ..storage.consolidation import SourceFact

GROUP_MAX_FACTS = 8  # facts per consolidated item: a short prompt and a short answer
MIN_FACTS = 2  # a subject with one fact has nothing to consolidate

_LEADING = re.compile(r"^((?:[A-Z][\w\-]*)(?:\s+[A-Z][\w\-]*){0,2})(?:'s|’s)?\b")
# capitalised words that start sentences without naming anyone
_NOT_SUBJECTS = frozenset(
    "a an the this that these those it its he she they we i you his her their our my your there here "
    "when while after before if on in at for to from with by as and but or so then also both each every "
    "some many most one two three yesterday today tomorrow last next".split()
)


def subject_of(text: str) -> str | None:
    """The name a fact begins with ("Caroline", "John Smith", "User"), or None when it begins otherwise."""
    match = _LEADING.match(text.strip())
    if match is None:
        return None
    words = match.group(1).split()
    while words and words[-1].lower() in _NOT_SUBJECTS:
        words.pop()
    if not words or words[0].lower() in _NOT_SUBJECTS:
        return None
    return " ".join(words)


@dataclass
class Group:
    team: str
    agent_id: str
    subject: str
    part: int
    facts: list[SourceFact]

    @property
    def id(self) -> str:
        key = f"{self.team}\x00{self.agent_id}\x00{self.subject.lower()}\x00{self.part}"
        return "c:" + hashlib.sha256(key.encode()).hexdigest()[:32]

    @property
    def digest(self) -> str:
        """What the item is written from: its facts and their sources (a new source refreshes it too)."""
        parts = sorted(f"{f.id}:{','.join(sorted(f.memory_ids))}:{f.text}" for f in self.facts)
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]

    @property
    def newest(self) -> float:
        return max(f.created_at for f in self.facts)


def group_facts(team: str, facts: list[SourceFact]) -> list[Group]:
    """Subjects with at least `MIN_FACTS` facts, oldest fact first within a subject, cut into parts of at
    most `GROUP_MAX_FACTS` (a lone last fact joins the part before it, so new facts mostly change only the
    last part); groups with the newest facts come first."""
    by_subject: dict[tuple[str, str], list[SourceFact]] = {}
    names: dict[tuple[str, str], str] = {}
    for fact in facts:
        subject = subject_of(fact.text)
        if subject is None:
            continue
        key = (fact.agent_id, subject.lower())
        by_subject.setdefault(key, []).append(fact)
        names.setdefault(key, subject)
    groups: list[Group] = []
    for key, members in by_subject.items():
        if len(members) < MIN_FACTS:
            continue
        members.sort(key=lambda f: (f.created_at, f.id))
        parts = [members[i : i + GROUP_MAX_FACTS] for i in range(0, len(members), GROUP_MAX_FACTS)]
        if len(parts) > 1 and len(parts[-1]) < MIN_FACTS:
            last = parts.pop()
            parts[-1] = parts[-1] + last
        groups += [Group(team, key[0], names[key], index, part) for index, part in enumerate(parts)]
    groups.sort(key=lambda g: g.newest, reverse=True)
    return groups
