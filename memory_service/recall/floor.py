"""The relevance floor: recall stops filling k with items that do not bear on the question.

Fused scores (`rank`) are ranks, not evidence: the 10th item of an unrelated question scores as the 10th
of a good one. Cosine similarity to the query is comparable across questions, and depends only on the
query and the item, never on any other team's data (the floor is per team by construction). So the floor
is an absolute cut on it, applied to every candidate before the top k are picked.

An item the keyword leg found also stays when it holds a share of the query's weighted words
(`KEYWORD_COVERAGE`, the weights `words.term_weights` gives them), as an exact name, id or number does
whatever its cosine; that is how an item without a similarity is judged at all (a keyword hit below the
vector pool, or a text saved a moment ago and not embedded yet).

Chosen on the LoCoMo dev conversations conv-26 and conv-30 (raw turns as passages, no facts; MiniLM; k=10;
`python -m memory_service.evals.relevance_floor`), reported on conv-41, -42 and -43 (529 questions):
- the similarity cut alone cost no recall up to 0.25; what cost recall was dropping keyword-only hits
  (all of them, on conv-26: recall@10 0.686 -> 0.636), so they are judged by their words: a quarter of
  the weight kept recall whole, and nearly all keyword hits of the 30 out-of-domain questions
  (`evals/out_of_domain`) hold less than that;
- 0.25 is the highest floor with no recall lost on the choosing conversations (0.30 lost 0.004). On the
  others: recall@10 0.7101 -> 0.7092, items for an out-of-domain question 10 -> 0.84 (83% get none);
- keeping a keyword hit by its words whether or not it has a similarity measured the same as judging only
  those without one (both splits, both figures), and keeps an id query whose cosine is low;
- a cut relative to the best hit (best - 0.2) lost 0.013 recall@10 and left out-of-domain answers as they
  were: not used.
A caller who wants every hit passes min_score=-1; any other min_score is the caller's own cut instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from .rank import Hit

DEFAULT_FLOOR = 0.25  # cosine similarity; chosen on dev conversations (module docstring)
OFF = -1.0  # min_score (or MEMORY_RECALL_FLOOR) at the bottom of cosine's range: nothing is cut
# a keyword-only hit (no similarity) holding this share of the query's word weight passes the floor
KEYWORD_COVERAGE = 0.25


@dataclass(frozen=True)
class Cut:
    """What a recall cuts: the caller's min_score (similarity only, as the API always did), else the floor."""

    threshold: float
    is_floor: bool

    @classmethod
    def of(cls, min_score: float | None, floor: float) -> Cut:
        return cls(floor, True) if min_score is None else cls(min_score, False)

    @property
    def off(self) -> bool:
        return self.threshold <= OFF

    def keeps(self, hit: Hit) -> bool:
        if self.off:
            return True
        if hit.similarity is not None and hit.similarity >= self.threshold:
            return True
        # the caller's cut is on similarity alone (an item without one is dropped, as before); the floor also
        # keeps what holds the query's words: an id or a name MiniLM hardly embeds
        return self.is_floor and hit.coverage is not None and hit.coverage >= KEYWORD_COVERAGE


def note(dropped: int, shown: int, floor: float) -> str:
    """The answer's one line when the floor left out hits that would have filled k."""
    if shown:
        return (
            f"{dropped} weaker hit(s) below the relevance floor (similarity {floor:g}) dropped; "
            f"pass min_score={OFF:g} to see them"
        )
    return (
        f"nothing above the relevance floor (similarity {floor:g}); {dropped} weaker hit(s) dropped; "
        f"pass min_score={OFF:g} to see them"
    )
