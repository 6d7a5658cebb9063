"""The agent eval (`memory-service eval --agent`) end to end, with the fake llama-server as the agent model.

The fake's `script` mode replays a tool-calling model's turns, chosen by what the conversation holds and
which tools it is offered, so the harness's plumbing runs for real: its own service (a `serve` process whose
extraction is another fake), a `memory-service mcp` process per session over stdio, the task's local tools,
and the scoring by state. With memory tools the scripted agent does each task right; without them (the
`off` baseline) it answers tickets twice, sends past the daily limit and cannot know what an earlier
session was told, and the scores must say so from the side effects, the service's counter and the answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from memory_service.evals import agent_tasks
from memory_service.evals.agent_loop import run_session
from memory_service.evals.options import eval_parser
from tests.fakes.fake_llama_server import FakeLlamaServer

MEMORY_ON = {"tools_include": ["recall"]}
MEMORY_OFF = {"tools_exclude": ["recall"]}


def _calls(name: str, *arguments: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, "arguments": a} for a in arguments]


def _feed_script() -> list[dict[str, Any]]:
    first, queue = "New support tickets", "Support tickets in the queue"
    n = {"n": r"T-(\w+)-10\d"}
    mark = lambda *ks: _calls("mark_handled", *({"key": f"T-{{n}}-{k}"} for k in ks))  # noqa: E731
    process = lambda *ks: _calls("process_item", *({"item_id": f"T-{{n}}-{k}"} for k in ks))  # noqa: E731
    return [
        {"when": first, "step": 0, "vars": n, "tool_calls": mark(101, 102, 103), **MEMORY_ON},
        {"when": first, "step": 1, "vars": n, "tool_calls": process(101, 102, 103), **MEMORY_ON},
        {"when": queue, "step": 0, "vars": n, "tool_calls": mark(102, 103, 104, 105), **MEMORY_ON},
        {"when": queue, "step": 1, "vars": n, "tool_calls": process(104, 105), **MEMORY_ON},
        {"when": first, "step": 0, "vars": n, "tool_calls": process(101, 102, 103), **MEMORY_OFF},
        {"when": queue, "step": 0, "vars": n, "tool_calls": process(102, 103, 104, 105), **MEMORY_OFF},
    ]


def _limit_script() -> list[dict[str, Any]]:
    first, second = "Send the welcome email to ana", "Send the welcome email to cleo"
    v1 = {"n": r"ana\.(\w+)@", "lim": r"'(emails-\w+)'"}
    v2 = {"n": r"cleo\.(\w+)@", "lim": r"'(emails-\w+)'"}
    use = _calls("consume_limit", {"name": "{lim}"})
    send = lambda who: _calls("send_email", {"to": f"{who}.{{n}}@example.com"})  # noqa: E731
    return [
        {"when": first, "step": 0, "vars": v1, "tool_calls": use, **MEMORY_ON},
        {"when": first, "step": 1, "vars": v1, "tool_calls": send("ana"), **MEMORY_ON},
        {"when": first, "step": 2, "vars": v1, "tool_calls": use, **MEMORY_ON},
        {"when": first, "step": 3, "vars": v1, "tool_calls": send("ben"), **MEMORY_ON},
        {"when": second, "step": 0, "vars": v2, "tool_calls": use, **MEMORY_ON},
        {"when": second, "step": 1, "vars": v2, "tool_calls": send("cleo"), **MEMORY_ON},
        {"when": second, "step": 2, "vars": v2, "tool_calls": use, **MEMORY_ON},
        {"when": second, "step": 3, "content": "The daily limit is used up: dan and eve did not get one.", **MEMORY_ON},
        {"when": first, "step": 0, "vars": v1, "tool_calls": send("ana") + send("ben"), **MEMORY_OFF},
        {"when": second, "step": 0, "vars": v2, "tool_calls": send("cleo") + send("dan") + send("eve"), **MEMORY_OFF},
        {"when": second, "step": 1, "content": "Sent all three.", **MEMORY_OFF},
    ]


def _recall_script() -> list[dict[str, Any]]:
    password, code, booking = r"\b([a-z]+-\d{4})\b", r"\b(R\d{3}-[KMPTXZ]\d{2})\b", r"reference ([B-H][J-P]\d{4})"
    asked = "What is its Wi-Fi password"
    stale = "The release checklist was saved"
    oslo = "booking reference of the flight"
    return [
        {
            "when": "For later: the Wi-Fi",
            "vars": {"pw": r"office is ([a-z]+-\d{4})"},
            "tool_calls": _calls("remember", {"text": "Wi-Fi password of the Lisbon office: {pw}"}),
        },
        {"when": "quarterly review", "tool_calls": _calls("remember", {"text": "Quarterly review: Thursday 10:00."})},
        {"when": asked, "tool_calls": _calls("recall", {"query": "Lisbon office Wi-Fi password"})},
        {"when": asked, "step": 1, "vars": {"pw": password}, "content": "The password is {pw}."},
        # the stale id: `full` tries get_memory first (a tool error), then recalls; `core` recalls at once
        {
            "when": stale,
            "vars": {"id": r"saved in memory as (\S+)\. Look"},
            "tool_calls": _calls("get_memory", {"memory_id": "{id}"}),
            "tools_include": ["get_memory"],
        },
        {"when": stale, "tool_calls": _calls("recall", {"query": "release checklist release code"})},
        {
            "when": stale,
            "step": 1,
            "tool_calls": _calls("recall", {"query": "release checklist release code"}),
            "tools_include": ["get_memory"],
        },
        {"when": stale, "step": 1, "vars": {"c": code}, "content": "The release code is {c}."},
        {"when": stale, "step": 2, "vars": {"c": code}, "content": "The release code is {c}."},
        {"when": oslo, "tool_calls": _calls("recall", {"query": "Oslo flight booking", "agent_id": "scheduler"})},
        {"when": oslo, "step": 1, "tool_calls": _calls("recall", {"query": "Oslo trip flight booking reference"})},
        {"when": oslo, "step": 2, "vars": {"b": booking}, "content": "The booking reference is {b}."},
    ]


def test_fake_script_mode_replays_tool_calls_and_the_loop_scores_local_effects() -> None:
    """In process, no MCP: the scripted model's calls reach the task's local tool, a bad call is an error the
    loop records, and a later good call marks it recovered."""
    script = [
        {"when": "tickets", "vars": {"n": r"T-(\w+)-1"}, "tool_calls": _calls("process_item", {"item_id": ""})},
        {
            "when": "tickets",
            "step": 1,
            "tool_calls": _calls("process_item", {"item_id": "T-x-1"}, {"item_id": "T-x-2"}),
        },
        {"when": "tickets", "step": 2, "content": "All done."},
    ]
    state = agent_tasks.RunState(nonce="x")

    async def session(url: str) -> Any:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            return await run_session(
                http,
                url,
                None,
                "Answer the tickets T-x-1 and T-x-2.",
                state=state,
                local_tools=(agent_tasks.PROCESS_ITEM,),
                mcp=None,
                deadline=float("inf"),
            )

    with FakeLlamaServer("ok", tokens_per_s=50_000) as fake:
        fake.set_mode("script", script=script)
        result = anyio.run(session, fake.url)
        offered = [t["function"]["name"] for t in fake.recorded()[0]["tools"]]
    assert offered == ["process_item"]
    assert result.final_answer == "All done." and result.stopped == "answered" and result.turns == 3
    assert [c.name for c in result.calls] == ["process_item"] * 3
    assert result.calls[0].error and result.calls[0].recovered is True
    assert [e["item"] for e in state.effects] == ["T-x-1", "T-x-2"]
    assert all(n > 0 for n in result.prompt_tokens)


def test_tool_calls_written_as_text_are_run_and_counted() -> None:
    """Qwen2.5-Coder-1.5B writes its calls as ```json blocks: the loop runs those naming an offered tool (and
    counts them apart); a call naming a tool it was not offered is answered with a tool error listing the
    offered tools, and the session goes on (issue 41)."""
    block = '```json\n{"name": "process_item", "arguments": {"item_id": "T-9"}}\n```'
    script = [
        {"when": "ticket", "content": block},
        {"when": "ticket", "step": 1, "content": '{"name": "send_email", "arguments": {"to": "a@b.c"}}'},
    ]
    state = agent_tasks.RunState(nonce="x")

    async def session(url: str) -> Any:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            return await run_session(
                http, url, None, "Answer the ticket T-9.", state=state,
                local_tools=(agent_tasks.PROCESS_ITEM,), mcp=None, deadline=float("inf"),
            )  # fmt: skip

    with FakeLlamaServer("ok", tokens_per_s=50_000) as fake:
        fake.set_mode("script", script=script)
        result = anyio.run(session, fake.url)
    assert state.effects == [{"tool": "process_item", "item": "T-9"}]
    assert result.calls_from_text == 2 and result.turns == 3 and result.final_answer == "Done."
    assert result.calls[1].error == "There is no tool named 'send_email'. The tools you have are: process_item."


@pytest.mark.process  # its own `serve`, and a `memory-service mcp` process per session
def test_agent_eval_end_to_end_scores_by_state(tmp_path: Path) -> None:
    script = _feed_script() + _limit_script() + _recall_script()
    out = tmp_path / "out"
    with FakeLlamaServer("ok", tokens_per_s=20_000) as extraction, FakeLlamaServer("ok", tokens_per_s=50_000) as agent:
        agent.set_mode("script", script=script)
        args = eval_parser().parse_args(
            ["--agent", "--agent-url", agent.url, "--llm-url", extraction.url, "--out", str(out), "--url", ""]
        )
        from memory_service.evals.agent_runner import run_agent_eval

        assert run_agent_eval(args, {}) == 0
    result = json.loads((out / "agent-eval.json").read_text())
    assert (out / "agent-eval.md").read_text().count("| off |") == len(agent_tasks.TASKS)
    runs = {(r["profile"], r["task"]): r for r in result["runs"]}
    profiles = {p for p, _ in runs}
    assert "off" in profiles and "full" in profiles
    assert ("core" in profiles) != any("core" in note for note in result["notes"])
    for profile in profiles - {"off"}:
        failed = {t: runs[(profile, t)]["checks"] for t in agent_tasks.TASK_NAMES if not runs[(profile, t)]["success"]}
        assert not failed, (profile, failed)
    assert not any(runs[("off", t)]["success"] for t in agent_tasks.TASK_NAMES)
    feed_off = runs[("off", "feed_dedupe")]["checks"]
    assert len(feed_off["handled_twice"]) == 2 and feed_off["never_handled"] == []
    assert runs[("off", "daily_limit")]["checks"]["emails_sent"] == 5
    assert runs[("full", "daily_limit")]["checks"] == {
        "emails_sent": 3,
        "counter_used": 3,
        "final_says_limit": True,
    }
    stale = result["summary"]["full"]["tasks"]["stale_id"]
    assert stale["tool_errors"] == 1 and stale["tool_errors_recovered"] == 1
    assert runs[("off", "fact_carryover")]["schema_tokens"] == 0
    assert runs[("full", "fact_carryover")]["schema_tokens"] > 0
    if "core" in profiles:
        assert runs[("core", "fact_carryover")]["schema_tokens"] < runs[("full", "fact_carryover")]["schema_tokens"]
    assert all(s["prompt_tokens"] for r in result["runs"] for s in r["sessions"])


def _run_alone(url: str, prompt: str, state: agent_tasks.RunState) -> Any:
    async def session() -> Any:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            return await run_session(
                http, url, None, prompt, state=state,
                local_tools=(agent_tasks.PROCESS_ITEM,), mcp=None, deadline=float("inf"),
            )  # fmt: skip

    return anyio.run(session)


def test_a_model_that_repeats_itself_is_stopped_as_stuck() -> None:
    """Seen with Qwen2.5-Coder-1.5B: the same call turn after turn, or one reply looping over the same calls.
    The session stops as `stuck` at the third repeat (not run), instead of spending all its turns."""
    one = _calls("process_item", {"item_id": "T-1"})
    again = [{"when": "ticket", "step": k, "tool_calls": one} for k in range(8)]
    looping = [{"when": "ticket", "tool_calls": _calls("process_item", *[{"item_id": "T-1"}, {"item_id": "T-2"}] * 3)}]
    with FakeLlamaServer("ok", tokens_per_s=50_000) as fake:
        fake.set_mode("script", script=again)
        state = agent_tasks.RunState(nonce="x")
        result = _run_alone(fake.url, "Answer the ticket T-1.", state)
        assert result.stopped == "stuck" and result.turns == 3
        assert [e["item"] for e in state.effects] == ["T-1", "T-1"]  # the third repeat was not run
        fake.set_mode("script", script=looping)
        state = agent_tasks.RunState(nonce="y")
        result = _run_alone(fake.url, "Answer the ticket T-1 and T-2.", state)
    assert result.stopped == "stuck" and result.turns == 1 and state.effects == []


def test_a_call_copied_with_the_templates_double_braces_is_read() -> None:
    """Seen with Qwen2.5-Coder-1.5B: `{{"name": "remember", ...}}`, the braces as its chat template prints them."""
    script = [
        {"when": "ticket", "content": '{{"name": "process_item", "arguments": {"item_id": "T-9"}}}'},
        {"when": "ticket", "step": 1, "content": "Done."},
    ]
    with FakeLlamaServer("ok", tokens_per_s=50_000) as fake:
        fake.set_mode("script", script=script)
        state = agent_tasks.RunState(nonce="x")
        result = _run_alone(fake.url, "Answer the ticket T-9.", state)
    assert state.effects == [{"tool": "process_item", "item": "T-9"}]
    assert result.calls_from_text == 1 and result.final_answer == "Done."
