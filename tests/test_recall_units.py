"""Rank fusion and diversification, on hand-made hits (pure functions)."""

from __future__ import annotations

from memory_service.recall.rank import Hit, diversify
from memory_service.storage.journal import fts_query


def _hit(key: str, memory: str, score: float, kind: str = "fact") -> Hit:
    return Hit(key=key, kind=kind, text=key, memory_id=memory, fact_id=key if kind == "fact" else None, score=score)


def test_siblings_support_each_other_and_repeats_make_room_for_other_sources():
    hits = [
        _hit("m1-fact-a", "m1", 0.030),
        _hit("m1-fact-b", "m1", 0.029),
        _hit("m1-passage", "m1", 0.028, "passage"),
        _hit("m2-passage", "m2", 0.027, "passage"),
        _hit("m3-fact", "m3", 0.010),
    ]
    ranked = diversify(hits, 4)
    keys = [h.key for h in ranked]
    assert keys[0] == "m1-fact-a"  # three matching items: the best supported source comes first
    assert keys.index("m2-passage") < keys.index("m1-passage")  # another source before a third rewording
    assert len(ranked) == 4 and "m3-fact" not in keys
    assert all(a.score >= b.score for a, b in zip(ranked, ranked[1:]))


def test_a_strong_sibling_still_beats_a_weak_other_source():
    hits = [_hit("m1-a", "m1", 0.05), _hit("m1-b", "m1", 0.05), _hit("m2-weak", "m2", 0.001)]
    assert [h.key for h in diversify(hits, 3)] == ["m1-a", "m1-b", "m2-weak"]


def _greedy(hits: list[Hit], k: int) -> list[tuple[str, float]]:
    """The specification of the pick: at each step scan everything for the best effective score, ties to the
    earlier in (score, similarity) order; an item whose text was shown n times keeps REPEAT_DECAY ** n."""
    from memory_service.recall.rank import REPEAT_DECAY

    remaining = sorted(hits, key=lambda h: (h.score, h.similarity or 0.0), reverse=True)
    shown: dict[str, int] = {}
    out = []
    while remaining and len(out) < k:
        best, best_score = 0, float("-inf")
        for i, h in enumerate(remaining):
            effective = h.score * REPEAT_DECAY ** shown.get(h.memory_id, 0)
            if effective > best_score:
                best, best_score = i, effective
        h = remaining.pop(best)
        shown[h.memory_id] = shown.get(h.memory_id, 0) + 1
        out.append((h.key, best_score))
    return out


def test_the_lazy_pick_equals_a_full_scan_on_every_draw():
    import copy
    import random

    from memory_service.recall.rank import SIBLING_SUPPORT

    rng = random.Random(7)
    for draw in range(300):
        n, memories = rng.randint(0, 60), rng.randint(1, 12)
        hits = [
            Hit(
                key=f"h{i}",
                kind="fact",
                text="",
                memory_id=f"m{rng.randrange(memories)}",
                fact_id=f"h{i}",
                score=rng.choice([0.01, 0.02, rng.random() / 30]),
                similarity=rng.choice([None, 0.5, rng.random()]),
            )
            for i in range(n)
        ]
        expected_input = copy.deepcopy(hits)
        per: dict[str, float] = {}
        for h in expected_input:
            per[h.memory_id] = per.get(h.memory_id, 0.0) + h.score
        for h in expected_input:
            h.score += SIBLING_SUPPORT * (per[h.memory_id] - h.score)
        k = rng.randint(1, 15)
        got = [(h.key, h.score) for h in diversify(hits, k)]
        assert got == _greedy(expected_input, k), draw


def test_keyword_query_is_quoted_and_skips_stopwords():
    assert fts_query('what is the "quota" OR NEAR(email)') == '"quota" OR "near" OR "email"'
    assert fts_query("the of and") is None


def test_a_query_word_most_candidates_hold_weighs_less_than_a_rare_one():
    from memory_service.recall.words import QueryWords
    from memory_service.recall.words import stems as _terms
    from memory_service.recall.words import term_weights as _term_weights

    texts = [f"Caroline talked about her day number {n}" for n in range(20)] + ["Caroline researched adoption agencies"]
    words = QueryWords("What did Caroline research?")
    query = words.terms
    weights = _term_weights(query, [words.held(text) for text in texts])
    name, topic = _terms("Caroline"), _terms("research")
    assert set(weights) == set(query) and abs(sum(weights.values()) - 1.0) < 1e-9
    assert sum(weights[t] for t in topic) > 5 * sum(weights[t] for t in name)
    # with no candidates to tell them apart, every word weighs the same
    even = _term_weights(query, [])
    assert len(set(round(w, 9) for w in even.values())) == 1


def test_the_query_words_a_text_holds_are_the_stems_both_share():
    """QueryWords searches a text for the query's stems; it must find exactly what splitting the text finds."""
    from memory_service.recall.words import QueryWords
    from memory_service.recall.words import stems as _terms

    query = "Did Caroline’s 2023 adoption research mention O'Brien, other agencies or the café?"
    texts = [
        "Caroline's adoption agencies: O’Brien & Partners (2023).",  # curly and straight apostrophes, a number
        "CAROLINE researched ADOPTIONS at the Café Noir",  # upper case, a longer word on a stem, non-ASCII
        "others mentioned the agency; otherwise nothing",  # "other" is a stopword, "others"/"otherwise" are not
        "Xcaroline and caro and 20235 and obrien",  # stems inside or beside other words, none held
        "ﬁnd the Caroline ﬁle",  # an NFKC ligature
        "",
    ]
    words = QueryWords(query)
    assert words.terms == _terms(query)
    for text in texts:
        assert words.held(text) == words.terms & _terms(text), text
    assert words.held(texts[0]) >= {"carol", "adopt", "agenc", "o'bri", "2023"}
    assert QueryWords("the of and").held("the of and") == frozenset()
