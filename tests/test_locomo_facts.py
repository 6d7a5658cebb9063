"""Fact precision against LoCoMo's observations (issue 44): one-to-one within a turn, at token F1 >= 0.5."""

from __future__ import annotations

from memory_service.evals.locomo_facts import match
from memory_service.testbed.locomo_data import parse_conversation


def test_facts_match_observations_one_to_one_within_their_turn() -> None:
    observations = [("Ann adopted a dog named Rex.", "D1:1"), ("Ann works at an airline in Denver.", "D1:2")]
    facts = [
        ("Ann adopted a dog named Rex", "D1:1"),  # matched
        ("Ann adopted a dog called Rex", "D1:1"),  # a second rewording: the observation is taken
        ("Ann works at an airline in Denver", "D1:3"),  # the right words from the wrong turn
        ("Haha that was fun", "D1:2"),  # nothing a person noted
    ]
    assert match(facts, observations) == {
        "facts": 4,
        "observations": 2,
        "matched": 1,
        "precision": 0.25,
        "recall": 0.5,
    }
    assert match([], observations)["precision"] == 0.0 and match(facts, [])["recall"] == 0.0


def test_observations_are_read_with_the_turn_they_cite_and_malformed_ones_left_out() -> None:
    sample = {
        "sample_id": "s",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bob",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted Rex."}],
        },
        "qa": [],
        "observation": {
            "session_1_observation": {
                "Ann": [["Ann adopted Rex.", "D1:1"], ["Cites no turn of this conversation.", "D9:9"], "bad"],
                "Bob": None,
            }
        },
    }
    assert parse_conversation(sample).observations == [("Ann adopted Rex.", "D1:1")]
    assert parse_conversation({**sample, "observation": "garbage"}).observations == []
