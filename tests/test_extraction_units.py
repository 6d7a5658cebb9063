"""Pure unit tests of the extraction pieces: parsing, grounding, sizing, prompt, output caps.

No server, no model: each test pins one rule that a failure seen in the field broke.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from memory_service.extraction.completion import ServerProps
from memory_service.extraction.errors import BadReply, TruncatedReply
from memory_service.extraction.extractor import Extractor
from memory_service.extraction.grounding import GroundedFact, ground, normalize, shape
from memory_service.extraction.parsing import parse_facts, salvage_facts, strip_thinking
from memory_service.extraction.prompt import SYSTEM_PROMPT, build_messages, facts_schema
from memory_service.extraction.sizing import TEMPLATE_MARGIN_TOKENS, plan_chunks, split_chars, text_budget
from memory_service.extraction.throughput import Throughput

FACTS = json.dumps({"facts": ["Alice lives in Lyon.", "The budget is 500 dollars."]})


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "content",
    [
        FACTS,
        f"```json\n{FACTS}\n```",
        f"<think>\nLet me see {{maybe}}.\n</think>\n\n{FACTS}",
        f"<think>\n\n</think>\n\n{FACTS}",  # Qwen3 with thinking off: an empty block first
        f"\n\n</think>\n\n{FACTS}",  # the template opened the block, the model only closed it
        f"<think>\nI will list the facts now.\n{FACTS}",  # unclosed think, JSON at the end
    ],
)
def test_parse_facts_strips_thinking_and_fences(content: str) -> None:
    assert parse_facts(content, "stop") == ["Alice lives in Lyon.", "The budget is 500 dollars."]


def test_unclosed_think_cut_at_the_cap_is_a_visible_error_not_an_empty_success() -> None:
    content = "<think>\nOkay, let me read the text carefully and decide which facts"
    with pytest.raises(BadReply, match="still thinking") as info:
        parse_facts(content, "length")
    assert info.value.raw_reply == content


def test_reasoning_only_reply_names_the_cause() -> None:
    with pytest.raises(BadReply, match="reasoning_content") as info:
        parse_facts("", "stop", reasoning="Let me think... " + FACTS)
    assert "[reasoning_content]" in (info.value.raw_reply or "")


def test_reasoning_content_is_never_used_as_output() -> None:
    assert parse_facts(FACTS, "stop", reasoning='{"facts": ["invented in the thought"]}') == [
        "Alice lives in Lyon.",
        "The budget is 500 dollars.",
    ]


@pytest.mark.parametrize(
    "content",
    [
        '<tool_call>\n{"name": "save_fact", "arguments": {"fact": "Alice lives in Lyon."}}\n</tool_call>',
        "<function=save_fact>\n<parameter=fact>Alice lives in Lyon.</parameter>\n</function>",
        '[TOOL_CALLS][{"name": "save_fact"}]',
    ],
)
def test_tool_call_markup_is_a_parse_failure_with_the_raw_reply(content: str) -> None:
    with pytest.raises(BadReply, match="tool-call markup") as info:
        parse_facts(content, "stop")
    assert info.value.raw_reply == content


def test_markup_inside_a_valid_fact_is_just_text() -> None:
    content = json.dumps({"facts": ["The parser chokes on <tool_call> tags in content."]})
    assert parse_facts(content, "stop") == ["The parser chokes on <tool_call> tags in content."]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("Here are the facts:\n- Alice lives in Lyon.", "not JSON"),
        ('{"items": ["Alice lives in Lyon."]}', "schema"),
        ('{"facts": "Alice lives in Lyon."}', "schema"),
        ("", "no JSON"),
    ],
)
def test_malformed_replies_fail_visibly(content: str, match: str) -> None:
    with pytest.raises(BadReply, match=match):
        parse_facts(content, "stop")


def test_truncated_reply_keeps_only_complete_items() -> None:
    content = '{"facts": ["Alice lives in Lyon.", "The budget is 500 dol'
    with pytest.raises(TruncatedReply) as info:
        parse_facts(content, "length")
    assert info.value.facts == ["Alice lives in Lyon."]
    assert salvage_facts('{"facts": ["a b", "c \\"d\\"",') == ["a b", 'c "d"']
    assert salvage_facts('{"facts": ["cut') == []
    assert salvage_facts('{"other": ["x"') == []


def test_strip_thinking_leaves_plain_text_alone() -> None:
    assert strip_thinking("  " + FACTS + "  ") == FACTS


# --------------------------------------------------------------------------- grounding

SOURCE = (
    "Maria Lopez approved the billing rollout for Thursday. The migration took 37 minutes and touched "
    "1,250,000 rows. Haha, thanks, talk soon!"
)


def test_grounding_keeps_supported_facts_with_spans() -> None:
    result = ground(
        ["Maria Lopez approved the billing rollout for Thursday.", "The migration touched 1250000 rows."],
        SOURCE,
        offset=100,
    )
    assert [f.text for f in result.kept] == [
        "Maria Lopez approved the billing rollout for Thursday.",
        "The migration touched 1250000 rows.",
    ]
    first, second = result.kept
    assert first.spans == [(100, 100 + SOURCE.index(" The migration"))]
    start, end = second.spans[0]
    assert SOURCE[start - 100 : end - 100].strip().startswith("The migration took 37 minutes")


@pytest.mark.parametrize(
    ("fact", "reason"),
    [
        ("The migration took 45 minutes.", "numbers not in the source: 45"),
        ("Maria Lopez and Jonas Weber approved the rollout.", "names not in the source: jonas"),
        ("The rollout was cancelled because of security vulnerabilities.", "key words"),
        ("Haha, thanks, talk soon!", "small talk"),
        ("Thanks!", "small talk"),
    ],
)
def test_grounding_rejects_invented_or_empty_facts(fact: str, reason: str) -> None:
    result = ground([fact], SOURCE)
    assert not result.kept
    assert reason in result.rejected[0].reason


def test_an_invented_subject_is_rejected_even_as_the_first_word() -> None:
    result = ground(["Zorblax approved the billing rollout.", "Currently the migration took 37 minutes."], SOURCE)
    assert [f.text for f in result.kept] == ["Currently the migration took 37 minutes."]
    assert result.rejected[0].reason == "names not in the source: zorblax"


def test_spans_point_at_the_supporting_sentence_not_its_look_alike_neighbours() -> None:
    source = " ".join(f"Crate {n} sits on shelf {n * 3}." for n in range(1, 30))
    [fact] = ground(["Crate 17 sits on shelf 51."], source, offset=1000).kept
    [(start, end)] = fact.spans
    assert source[start - 1000 : end - 1000] == "Crate 17 sits on shelf 51."


def test_grounding_dedups_within_a_reply() -> None:
    result = ground(["Maria Lopez approved the rollout.", "maria lopez approved the rollout"], SOURCE)
    assert len(result.kept) == 1


def test_shape_masks_numbers_only() -> None:
    a, b = normalize("The Quill budget is 500 dollars."), normalize("The Quill budget is 700 dollars.")
    assert a != b and shape(a) == shape(b)
    assert shape(normalize("The Quill budget is 500 euros.")) != shape(a)


# --------------------------------------------------------------------------- sizing


def count(text: str) -> int:
    """A stand-in tokenizer: ~4 characters per token, like the fake server's."""
    return max(1, len(text) // 4)


async def acount(text: str) -> int:
    return count(text)


def test_split_chars_covers_everything_with_overlap_at_boundaries() -> None:
    text = " ".join(f"Sentence {i} says that item {i} sits in bin {i * 7}." for i in range(400))
    chunks = split_chars(text, 1000, overlap=100)
    assert len(chunks) > 5
    assert chunks[0].start == 0 and chunks[-1].start + len(chunks[-1].text) == len(text)
    for prev, nxt in zip(chunks, chunks[1:]):
        assert nxt.start < prev.start + len(prev.text), "consecutive chunks overlap"
        assert text[nxt.start - 1] == " ", "a chunk starts at a word boundary"
        assert len(prev.text) <= 1000
        assert text[prev.start : prev.start + len(prev.text)] == prev.text


def test_plan_chunks_fits_every_chunk_into_the_budget() -> None:
    text = "word " * 10_000  # 50,000 chars, ~12,500 tokens
    chunks = asyncio.run(plan_chunks(text, budget_tokens=1400, count_tokens=acount))
    assert len(chunks) >= 9
    assert all(c.tokens == count(c.text) <= 1400 for c in chunks)
    single = asyncio.run(plan_chunks("short text", budget_tokens=1400, count_tokens=acount))
    assert len(single) == 1 and single[0].tokens == count("short text")


def test_a_context_too_small_for_any_text_is_refused() -> None:
    assert text_budget(512, 200, 384) < 32
    with pytest.raises(ValueError, match="raise -c"):
        asyncio.run(plan_chunks("x", budget_tokens=text_budget(512, 200, 384), count_tokens=acount))
    assert text_budget(2048, 150, 384) == 2048 - 150 - 384 - TEMPLATE_MARGIN_TOKENS


# --------------------------------------------------------------------------- prompt and caps


def test_prompt_is_byte_stable_and_puts_the_text_last() -> None:
    one, two = build_messages("Alice lives in Lyon."), build_messages("Bob moved to Oslo in 2024.")
    assert one[0] == two[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert one[-1]["content"].endswith("Alice lives in Lyon.")
    assert json.dumps(one[0]).encode() == json.dumps(two[0]).encode()
    schema = facts_schema(12, 300)
    assert schema["properties"]["facts"]["maxItems"] == 12 and schema["additionalProperties"] is False


def test_output_cap_follows_the_measured_generation_rate() -> None:
    props = ServerProps(n_ctx=4096, slots=1, chat_template="", build_info="", model_path="")
    throughput = Throughput()
    extractor = Extractor(client=None, props=props, throughput=throughput, max_output_tokens=384)  # type: ignore[arg-type]
    assert extractor.output_cap(10.0, 500) == 384  # nothing measured yet: the configured cap
    throughput.observe({"prompt_n": 500, "prompt_per_second": 250.0, "predicted_n": 50, "predicted_per_second": 20.0})
    # 10 s left, 2 s to read the prompt, 8 s at 20 tok/s with a 15% margin
    assert extractor.output_cap(10.0, 500) == int(8 * 20 * 0.85)
    assert extractor.output_cap(1.0, 500) == 0


def test_throughput_is_unknown_until_measured_or_given_a_prior() -> None:
    throughput = Throughput()
    assert throughput.job_seconds() is None and throughput.prompt_tps() is None
    assert throughput.snapshot()["source"] == "unmeasured"
    throughput.prior(60.0, 20.0, source="bootstrap smoke test")
    assert (throughput.prompt_tps(), throughput.generation_tps()) == (60.0, 20.0)
    assert throughput.snapshot()["source"] == "bootstrap smoke test"
    throughput.observe_job(1.5)
    assert throughput.job_seconds() == 1.5
    assert throughput.snapshot()["seconds_per_job"] == 1.5


def test_grounded_fact_type_is_plain_data() -> None:
    assert GroundedFact("x", [(0, 1)]).spans == [(0, 1)]


def test_numbers_that_name_things_are_not_values_that_change():
    from memory_service.extraction.grounding import identifiers, normalize, shape

    a, b = normalize("User asked to archive ticket 1000."), normalize("User asked to archive ticket 1010.")
    assert shape(a) != shape(b) and identifiers(a) == ["1000"]
    q1, q2 = (
        normalize("The daily quota for outbound emails is 50."),
        normalize("The daily quota for outbound emails is 60."),
    )
    assert shape(q1) == shape(q2) and identifiers(q1) == []


# --------------------------------------------------------------------------- sizing by time, echoes, small talk


def test_chunks_are_sized_to_finish_within_the_budget_at_the_measured_speed() -> None:
    from memory_service.extraction.sizing import TIME_HEADROOM, call_seconds, time_fit_tokens

    assert time_fit_tokens(20.0, 150, None, 12.0, 384) is None  # unmeasured: the context alone decides
    fit = time_fit_tokens(20.0, 0, 40.0, 12.0, 384)
    assert fit is not None and 100 < fit < 400
    assert call_seconds(fit, 0, 40.0, 12.0, 384) <= 20.0 * TIME_HEADROOM < call_seconds(fit + 1, 0, 40.0, 12.0, 384)
    # an uncached system prompt and a slower machine both leave less room for text
    assert time_fit_tokens(20.0, 150, 40.0, 12.0, 384) < fit
    assert time_fit_tokens(20.0, 0, 20.0, 6.0, 384) < fit
    assert time_fit_tokens(1.0, 150, 40.0, 12.0, 384) == 0  # nothing fits: the caller falls back to one sentence


def test_the_backlog_estimate_grows_with_the_work_ahead() -> None:
    from memory_service.extraction.sizing import backlog_seconds

    assert backlog_seconds(1, 300, None, None, 0, 384) is None
    one = backlog_seconds(1, 300, 40.0, 12.0, 0, 384)
    many = backlog_seconds(400, 400 * 300, 40.0, 12.0, 0, 384)
    assert one is not None and many is not None and many > 300 * one


def test_a_timeout_lowers_the_speed_so_the_next_chunk_is_smaller() -> None:
    from memory_service.extraction.sizing import time_fit_tokens

    throughput = Throughput()
    throughput.observe({"prompt_n": 400, "prompt_per_second": 40.0, "predicted_n": 60, "predicted_per_second": 12.0})
    before = time_fit_tokens(20.0, 0, throughput.prompt_tps(), throughput.generation_tps(), 384)
    throughput.slow_down(prompt_tokens=600, budget_s=20.0)
    after = time_fit_tokens(20.0, 0, throughput.prompt_tps(), throughput.generation_tps(), 384)
    assert after < before / 1.5
    # unmeasured: a timeout still yields a speed, so the retry is not the same doomed call
    fresh = Throughput()
    fresh.slow_down(prompt_tokens=900, budget_s=20.0)
    fit = time_fit_tokens(20.0, 0, fresh.prompt_tps(), fresh.generation_tps(), 384)
    assert fit is not None and fit < 900 / 2


def test_a_fact_that_echoes_a_text_of_several_claims_is_split_into_one_fact_per_claim() -> None:
    from memory_service.extraction.grounding import split_echoes, token_jaccard

    text = "The staging deploy window is Tuesdays 14:00-16:00 CET; prod deploys need two approvals."
    facts, split = split_echoes([text], text)
    assert split == 1
    assert facts == ["The staging deploy window is Tuesdays 14:00-16:00 CET.", "Prod deploys need two approvals."]
    assert all(token_jaccard(f, text) < 0.8 for f in facts)
    # one claim, or a fact that is not an echo, is left alone
    single = "Caroline went to the support group yesterday."
    assert split_echoes([single], single) == ([single], 0)
    assert split_echoes(["Prod deploys need two approvals."], text) == (["Prod deploys need two approvals."], 0)


def test_a_name_found_only_inside_an_email_address_is_not_grounded() -> None:
    source = "Sent the weekly digest to alice@example.com; the daily quota is 50 and we have used 12."
    result = ground(
        ["Alice has used 12 emails.", "The weekly digest was sent to alice@example.com.", "The daily quota is 50."],
        source,
    )
    assert [f.text for f in result.kept] == [
        "The weekly digest was sent to alice@example.com.",
        "The daily quota is 50.",
    ]
    assert result.rejected[0].reason == "names not in the source: alice"
    # an address alone says nothing
    assert ground(["Alice@example.com"], source).rejected[0].reason.startswith("only an address")
    # the same name standing as a word is fine
    assert ground(["Alice has used 12 emails."], "Alice wrote: we have used 12 emails.").kept


@pytest.mark.parametrize(
    "text",
    [
        "Haha that was fun, thanks!",
        "Thanks, Nate! See you later!",
        "Bye Joanna!",
        "ok",
        "Take care!",
        "Wow, that's awesome! So happy for you.",
        "[1:56 pm on 8 May, 2023] Gina: Thanks, Jon! See you later!",
    ],
)
def test_small_talk_is_recognised(text: str) -> None:
    from memory_service.extraction.gate import small_talk_reason

    assert small_talk_reason(text) == "small talk"


@pytest.mark.parametrize(
    "text",
    [
        "Thanks, we shipped it.",
        "Alice is great!",
        "Thanks! The deploy finished at 14:05.",
        "I love Paris!",
        "Haha, my dog ate the cake.",
        "See you at the Berlin office!",
        "Great, mail me at bo@example.com",
        "Yes! I finally did it last week",
        "Thanks Alice, the report is late.",
        "Haha that was fun, thanks! " * 8,
        "[8 May, 2023] Jon: I moved to Paris.",
    ],
)
def test_anything_that_may_hold_a_fact_goes_to_the_model(text: str) -> None:
    from memory_service.extraction.gate import small_talk_reason

    assert small_talk_reason(text) is None


def test_chunk_progress_survives_a_round_trip_through_json() -> None:
    from memory_service.extraction.extractor import Progress

    progress = Progress(offset=120, chunks=2, facts=[{"text": "A is B.", "spans": [[0, 7]]}], totals={"prompt_n": 10.0})
    assert Progress.from_dict(json.loads(json.dumps(progress.to_dict()))) == progress
    assert Progress.from_dict(None) == Progress()
