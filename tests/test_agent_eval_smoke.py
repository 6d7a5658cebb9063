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
from memory_service.evals.agent_profiles import BRIEF_HEAD
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
        # the model spells one ticket its own way: the same ticket, scored as answered
        {
            "when": queue,
            "step": 1,
            "vars": n,
            "tool_calls": _calls("process_item", {"item_id": " t {n} 104."}) + process(105),
            **MEMORY_ON,
        },
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
        # no word of a short list: the counter proves the limit, the answer says so its own way
        {"when": second, "step": 3, "content": "The cap was hit, so Dan and Eve got nothing today.", **MEMORY_ON},
        {"when": first, "step": 0, "vars": v1, "tool_calls": send("ana") + send("ben"), **MEMORY_OFF},
        {"when": second, "step": 0, "vars": v2, "tool_calls": send("cleo") + send("dan") + send("eve"), **MEMORY_OFF},
        # without memory tools the model answers with what the tools told it: behind the gate, the refusal
        {
            "when": second,
            "step": 1,
            "vars": {"r": r"(The daily limit '[^']+' is used up[^.]*)"},
            "content": "Sent them. {r}",
            **MEMORY_OFF,
        },
    ]


def _recall_script() -> list[dict[str, Any]]:
    code, booking = r"\b(R\d{3}-[KMPTXZ]\d{2})\b", r"reference ([B-H][J-P]\d{4})"
    password_word, password_digits = r"\b([a-z]+)-\d{4}\b", r"\b[a-z]+-(\d{4})\b"
    asked = "What is its Wi-Fi password"
    stale = "The release checklist was saved"
    oslo = "booking reference of the flight"
    no_recall = {"tools_exclude": ["recall"]}
    return [
        # without memory tools (the proxy's profiles): the answer is in the prompt's brief, or it is not known
        {"when": asked, "vars": {"pw": r"office is ([a-z]+-\d{4})"}, "content": "It is {pw}.", **no_recall},
        {"when": stale, "vars": {"c": code}, "content": "The release code is {c}.", **no_recall},
        {"when": oslo, "vars": {"b": booking}, "content": "The booking reference is {b}.", **no_recall},
        {
            "when": "For later: the Wi-Fi",
            "vars": {"pw": r"office is ([a-z]+-\d{4})"},
            "tool_calls": _calls("remember", {"text": "Wi-Fi password of the Lisbon office: {pw}"}),
        },
        {"when": "quarterly review", "tool_calls": _calls("remember", {"text": "Quarterly review: Thursday 10:00."})},
        {"when": asked, "tool_calls": _calls("recall", {"query": "Lisbon office Wi-Fi password"})},
        # the value with spaces around its hyphen: still the password
        {"when": asked, "step": 1, "vars": {"w": password_word, "d": password_digits}, "content": "It is {w} - {d}."},
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


def _control_script() -> list[dict[str, Any]]:
    """The control: both tickets at once, one spelled with spaces (the same ticket), under every profile."""
    calls = _calls("process_item", {"item_id": "T {n} 1"}, {"item_id": "t-{n}-2"})
    when = "Answer the support tickets T-"
    return [
        {"when": when, "vars": {"n": r"T-(\w+)-1\b"}, "tool_calls": calls},
        {"when": when, "step": 1, "content": "Both tickets are answered."},
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
    """Every task under off, core (2 seeds), core+brief and full: scored by state, the control under every
    profile, ids and answers compared as values, each seed's sampling sent, the brief in the system prompt."""
    script = _control_script() + _feed_script() + _limit_script() + _recall_script()
    out = tmp_path / "out"
    with FakeLlamaServer("ok", tokens_per_s=20_000) as extraction, FakeLlamaServer("ok", tokens_per_s=50_000) as agent:
        agent.set_mode("script", script=script)
        args = eval_parser().parse_args(
            ["--agent", "--agent-url", agent.url, "--llm-url", extraction.url, "--out", str(out), "--url", "",
             "--seeds", "2", "--profile-seeds", "off=1,full=1,core+brief=1", "--profiles", "off,core,core+brief,full"]
        )  # fmt: skip
        from memory_service.evals.agent_runner import run_agent_eval

        assert run_agent_eval(args, {}) == 0
        requests = agent.recorded()
    result = json.loads((out / "agent-eval.json").read_text())
    table = (out / "agent-eval.md").read_text()
    assert table.count("| off |") == len(agent_tasks.TASKS)
    assert "Harness audit: 0 calls lost" in table and "Control task (tools, no memory):" in table
    runs = {(r["profile"], r["task"], r["seed"]): r for r in result["runs"]}
    profiles = {p for p, _, _ in runs}
    assert {"off", "full", "core+brief"} <= profiles
    assert ("core" in profiles) != any("core" in note for note in result["notes"])
    for key, run in runs.items():
        assert run["success"] == (key[0] != "off" or key[1] == "control"), (key, run["checks"])
    feed_off = runs[("off", "feed_dedupe", 1)]["checks"]
    assert len(feed_off["handled_twice"]) == 2 and feed_off["never_handled"] == []
    assert runs[("off", "daily_limit", 1)]["checks"]["emails_sent"] == 5
    assert runs[("full", "daily_limit", 1)]["checks"] == {"emails_sent": 3, "counter_used": 3, "final_says_limit": True}
    summary = result["summary"]
    assert summary["full"]["tasks"]["stale_id"]["tool_errors"] == 1
    assert summary["full"]["tasks"]["stale_id"]["tool_errors_recovered"] == 1
    assert summary["off"]["control"]["k"] == summary["off"]["control"]["n"] == 1
    assert summary["off"]["overall"]["k"] == 0 and summary["full"]["overall"]["k"] == summary["full"]["overall"]["n"]
    if "core" in profiles:
        core = summary["core"]["tasks"]["feed_dedupe"]
        assert (core["k"], core["n"], core["seeds"]) == (2, 2, [1, 2]) and core["ci95"][1] == 1.0
        assert (
            runs[("core", "fact_carryover", 1)]["schema_tokens"] < runs[("full", "fact_carryover", 1)]["schema_tokens"]
        )
    assert runs[("off", "fact_carryover", 1)]["schema_tokens"] == 0
    assert all(s["prompt_tokens"] and s["raw_replies"] for r in result["runs"] for s in r["sessions"])
    # each seed's sampling reached the model: the model card's, its seed, no prompt cache
    assert {(r.get("seed"), r.get("temperature"), r.get("top_k"), r.get("cache_prompt")) for r in requests} == {
        (1, 0.7, 20, False),
        (2, 0.7, 20, False),
    }
    # core+brief: the recall of the session's prompt is in its system prompt (fact_carryover's third session
    # gets the password saved in the first); plain core gets no brief
    password = runs[("core+brief", "fact_carryover", 1)]["checks"]["expected"]
    asked = [r for r in requests if "What is its Wi-Fi password" in r["messages"][1]["content"]]
    briefed = [r for r in asked if BRIEF_HEAD in r["messages"][0]["content"]]
    assert briefed and all(password in r["messages"][0]["content"].split(BRIEF_HEAD)[1] for r in briefed)
    assert len(asked) > len(briefed)  # the other profiles' sessions, without a brief
    assert runs[("core+brief", "fact_carryover", 1)]["sessions"][2]["brief"]


@pytest.mark.process  # its own `serve`; per session a `memory-service proxy`, and a `memory-service gate` in front of
# the task-tools MCP server
def test_gate_and_proxy_profiles_end_to_end(tmp_path: Path) -> None:
    """gate, proxy and gate+proxy beside off, one seed, the same scripted model (it calls no memory tool):

    - the proxy is in the model's path: session 3 of fact_carryover reaches the model with the proxy's brief in
      its system prompt, holding the password that session 1's user message said (saved by the proxy, since no
      memory tool was offered), and the stale id and Oslo tasks are answered from their briefs;
    - the gate refuses a second process_item for an item: the tool server's own log shows each feed ticket run
      once, and the refused calls carry the gate's sentence; send_email stops at the task's limit (3 run, the
      counter at 3) and the answer passes on the gate's refusal;
    - the control runs unguarded everywhere, and a guarded control beside it under the gate profiles;
    - the table has the new profiles, the audit line, and the prompts are the `off` words (no tool named)."""
    from memory_service.evals.agent_runner import run_agent_eval
    from memory_service.proxy.brief import HEAD as PROXY_BRIEF_HEAD

    script = _control_script() + _feed_script() + _limit_script() + _recall_script()
    out = tmp_path / "out"
    with FakeLlamaServer("ok", tokens_per_s=20_000) as extraction, FakeLlamaServer("ok", tokens_per_s=50_000) as agent:
        agent.set_mode("script", script=script)
        args = eval_parser().parse_args(
            ["--agent", "--agent-url", agent.url, "--llm-url", extraction.url, "--out", str(out), "--url", "",
             "--seeds", "1", "--profiles", "off,gate,proxy,gate+proxy"]
        )  # fmt: skip
        assert run_agent_eval(args, {}) == 0
        requests = agent.recorded()
    result = json.loads((out / "agent-eval.json").read_text())
    assert result["notes"] == []
    runs = {(r["profile"], r["task"]): r for r in result["runs"]}
    expected = {
        "off": {"control"},
        "gate": {"control", "control_guarded", "feed_dedupe", "daily_limit"},
        "proxy": {"control", "fact_carryover", "stale_id", "empty_recall"},
        "gate+proxy": {"control", "control_guarded", *agent_tasks.TASK_NAMES},
    }
    for (profile, task), run in runs.items():
        assert run["success"] == (task in expected[profile]), (profile, task, run["checks"], run.get("problem"))
    assert {t for p, t in runs if p == "off"} == set(agent_tasks.TASK_NAMES)  # no guarded control without a gate
    # the proxy: its brief reached the model, with what session 1 said; the sessions were briefed by its log
    asked = [r for r in requests if "What is its Wi-Fi password" in r["messages"][1]["content"]]
    briefs = [
        r["messages"][0]["content"].split(PROXY_BRIEF_HEAD)[1]
        for r in asked
        if PROXY_BRIEF_HEAD in r["messages"][0]["content"]
    ]
    assert len(briefs) == 2 and len(asked) == 4  # proxy and gate+proxy, not off and gate
    for profile in ("proxy", "gate+proxy"):  # each run's own password (its nonce's), told in its session 1
        assert any(runs[(profile, "fact_carryover")]["checks"]["expected"] in brief for brief in briefs)
    assert runs[("proxy", "fact_carryover")]["sessions"][2]["proxy"]["brief_lines"] >= 1
    assert all(
        not s["proxy"]["without_brief"] for r in result["runs"] if "proxy" in r["profile"] for s in r["sessions"]
    )
    # the gate: each ticket ran once by the tool server's own log; the repeats were refused by name
    feed = runs[("gate", "feed_dedupe")]
    assert feed["guarded"] and feed["upstream_calls"] == 5
    done = [agent_tasks.normalise_id(e["item"]) for e in feed["side_effects"]]
    assert len(done) == len(set(done)) == 5
    refused = [c for c in feed["sessions"][1]["calls"] if c.get("error")]
    assert len(refused) == 2 and all("do not handle it again" in c["error"] for c in refused)
    assert [c["refused"] for c in refused] == ["handled", "handled"]  # the gate's reason, from its _meta
    assert runs[("off", "feed_dedupe")]["checks"]["handled_twice"]  # the same model, ungated
    limit = runs[("gate", "daily_limit")]
    assert limit["checks"] == {"emails_sent": 3, "counter_used": 3, "final_says_limit": True}
    assert limit["upstream_calls"] == 3 and runs[("off", "daily_limit")]["checks"]["emails_sent"] == 5
    assert runs[("gate", "control_guarded")]["guarded"] and not runs[("gate", "control")]["guarded"]
    # the prompts name no tool these profiles lack: the limit's words are the off profile's
    assert all("consume_limit" not in s["prompt"] for r in result["runs"] for s in r["sessions"])
    table = (out / "agent-eval.md").read_text()
    for profile in ("gate", "proxy", "gate+proxy"):
        assert f"| {profile} | daily_limit |" in table
    assert "Harness audit: 0 calls lost" in table and "Guarded control" in table
    assert "| gate | daily_limit | 1/1 | 21%–100% | 5 (0) | 2 (0), 2 refused by the gate |" in table
    assert "Prompts: the same words under every profile." in table


def test_the_task_tools_server_lists_and_checks_as_the_local_tools(tmp_path: Path) -> None:
    """The gate profiles' upstream (an MCP server over stdio, through the SDK's client): the schemas the loop
    gives the model for the local tools, the same refusal of a list of addresses, and one JSON line per call in
    its log, from which the scoring reads only what ran."""
    import os
    import sys

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from memory_service.evals.agent_loop import mcp_tool_schemas
    from memory_service.evals.task_tools_server import LOG_ENV, read_effects

    log = tmp_path / "tools.jsonl"

    async def calls() -> tuple[list[Any], list[Any]]:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "memory_service.evals.task_tools_server", "--task", "daily_limit"],
            env={**os.environ, LOG_ENV: str(log)},
        )  # fmt: skip
        async with Client(params) as client:
            listed = (await client.list_tools()).tools
            answers = [
                await client.call_tool("send_email", {"to": "ana.x@example.com"}),
                await client.call_tool("send_email", {"to": ["ben.x@example.com", "cleo.x@example.com"]}),
                await client.call_tool("send_email", {"to": "ben.x@example.com, cleo.x@example.com"}),
            ]
        return listed, answers

    listed, answers = anyio.run(calls)
    assert mcp_tool_schemas(listed) == [agent_tasks.SEND_EMAIL.schema()]
    assert [a.is_error for a in answers] == [False, True, True]
    local = agent_tasks.RunState(nonce="x")
    with pytest.raises(ValueError) as refused:
        agent_tasks.SEND_EMAIL.run(local, {"to": ["ben.x@example.com", "cleo.x@example.com"]})
    assert answers[1].content[0].text == str(refused.value)
    assert len(log.read_text().splitlines()) == 3
    assert read_effects(log) == [{"tool": "send_email", "to": "ana.x@example.com"}]


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


# ---------------------------------------------------------------- scoring, statistics, template: no process


def test_wilson_interval_matches_the_textbook_values() -> None:
    """Wilson 95% (z = 1.96): 0/n is [0, z²/(n+z²)], n/n [n/(n+z²), 1]; 8/10 is [0.4902, 0.9433] (published
    tables); no runs: [0, 1]."""
    from memory_service.evals.agent_report import wilson

    assert [round(x, 4) for x in wilson(0, 3)] == [0.0, 0.5615]
    assert [round(x, 4) for x in wilson(3, 3)] == [0.4385, 1.0]
    assert [round(x, 4) for x in wilson(8, 10)] == [0.4902, 0.9433]
    assert wilson(0, 0) == (0.0, 1.0)


def test_runs_over_seeds_aggregate_to_k_of_n_and_the_audit_sums_lost_calls() -> None:
    """Two seeds of one task, one a success: 1/2 with its interval; the control apart from the memory tasks;
    a session whose raw replies held a call the loop did not run fails the audit line, loudly."""
    from memory_service.evals.agent_report import markdown, summarise

    def run(task: str, seed: int, success: bool, lost: int = 0) -> dict[str, Any]:
        session = {"session": 1, "prompt_tokens": [100, 200], "tool_calls": 2, "tool_calls_from_text": 1,
                   "tool_errors": 0, "tool_errors_recovered": 0, "calls_lost": lost, "stopped": "answered",
                   "wall_time_s": 4.0, "audit": {"calls_in_replies": 2}}  # fmt: skip
        return {"task": task, "profile": "core", "seed": seed, "success": success, "schema_tokens": 500,
                "sessions": [session], "wall_time_s": 5.0}  # fmt: skip

    runs = [run("feed_dedupe", 1, True), run("feed_dedupe", 2, False), run("control", 1, True)]
    core = summarise(runs)["core"]
    feed = core["tasks"]["feed_dedupe"]
    assert (feed["k"], feed["n"], feed["ci95"]) == (1, 2, [0.095, 0.905])
    assert (feed["prompt_tokens_per_session"], feed["wall_s_per_session"]) == (300, 4.0)
    assert (core["overall"]["k"], core["overall"]["n"]) == (1, 2)  # the control is not a memory task
    assert (core["control"]["k"], core["control"]["n"]) == (1, 1)
    table = markdown({"runs": runs, "agent_model": "m"})
    assert "Harness audit: 0 calls lost" in table and "| m | core | feed_dedupe | 1/2 | 10%–90% |" in table
    assert "Control task (tools, no memory): 1/1" in table
    assert "looks like a call" not in table
    flagged = run("stale_id", 2, False)
    flagged["sessions"][0]["audit"]["replies_with_unread_call_text"] = 1
    unread = markdown({"runs": [*runs, flagged], "agent_model": "m"})
    assert "looks like a call in 1 session(s)" in unread and "core/stale_id/seed 2/session 1" in unread
    assert "Prompts" not in table and "Guarded control" not in table  # a file from before: no such lines
    gated = [{**r, "profile": "gate", "wording": {}} for r in runs] + [
        {**run("control", 1, False), "task": "control_guarded", "profile": "gate", "wording": {}},
        {**run("daily_limit", 1, True), "profile": "gate", "wording": {"limit_rule": ""}},
        {**run("daily_limit", 1, True), "wording": {"limit_rule": "; use 1 unit of it with consume_limit"}},
    ]
    both = markdown({"runs": gated, "agent_model": "m"})
    assert "Guarded control (the same task, process_item once per item behind the gate): gate 0/1" in both
    assert "Control task (tools, no memory): 1/1" in both  # the guarded control is not the control
    assert "Prompts differ by profile" in both and "daily_limit (gate: no tool named | core: limit_rule" in both
    assert summarise(gated)["gate"]["overall"]["n"] == 3  # feed_dedupe twice and daily_limit: no control
    lost = markdown({"runs": [*runs, run("stale_id", 1, False, lost=1)], "agent_model": "m"})
    assert "HARNESS AUDIT FAILED: 1 call(s) lost" in lost and "core/stale_id/seed 1/session 1: 1" in lost


def test_ticket_ids_and_answers_are_compared_as_values() -> None:
    from memory_service.evals.agent_tasks import answer_has, normalise_id

    same = ["T-1a2b-101", "t-1a2b-101", " T 1a2b 101 ", "'T-1A2B-101.'", "T_1a2b_101", "(T - 1a2b - 101)"]
    assert {normalise_id(s) for s in same} == {"T-1A2B-101"}
    assert normalise_id("T-1a2b-102") != normalise_id("T-1a2b-101")
    assert normalise_id("T 123-101") == normalise_id("T-123-101")
    assert answer_has("The password is Maple - 1234.", "maple-1234")
    assert answer_has("booking ref: bj 4821", "BJ4821") and not answer_has("BJ4822", "BJ4821")


def test_the_limit_is_said_in_any_words_or_by_naming_who_got_nothing() -> None:
    from memory_service.evals.agent_tasks import RunState, says_limit

    state = RunState(
        nonce="x", effects=[{"tool": "send_email", "to": f"{n}.x@example.com"} for n in ("ana", "ben", "cleo")]
    )
    for said in ("The daily cap was reached.", "We hit the quota for today.", "No more emails can go out today.",
                 "The allowance is used up.", "Dan and Eve did not get one.", "eve.x@example.com is still waiting",
                 "Sent to cleo; the limit stopped the rest."):  # fmt: skip
        assert says_limit(said, state), said
    for silent in ("All three emails were sent.", "Done.", "Sent to Cleo."):
        assert not says_limit(silent, state), silent


def test_the_models_broken_template_is_replaced_by_the_shipped_fix_only_on_its_exact_text() -> None:
    """The `large` GGUF's template, which teaches `{{"name": …}}`, is rebuilt from the shipped fix (the one line
    put back as the model file has it): its sha256 selects the fix; the fix itself, or the text with one byte
    changed, keeps the model's own. The fix differs from it in that line only, and has single braces there."""
    from memory_service.evals.agent_endpoint import CORRECTED_TEMPLATES, corrected_template, template_record

    fixed_path = next(iter(CORRECTED_TEMPLATES.values()))
    fix = corrected_template.__globals__["TEMPLATES_DIR"] / fixed_path
    fixed = fix.read_text()
    good = '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}'
    broken = fixed.replace(good, "{" + good + "}")
    assert broken != fixed and fixed.count(good) == 1
    assert corrected_template(broken) == fix
    assert corrected_template(fixed) is None and corrected_template(broken + " ") is None
    assert '{{\\"name\\"' in broken and '{{\\"name\\"' not in fixed
    assert template_record(broken, fix, started_here=True)["used"] == fix.name
    assert template_record(broken, fix, started_here=False)["used"] == "endpoint's own"
    assert template_record(fixed, None, started_here=True)["used"] == "model's own"


def test_profiles_seeds_and_sampling_options() -> None:
    from memory_service.evals.agent_profiles import Parts, parts
    from memory_service.evals.agent_runner import parse_profiles, sampling_for, seed_counts

    assert parse_profiles("off,core+brief") == ["off", "core+brief"]
    assert parse_profiles("gate,proxy,gate+proxy") == ["gate", "proxy", "gate+proxy"]
    assert parts("gate+proxy") == Parts(None, brief=False, gate=True, proxy=True)
    assert parts("core+brief") == Parts("core", brief=True) and parts("off") == Parts(None)
    assert eval_parser().parse_args(["--agent"]).profiles == "off,core,core+brief,full,gate,proxy,gate+proxy"
    with pytest.raises(SystemExit):
        parse_profiles("core+recall")
    args = eval_parser().parse_args(["--agent"])
    assert seed_counts(args, ["off", "core", "core+brief", "full"]) == {"off": 1, "core": 3, "core+brief": 3, "full": 1}
    assert sampling_for(args, 2) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repeat_penalty": 1.05,
                                     "seed": 2, "cache_prompt": False}  # fmt: skip
    greedy = eval_parser().parse_args(["--agent", "--greedy", "--agent-sampling", '{"top_k": null, "min_p": 0}'])
    assert seed_counts(greedy, ["core"]) == {"core": 1}
    assert sampling_for(greedy, 1) == {"temperature": 0, "cache_prompt": False, "min_p": 0}
