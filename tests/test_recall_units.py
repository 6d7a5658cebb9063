"""Rank fusion and diversification, on hand-made hits (pure functions)."""

from __future__ import annotations

from memory_service.recall import Hit, diversify
from memory_service.storage.journal import fts_query


def _hit(key: str, memory: str, score: float, kind: str = "fact") -> Hit:
    return Hit(key=key, kind=kind, text=key, memory_id=memory, fact_id=key if kind == "fact" else None, score=score)


def test_siblings_support_each_other_and_repeats_make_room_for_other_sources():
    hits = [
        _hit("m1-fact-a", "m1", 0.030), _hit("m1-fact-b", "m1", 0.029), _hit("m1-passage", "m1", 0.028, "passage"),
        _hit("m2-passage", "m2", 0.027, "passage"), _hit("m3-fact", "m3", 0.010),
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


def test_keyword_query_is_quoted_and_skips_stopwords():
    assert fts_query('what is the "quota" OR NEAR(email)') == '"quota" OR "near" OR "email"'
    assert fts_query("the of and") is None
