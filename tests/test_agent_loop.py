"""The agent loop against replies in the shapes small models send (issue 41, item 3, 4, 5 and 8).

The fake llama-server's `script` mode replays each shape as a real HTTP reply: calls written as text in
`content` (doubled braces, an unbalanced brace, prose around them, `parameters`, arguments as a string, the
OpenAI wrapper, two in one reply, a tool that was not offered), a reply cut at the token cap. The task's own
`process_item` tool records what ran in `RunState.effects`, and the fake records every request, so a test
reads what the model was sent back (the history) as well as what ran. Every session's audit must count 0
calls lost by the harness.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_service.evals import agent_tasks
from memory_service.evals.agent_loop import SessionResult, calls_in_content, run_session
from memory_service.evals.tool_calls import read_calls
from tests.fakes.fake_llama_server import FakeLlamaServer

PROMPT = "Answer the tickets T-1 and T-2."
TOOLS = (agent_tasks.PROCESS_ITEM, agent_tasks.SEND_EMAIL)


def _call(item: str, key: str = "arguments") -> str:
    return json.dumps({"name": "process_item", key: {"item_id": item}})


def _session(
    turns: list[dict[str, Any]], *, tools: tuple[agent_tasks.LocalTool, ...] = TOOLS, **kw: Any
) -> tuple[SessionResult, agent_tasks.RunState, list[dict[str, Any]]]:
    """Run one session against the scripted fake: (result, the tools' effects, the requests the fake got)."""
    script = [{"when": "tickets", "step": n, **turn} for n, turn in enumerate(turns)]
    state = agent_tasks.RunState(nonce="x")

    async def session(url: str) -> SessionResult:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            return await run_session(
                http, url, None, PROMPT, state=state, local_tools=tools, mcp=None, deadline=float("inf"), **kw
            )

    with FakeLlamaServer("ok", tokens_per_s=50_000) as fake:
        fake.set_mode("script", script=script)
        result = anyio.run(session, fake.url)
        requests = fake.recorded()
    assert result.report()["calls_lost"] == 0, result.report()["audit"]
    return result, state, requests


def _items(state: agent_tasks.RunState) -> list[str]:
    return [e["item"] for e in state.did("process_item")]


def _tool_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


@pytest.mark.parametrize(
    "content",
    [
        # the Qwen2.5 GGUF template's doubled braces, then prose
        '{{"name": "process_item", "arguments": {"item_id": "T-1"}}}\nI have answered the ticket.',
        # an unbalanced `}}`: doubled opening brace, one closing brace short (seen at temperature 0)
        '{{"name": "process_item", "arguments": {"item_id": "T-1"}}',
        # a preamble and a tail of prose
        f"Sure: {_call('T-1')} I will now check the next one.",
        # the arguments as a JSON string
        json.dumps({"name": "process_item", "arguments": json.dumps({"item_id": "T-1"})}),
        # the OpenAI wrapper
        json.dumps({"type": "function", "function": {"name": "process_item", "arguments": {"item_id": "T-1"}}}),
        # `parameters` instead of `arguments`: run with the real arguments, not {}
        _call("T-1", "parameters"),
        # a <tool_call> block
        f"<tool_call>\n{_call('T-1')}\n</tool_call>",
        # the name under "function" (seen in the 2026-12-06 run, alone and as a list in a ```json fence)
        json.dumps({"function": "process_item", "arguments": {"item_id": "T-1"}}),
        "Here are the processed tickets:\n```json\n"
        + json.dumps([{"function": "process_item", "arguments": {"item_id": "T-1"}}], indent=2) + "\n```",
        json.dumps({"tool": "process_item", "args": {"item_id": "T-1"}}),
    ],
    ids=["doubled-brace-prose", "unbalanced-braces", "preamble", "string-arguments", "openai-wrapper",
         "parameters", "tool-call-tag", "function-key", "function-key-list", "tool-args-keys"],
)  # fmt: skip
def test_a_call_written_as_text_in_any_shape_runs_with_its_arguments(content: str) -> None:
    result, state, requests = _session([{"content": content}, {"content": "Done."}])
    assert _items(state) == ["T-1"]
    assert result.final_answer == "Done." and result.stopped == "answered"
    assert result.calls_from_text == 1 and result.calls[0].error is None
    assert _tool_messages(requests[1]) == ["Processed T-1: the customer got an answer."]


@pytest.mark.parametrize(
    "content",
    [
        'Process_item({"item_id": "T-1"})',  # seen 47 times in one eval run, mostly capitalised
        'process_item: {"item_id": "T-1"}\nThat is all.',
        'PROCESS_ITEM(item_id="T-1")',
        "I will answer it: `process_item(item_id='T-1', )`",
        '```python\nprocess_item(item_id = "T-1")\n```',
        'process_item: {"name": "process_item", "arguments": {"item_id": "T-1"}}',
        '<tools>\n  <function name="Process_item" arguments={"item_id": "T-1"}>\n</tools>',  # seen in the eval
        'Process item {"item_id": "T-1"}',  # the next three seen in agent-eval43
        'Process_item, {"item_id": "T-1"}',
        'Process_item {"item_id": "T-1"}',
        'Process_item("T-1")',  # the next two seen in the 2026-12-06 run: one value for the one parameter
        'Process_item\n{"item_id": "T-1"}',
        "process_item( 'T-1' )",
        "Process_item({item_id: 'T-1'})",  # an object written as code, seen with the default model
        'process_item: {item_id: "T-1",}',
    ],
    ids=[
        "json-in-parentheses",
        "colon-json",
        "keywords",
        "single-quotes-backticks",
        "python-fence",
        "name-then-call",
        "function-tag",
        "space-for-underscore",
        "comma-json",
        "space-json",
        "positional",
        "name-line-json",
        "positional-single-quotes",
        "code-object",
        "colon-code-object",
    ],
)
def test_a_call_written_as_code_runs_with_its_arguments(content: str) -> None:
    result, state, requests = _session([{"content": content}, {"content": "Done."}])
    assert _items(state) == ["T-1"] and result.calls_from_text == 1 and result.calls[0].error is None
    assert result.calls[0].name == "process_item"
    assert result.report()["audit"]["replies_with_unread_call_text"] == 0
    (assistant,) = [m for m in requests[1]["messages"] if m["role"] == "assistant"]
    assert "process_item" not in assistant["content"].casefold()


def test_the_same_call_written_twice_in_a_row_runs_once_and_a_later_repeat_runs_again() -> None:
    """Seen in agent-eval43: each call written as code, then again as JSON, so every ticket was answered twice."""
    twice = 'Process_item(item_id="T-1")\n' + _call("T-1") + "\n" + _call("T-2") + "\n" + _call("T-1")
    result, state, _ = _session([{"content": twice}, {"content": "Done."}])
    assert _items(state) == ["T-1", "T-2", "T-1"]
    audit = result.report()["audit"]
    assert audit["calls_repeated_in_a_row"] == 1 and audit["calls_in_replies"] == 3 == audit["calls_run"]


@pytest.mark.parametrize(
    "content",
    ["Next I will call process_item(item_id) for each ticket.", "Then myprocess_item(item_id='T-1') runs.",
     "helpers.process_item(item_id='T-1')", "Process_item: first I read the ticket."],
)  # fmt: skip
def test_prose_that_names_a_tool_is_not_a_call_and_the_audit_flags_a_code_shape(content: str) -> None:
    result, state, _ = _session([{"content": content}])
    assert state.effects == [] and result.stopped == "answered"
    flagged = result.report()["audit"]["replies_with_unread_call_text"]
    assert flagged == (1 if content.startswith("Next") else 0)


def test_one_unnamed_value_for_a_tool_of_several_parameters_is_answered_with_how_to_name_it() -> None:
    """`name("value")` goes to the tool's one parameter; with two it could be either, so it is not guessed:
    the model is told how to name it, and the call counts as read (not lost, not unread text)."""
    two = agent_tasks.LocalTool(
        "process_item",
        "Answer one ticket.",
        {"type": "object", "properties": {"item_id": {"type": "string"}, "note": {"type": "string"}}},
        agent_tasks.PROCESS_ITEM.run,
    )
    result, state, requests = _session([{"content": 'Process_item("T-1")'}, {"content": "Done."}], tools=(two,))
    assert state.effects == [] and result.calls[0].error is not None
    (answer,) = _tool_messages(requests[1])
    assert "by name" in answer and '"arguments"' in answer
    audit = result.report()["audit"]
    assert audit["calls_in_replies"] == 1 == audit["calls_run"] and audit["replies_with_unread_call_text"] == 0


def test_an_unread_call_under_another_key_is_flagged_for_a_reader() -> None:
    """A JSON call whose arguments are not an object the reader knows still shows in the audit."""
    result, state, _ = _session([{"content": '{"function": "process_item"'}])
    assert state.effects == []
    assert result.report()["audit"]["replies_with_unread_call_text"] == 1


def test_an_echoed_tool_definition_is_answered_with_how_to_call_it() -> None:
    schema = agent_tasks.PROCESS_ITEM.schema()
    echo = f"<tools>\n{json.dumps(schema)}\n</tools>"
    result, state, requests = _session([{"content": echo}, {"content": _call("T-1")}, {"content": "Done."}])
    (answer,) = _tool_messages(requests[1])
    assert "definition" in answer and '"arguments"' in answer
    assert _items(state) == ["T-1"] and result.calls[0].error and result.calls[0].recovered is True


def test_two_calls_in_one_reply_both_run_in_order() -> None:
    """Seen: two calls in one reply, each with the template's doubled braces; the old reader ran the first."""
    two = "\n".join("{" + _call(item) + "}" for item in ("T-1", "T-2"))
    result, state, requests = _session([{"content": two}, {"content": "Done."}])
    assert _items(state) == ["T-1", "T-2"]
    assert result.calls_from_text == 2 and len(_tool_messages(requests[1])) == 2


def test_calls_in_both_fields_of_one_reply_all_run_once() -> None:
    """One call in tool_calls and another written in the text: both run; the same call in both runs once."""
    both = f"First {_call('T-2')} and {_call('T-1')}"
    turn = {"content": both, "tool_calls": [{"name": "process_item", "arguments": {"item_id": "T-1"}}]}
    result, state, _ = _session([turn, {"content": "Done."}])
    assert _items(state) == ["T-1", "T-2"]
    assert result.report()["audit"]["calls_in_replies"] == 2


@pytest.mark.parametrize("field", ["content", "tool_calls"])
def test_a_call_to_a_tool_not_offered_is_answered_with_the_offered_tools_and_the_session_goes_on(field: str) -> None:
    wrong = {"name": "answer_ticket", "arguments": {"item_id": "T-1"}}
    first = {"content": json.dumps(wrong)} if field == "content" else {"tool_calls": [wrong], "offered_only": False}
    result, state, requests = _session([first, {"content": _call("T-1")}, {"content": "Done."}])
    assert _tool_messages(requests[1]) == [
        "There is no tool named 'answer_ticket'. The tools you have are: process_item, send_email."
    ]
    assert _items(state) == ["T-1"] and result.final_answer == "Done." and result.turns == 3
    assert result.calls[0].error and result.calls[0].recovered is True


def test_arguments_that_are_not_an_object_get_a_tool_error_saying_so() -> None:
    listed = json.dumps({"name": "process_item", "arguments": ["T-1"]})
    result, state, requests = _session([{"content": listed}, {"content": "Done."}])
    assert state.effects == [] and result.calls[0].error
    (answer,) = _tool_messages(requests[1])
    assert "must be a JSON object" in answer and "list" in answer


def test_the_history_holds_a_call_read_from_text_once_in_the_canonical_form() -> None:
    content = f"Sure: {_call('T-1')}"
    _, _, requests = _session([{"content": content}, {"content": "Done."}])
    assistant = [m for m in requests[1]["messages"] if m["role"] == "assistant"]
    assert len(assistant) == 1
    assert "process_item" not in assistant[0]["content"] and "{" not in assistant[0]["content"]
    (call,) = assistant[0]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "process_item"
    assert json.loads(call["function"]["arguments"]) == {"item_id": "T-1"}
    (tool,) = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert tool["tool_call_id"] == call["id"]


def test_a_reply_cut_at_the_token_cap_ends_the_session_as_cut_not_as_an_answer() -> None:
    cut = {
        "content": 'I will answer it: {"name": "process_item", "arguments": {"item_id": "T-',
        "finish_reason": "length",
    }
    result, state, requests = _session([cut, {"content": "Done."}])
    assert result.stopped == "cut" and result.final_answer == "" and result.turns == 1
    assert state.effects == [] and len(requests) == 1
    # its half-written call is counted by calls_cut's reason (the cap), not as call text the reader missed
    assert result.report()["audit"]["replies_with_unread_call_text"] == 0
    # a whole call in a cut reply is not run either (the reply may have been cut inside its arguments)
    whole = {"content": f"{_call('T-1')} and then {_call('T-2')}", "finish_reason": "length"}
    result, state, _ = _session([whole])
    assert result.stopped == "cut" and state.effects == []
    assert result.report()["audit"]["calls_cut"] == 2


def test_every_raw_reply_is_in_the_report() -> None:
    turns = [
        {"content": f"Sure: {_call('T-1')}"},
        {"tool_calls": [{"name": "process_item", "arguments": {"item_id": "T-2"}}]},
        {"content": "Done."},
    ]
    result, _, _ = _session(turns)
    raw = json.loads(json.dumps(result.report()))["raw_replies"]
    assert [r["turn"] for r in raw] == [1, 2, 3]
    assert [r["finish_reason"] for r in raw] == ["stop", "tool_calls", "stop"]
    assert raw[0]["content"] == f"Sure: {_call('T-1')}" and raw[0]["tool_calls"] is None
    assert raw[0]["calls_in_text"] == 1 and [c["from"] for c in raw[0]["ran"]] == ["text"]
    assert raw[1]["tool_calls"][0]["function"]["name"] == "process_item"
    assert [c["from"] for c in raw[1]["ran"]] == ["tool_calls"] and raw[2]["ran"] == []
    assert all(r["usage"]["prompt_tokens"] > 0 and "predicted_n" in r["timings"] for r in raw)
    assert result.report()["audit"] == {
        "calls_in_replies": 2,
        "calls_run": 2,
        "calls_lost": 0,
        "calls_not_run_stuck": 0,
        "calls_cut": 0,
        "replies_with_unread_call_text": 0,
        "calls_repeated_in_a_row": 0,
    }


def test_the_stuck_stops_repeat_is_counted_apart_from_lost_calls() -> None:
    again = [{"content": _call("T-1")}] * 4
    result, state, _ = _session(again)
    assert result.stopped == "stuck" and _items(state) == ["T-1", "T-1"]
    audit = result.report()["audit"]
    assert audit["calls_not_run_stuck"] == 1 and audit["calls_run"] == 2


def test_sampling_is_merged_into_every_request() -> None:
    _, _, requests = _session([{"content": _call("T-1")}, {"content": "Done."}])
    assert requests[0]["temperature"] == 0 and requests[0]["cache_prompt"] is False
    assert requests[0]["max_tokens"] == 384
    _, _, requests = _session([{"content": "Done."}], sampling={"seed": 7, "temperature": 0.7, "top_p": 0.8})
    assert (requests[0]["seed"], requests[0]["temperature"], requests[0]["top_p"]) == (7, 0.7, 0.8)
    assert "cache_prompt" not in requests[0] and requests[0]["max_tokens"] == 384


_JSONISH = st.text(alphabet='{}[]":,\\ ntame\x00\u00e9\U0001f600argumentsprocess_item', max_size=300)


_CODEISH = st.text(alphabet="()=:,'\"{}[] \n\\process_itemPROCESS_ITEM_idT-1\x00\u0130", max_size=300)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=500), _JSONISH, _CODEISH, st.lists(_JSONISH, max_size=5).map(_call("T-1").join)))
def test_the_text_reader_never_raises(text: str) -> None:
    calls = read_calls(text, {"process_item"})
    assert all(c.arguments is None or isinstance(c.arguments, dict) for c in calls)
    assert len(calls_in_content(text, {"process_item"})) == len(calls)


def test_the_text_reader_bounds_its_work_on_huge_or_deep_text() -> None:
    offered = {"process_item"}
    assert calls_in_content("{" * 200_000, offered) == []
    assert calls_in_content('{"a": "' * 50_000, offered) == []
    assert calls_in_content('{"a": ' * 5_000 + "1" + "}" * 5_000, offered) == []  # deeper than json can read
    assert calls_in_content("[" * 10_000 + _call("T-1"), offered)  # after 10,000 brackets: still read
    assert len(calls_in_content(_call("T-1") * 1000, offered)) == 32
    # calls written as code: a regex with nested quantifiers hung here; the scanner is linear and bounded
    for hostile in (
        "process_item(" * 2_000,
        'Process_item({"' * 1_500,
        'process_item(item_id="' * 1_200,
        "process_item(a=" + "1," * 10_000,
        "PROCESS_ITEM(k='" * 2_000,
        'process_item: {"' * 1_300,
        'process_item("' * 1_500,
        "process_item('" * 1_500,
        "process_item\n" * 3_000,
        "process_item({a: " * 1_500,
        "process_item: {a: '" * 1_500,
    ):
        assert calls_in_content(hostile, offered) == []
    assert len(calls_in_content("process_item(item_id='T-1')\n" * 1000, offered)) == 32


def test_a_task_tool_reads_its_arguments_as_a_real_tool_would() -> None:
    """A list of three recipients is not one email, and an item id must be one string (issue 54: a run with
    `large` sent one 'email' to three people and the counter said 1)."""
    state = agent_tasks.RunState(nonce="x")
    for args in (
        {"to": ["ana@example.com", "ben@example.com", "cleo@example.com"]},
        {"to": "ana@example.com, ben@example.com"},
        {"to": "ana@example.com ben@example.com"},
        {"to": "nobody"},
        {},
    ):
        with pytest.raises(ValueError, match="'to' must be one"):
            agent_tasks.SEND_EMAIL.run(state, args)
    for args in ({"item_id": ["T-1", "T-2"]}, {"item_id": 7}, {"item_id": "  "}):
        with pytest.raises(ValueError, match="'item_id' must be one string"):
            agent_tasks.PROCESS_ITEM.run(state, args)
    assert agent_tasks.SEND_EMAIL.run(state, {"to": " ana.x@example.com "}) == "Email sent to ana.x@example.com."
    assert [e["to"] for e in state.did("send_email")] == ["ana.x@example.com"]


@pytest.mark.parametrize("task", agent_tasks.TASKS, ids=lambda t: t.name)
def test_a_prompt_names_no_tool_its_profile_does_not_offer(task: agent_tasks.Task) -> None:
    """The field report's failure #2: a prompt that tells the model to call a tool it does not have."""
    memory_tools = {"remember", "recall", "consume_limit", "mark_handled", "check_limit", "was_handled", "forget"}
    state = agent_tasks.new_state(task, "abc123")
    state.values.setdefault("stale_id", "mem_0")  # the stale task's setup saves it
    local = {t.name for t in task.tools}
    bare = " ".join(task.prompts(state, local))
    assert not {name for name in memory_tools if name in bare}, bare
    assert "search with" not in bare and "unit of it" not in bare
    with_core = " ".join(task.prompts(state, local | {"remember", "recall", "consume_limit", "mark_handled"}))
    if task.name == "daily_limit":
        assert "consume_limit" in with_core
    if task.name == "empty_recall":
        assert "search with agent_id 'scheduler'" in with_core
