"""`memory-service gate` as a harness runs it: the MCP SDK's own client -> the gate (a subprocess, over stdio) -> a
real upstream MCP server (tests/fakes/mcp_upstream.py, the gate's own child, over stdio), against the real service
in this process (app, workers, stores, with the fake llama-server).

Every count is read from the upstream's own log (one JSON line per run of a tool), not from what the gate says.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import ROOT
from inprocess import InProcessService
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from memory_service.client import MemoryClient
from memory_service.llm.runtime.server import free_port
from tests.fakes.fake_llama_server import FakeLlamaServer

pytestmark = pytest.mark.process  # the gate and its upstream are subprocesses

UPSTREAM = ROOT / "tests" / "fakes" / "mcp_upstream.py"
CORE = ["remember", "recall", "consume_limit", "mark_handled"]
UPSTREAM_TOOLS = ["process_item", "send_email", "fail_item", "broken_item", "slow_item", "crash_item", "lookup"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("gate") / "data", fake.url).start()
        yield svc
        svc.stop()


@pytest.fixture
def memory(service: InProcessService) -> Iterator[MemoryClient]:
    with MemoryClient(service.url, api_key="key-a") as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Scene:
    """One test's files: its policy and the upstream's log."""

    def __init__(self, tmp_path: Path, policy: str) -> None:
        self.policy = tmp_path / "gate.toml"
        self.policy.write_text(policy)
        self.log = tmp_path / "upstream.jsonl"

    def runs(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [line for line in lines if tool is None or line["tool"] == tool]


def gate_env(
    url: str, scene: Scene, *, key: str | None = "key-a", agent: str = "gate-1", **extra: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMORY_", "GATE_"))}
    env.update({"MEMORY_URL": url, "MEMORY_AGENT_ID": agent, "MEMORY_LOG_LEVEL": "WARNING"})
    env.update({"GATE_UPSTREAM_LOG": str(scene.log), **extra})
    if key:
        env["MEMORY_API_KEY"] = key
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def gate_args(scene: Scene, *flags: str) -> list[str]:
    return ["-m", "memory_service", "gate", "--policy", str(scene.policy), *flags, "--", sys.executable, str(UPSTREAM)]


def gate(url: str, scene: Scene, *flags: str, **env: Any) -> Client:
    """The harness's view: it spawns `python -m memory_service gate ... -- python mcp_upstream.py` over stdio."""
    params = StdioServerParameters(
        command=sys.executable, args=gate_args(scene, *flags), env=gate_env(url, scene, **env), cwd=str(ROOT)
    )
    return Client(params)


def upstream_alone(scene: Scene) -> Client:
    """The same upstream with no gate in front."""
    env = gate_env("http://127.0.0.1:1", scene)
    return Client(StdioServerParameters(command=sys.executable, args=[str(UPSTREAM)], env=env, cwd=str(ROOT)))


def text_of(result: Any) -> str:
    return "\n".join(part.text for part in result.content if getattr(part, "text", None))


async def call(client: Client, tool: str, /, **arguments: Any) -> tuple[bool, str]:
    result = await client.call_tool(tool, arguments)
    return bool(result.is_error), text_of(result)


def run(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args)


PROCESS = """
[tools.process_item]
once = "ticket:{item_id}"
"""

# ---------------------------------------------------------------- what the gate loads

PURITY_PROBE = (
    "import sys, memory_service.gate.server, memory_service.cli.gate; "
    "print(sorted({m.split('.')[0] if not m.startswith('memory_service.') else '.'.join(m.split('.')[:2]) "
    "for m in sys.modules}))"
)


def test_importing_the_gate_loads_no_store_and_no_service() -> None:
    """The gate is a client of the HTTP API, like `memory-service mcp` (import contract `gate`)."""
    out = subprocess.run([sys.executable, "-c", PURITY_PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    forbidden = {"memory_service.storage", "memory_service.services", "psycopg", "chromadb", "sqlite3", "fastapi"}
    assert loaded & forbidden == set(), out.stderr
    assert {"memory_service.gate", "memory_service.client", "mcp"} <= loaded  # the probe sees what it should


# ---------------------------------------------------------------- what passes through


def test_the_tools_are_the_upstreams_and_unguarded_calls_pass_through(service: InProcessService, tmp_path: Path):
    scene = Scene(tmp_path, PROCESS)

    async def scenario() -> None:
        async with upstream_alone(scene) as direct:
            bare = (await direct.list_tools()).tools
            bare_lookup = await direct.call_tool("lookup", {"item_id": "A-1"})
        async with gate(service.url, scene) as client:
            fronted = (await client.list_tools()).tools
            through = await client.call_tool("lookup", {"item_id": "A-1"})
        assert [t.model_dump() for t in fronted] == [t.model_dump() for t in bare]  # names, descriptions, schemas
        assert [t.name for t in fronted] == UPSTREAM_TOOLS
        assert through.content == bare_lookup.content and through.structured_content == {
            "item_id": "A-1",
            "state": "open",
        }
        assert not through.is_error

    run(scenario)
    assert len(scene.runs("lookup")) == 2  # once direct, once through the gate: not guarded, not refused


def test_memory_tools_core_adds_the_core_memory_tools(service: InProcessService, tmp_path: Path):
    scene = Scene(tmp_path, PROCESS)

    async def scenario() -> None:
        async with gate(service.url, scene, "--memory-tools", "core") as client:
            names = [t.name for t in (await client.list_tools()).tools]
            assert names == [*UPSTREAM_TOOLS, *CORE]
            failed, said = await call(client, "remember", text="Closed ticket 9 as a duplicate of ticket 4.")
            assert not failed and said.startswith("Saved as mem_"), said
            failed, said = await call(client, "consume_limit", name="no-such-limit")
            assert failed and "No limit named 'no-such-limit'" in said, said

    run(scenario)


def test_an_upstream_tool_named_like_a_memory_tool_stops_the_gate_with_memory_tools(
    service: InProcessService, tmp_path: Path
):
    scene = Scene(tmp_path, PROCESS)
    done = subprocess.run(
        [sys.executable, *gate_args(scene, "--memory-tools", "core")],
        env=gate_env(service.url, scene, GATE_UPSTREAM_RECALL="1"),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 1, done.stderr
    assert "memory-service gate: the upstream lists recall, a name of the memory tools too" in done.stderr
    assert "--memory-tools none" in done.stderr and "Traceback" not in done.stderr, done.stderr


# ---------------------------------------------------------------- once per key


def test_a_second_call_for_a_handled_key_is_refused_by_name(service: InProcessService, memory: MemoryClient, tmp_path):
    scene = Scene(tmp_path, PROCESS)
    item = unique("T")

    async def scenario() -> tuple[list[tuple[bool, str]], Any]:
        async with gate(service.url, scene) as client:
            answers = [await call(client, "process_item", item_id=item) for _ in range(2)]
            return answers, (await client.call_tool("process_item", {"item_id": item})).meta

    [(failed1, first), (failed2, second)], meta = run(scenario)
    assert meta["memory-service/gate"] == {"refused": "handled"}  # why, for a program
    assert not failed1 and first == f"processed {item}: closed as duplicate", first
    assert failed2, second  # the tool did not run: an error, whose text is the sentence to act on
    assert f"ticket:{item} was already handled by gate-1" in second and "do not handle it again" in second, second
    assert "closed as duplicate" in second, second  # the short result the first call recorded
    assert len(scene.runs("process_item")) == 1
    record = memory.handled.check(f"ticket:{item}")  # the ledger /v1/handled, the CLI and the console read
    assert record is not None and record.seen_count == 1


def test_twenty_concurrent_calls_of_one_key_run_the_tool_once(service: InProcessService, tmp_path: Path):
    scene = Scene(tmp_path, PROCESS)
    item = unique("T")

    async def scenario() -> list[tuple[bool, str]]:
        answers: list[tuple[bool, str]] = []
        async with gate(service.url, scene) as client:

            async def one() -> None:
                answers.append(await call(client, "process_item", item_id=item))

            async with anyio.create_task_group() as group:
                for _ in range(20):
                    group.start_soon(one)
        return answers

    answers = run(scenario)
    assert len(scene.runs("process_item")) == 1, scene.runs()
    ran = [text for failed, text in answers if text.startswith("processed")]
    refused = [text for failed, text in answers if f"ticket:{item}" in text and "do not handle it again" in text]
    assert len(ran) == 1 and len(refused) == 19, answers
    assert [failed for failed, text in answers if text in ran] == [False]


# ---------------------------------------------------------------- daily limits


def test_a_limit_of_3_runs_3_of_5_calls_and_the_refusal_names_it(
    service: InProcessService, memory: MemoryClient, tmp_path: Path
):
    limit = unique("emails")
    memory.limits.set(limit, daily_limit=3)
    scene = Scene(tmp_path, f'[tools.send_email]\nlimit = "{limit}"\n')

    async def scenario() -> list[tuple[bool, str]]:
        async with gate(service.url, scene) as client:
            return [await call(client, "send_email", to=f"u{i}@example.com", subject="digest") for i in range(5)]

    answers = run(scenario)
    assert len(scene.runs("send_email")) == 3, scene.runs()
    assert [text.startswith("sent") for _, text in answers] == [True, True, True, False, False], answers
    for failed, refusal in answers[3:]:
        assert failed and f"daily limit '{limit}'" in refusal and "3 of 3" in refusal, refusal
    assert memory.limits.get(limit).used == 3


# ---------------------------------------------------------------- failures


def test_an_upstream_error_releases_the_key_and_refunds_the_unit(
    service: InProcessService, memory: MemoryClient, tmp_path: Path
):
    limit = unique("fails")
    memory.limits.set(limit, daily_limit=5)
    policy = f"""
[tools.fail_item]
once = "fail:{{item_id}}"
limit = "{limit}"
[tools.broken_item]
once = "broken:{{item_id}}"
limit = "{limit}"
"""
    scene = Scene(tmp_path, policy)
    item = unique("F")

    async def scenario() -> None:
        async with gate(service.url, scene) as client:
            for _ in range(2):  # released: the second call runs again
                failed, said = await call(client, "fail_item", item_id=item)
                assert failed and f"could not process {item}: the queue rejected it" in said, said  # the upstream's own
            for _ in range(2):  # a protocol error is passed through as one, and released too
                with pytest.raises(MCPError, match=f"broken_item exploded on {item}"):
                    await client.call_tool("broken_item", {"item_id": item})

    run(scenario)
    assert len(scene.runs("fail_item")) == 2 and len(scene.runs("broken_item")) == 2, scene.runs()
    assert memory.limits.get(limit).used == 0  # every unit refunded
    assert memory.handled.check(f"fail:{item}") is None and memory.handled.check(f"broken:{item}") is None


def test_an_upstream_that_dies_mid_call_keeps_the_key_until_the_lease_and_the_unit_used(
    service: InProcessService, memory: MemoryClient, tmp_path: Path
):
    """No answer is not an error answer: the tool may have done its work, so nothing is released."""
    limit = unique("crashes")
    memory.limits.set(limit, daily_limit=5)
    scene = Scene(tmp_path, f'[tools.crash_item]\nonce = "crash:{{item_id}}"\nlimit = "{limit}"\nlease_s = 60\n')
    item = unique("C")

    async def scenario() -> tuple[bool, str]:
        async with gate(service.url, scene) as client:
            return await call(client, "crash_item", item_id=item)

    failed, said = run(scenario)
    assert failed and said.startswith("crash_item did not answer: the tool server stopped"), said
    assert "blocked for 60 s" in said, said

    async def again() -> tuple[bool, str]:
        async with gate(service.url, scene, agent="gate-2") as client:
            return await call(client, "crash_item", item_id=item)

    failed, said = run(again)
    assert failed and f"crash:{item} is being handled right now by gate-1" in said, said
    assert len(scene.runs("crash_item")) == 1 and memory.limits.get(limit).used == 1


def test_an_unreachable_service_fails_guarded_calls_closed_and_passes_the_others(tmp_path: Path):
    scene = Scene(tmp_path, PROCESS)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens

    async def scenario() -> None:
        async with gate(url, scene) as client:
            failed, said = await call(client, "process_item", item_id="T-1")
            assert failed and said.startswith("process_item was not run") and url in said, said
            assert "not answering" in said and "tell the user" in said, said
            failed, said = await call(client, "lookup", item_id="T-1")
            assert not failed and "open" in said, said

    run(scenario)
    assert scene.runs("process_item") == [] and len(scene.runs("lookup")) == 1


def test_a_call_without_the_keys_argument_is_not_run(service: InProcessService, tmp_path: Path):
    scene = Scene(
        tmp_path, '[tools.process_item]\nonce = "ticket:{item_id}"\n[tools.lookup]\nonce = "look:{item_id}"\n'
    )

    async def scenario() -> None:
        async with gate(service.url, scene) as client:
            failed, said = await call(client, "lookup", item_id="   ")
            assert failed and "item_id" in said and said.startswith("lookup was not run"), said

    run(scenario)
    assert scene.runs() == []


# ---------------------------------------------------------------- a gate that dies, and two gates


def wait_for_run(scene: Scene, tool: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = scene.runs(tool)
        if found:
            return found[-1]
        time.sleep(0.05)
    raise AssertionError(f"{tool} never ran")


def test_a_gate_killed_mid_call_frees_the_key_after_the_lease_and_never_after_a_finish(
    service: InProcessService, tmp_path: Path
):
    lease = 4
    scene = Scene(tmp_path, f'[tools.slow_item]\nonce = "slow:{{item_id}}"\nlease_s = {lease}\n')
    item = unique("S")

    async def killed_mid_call() -> float:
        """Gate A reserves and starts the tool, which sleeps; the gate is killed with SIGKILL meanwhile."""
        with suppress(Exception):  # the gate's death ends the session in an error: expected
            async with gate(service.url, scene, GATE_UPSTREAM_SLOW_S="120") as client:
                async with anyio.create_task_group() as group:

                    async def in_flight() -> None:
                        with suppress(Exception):
                            await client.call_tool("slow_item", {"item_id": item})

                    group.start_soon(in_flight)
                    started = await anyio.to_thread.run_sync(wait_for_run, scene, "slow_item")
                    os.kill(started["ppid"], signal.SIGKILL)  # the gate, between reserve and finish
                    os.kill(started["pid"], signal.SIGKILL)  # its orphan, so the test leaves nothing behind
                    group.cancel_scope.cancel()
        return float(started["t"])

    reserved_before = run(killed_mid_call)

    async def after() -> list[tuple[bool, str]]:
        answers = []
        async with gate(service.url, scene, agent="gate-2", GATE_UPSTREAM_SLOW_S="0.1") as client:
            answers.append(await call(client, "slow_item", item_id=item))  # the lease still holds the key
            await anyio.sleep(max(0.0, reserved_before + lease + 0.5 - time.time()))
            answers.append(await call(client, "slow_item", item_id=item))  # the lease ran out: it may run again
            answers.append(await call(client, "slow_item", item_id=item))  # finished: never again
            await anyio.sleep(lease + 0.5)
            answers.append(await call(client, "slow_item", item_id=item))  # not even after another lease
        return answers

    held, rerun, done, later = run(after)
    assert held[0], held
    assert f"slow:{item} is being handled right now by gate-1" in held[1], held
    assert not rerun[0] and rerun[1] == f"slowly processed {item}", rerun
    for failed, said in (done, later):
        assert failed and f"slow:{item} was already handled by gate-2" in said, said
    assert len(scene.runs("slow_item")) == 2, scene.runs()


def test_two_gates_on_one_service_share_the_ledger_and_the_limits(
    service: InProcessService, memory: MemoryClient, tmp_path: Path
):
    limit = unique("emails")
    memory.limits.set(limit, daily_limit=2)
    scene = Scene(tmp_path, PROCESS + f'[tools.send_email]\nlimit = "{limit}"\n')
    item = unique("T")

    async def scenario() -> None:
        async with gate(service.url, scene, agent="gate-1") as one, gate(service.url, scene, agent="gate-2") as two:
            failed, said = await call(one, "process_item", item_id=item)
            assert not failed and said.startswith("processed"), said
            failed, said = await call(two, "process_item", item_id=item)
            assert failed and f"ticket:{item} was already handled by gate-1" in said, said
            assert (await call(one, "send_email", to="a@example.com", subject="s"))[1].startswith("sent")
            assert (await call(two, "send_email", to="b@example.com", subject="s"))[1].startswith("sent")
            for client in (one, two):
                failed, said = await call(client, "send_email", to="c@example.com", subject="s")
                assert failed and f"daily limit '{limit}'" in said, said

    run(scenario)
    assert len(scene.runs("process_item")) == 1 and len(scene.runs("send_email")) == 2, scene.runs()
    assert len({line["ppid"] for line in scene.runs("send_email")}) == 2  # one run through each gate


def test_scope_agent_gives_each_agent_its_own_ledger(service: InProcessService, tmp_path: Path):
    scene = Scene(tmp_path, '[tools.process_item]\nonce = "ticket:{item_id}"\nscope = "agent"\n')
    item = unique("T")

    async def scenario() -> list[tuple[bool, str]]:
        async with gate(service.url, scene, agent="gate-1") as one, gate(service.url, scene, agent="gate-2") as two:
            return [await call(client, "process_item", item_id=item) for client in (one, two, one, two)]

    answers = run(scenario)
    assert [failed for failed, _ in answers] == [False, False, True, True], answers
    assert "was already handled by gate-1" in answers[2][1] and "was already handled by gate-2" in answers[3][1]
    assert len(scene.runs("process_item")) == 2


# ---------------------------------------------------------------- start-up, and the HTTP transport


def test_a_policy_for_a_tool_the_upstream_does_not_list_is_a_warning(service: InProcessService, tmp_path: Path):
    scene = Scene(
        tmp_path, PROCESS + '[tools.procss_item]\nonce = "ticket:{item_id}"\n[tools.lookup]\nonce = "l:{id}"\n'
    )
    stderr = tmp_path / "gate.err"
    params = StdioServerParameters(
        command=sys.executable, args=gate_args(scene), env=gate_env(service.url, scene), cwd=str(ROOT)
    )

    async def scenario() -> list[str]:
        with stderr.open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                return [t.name for t in (await session.list_tools()).tools]

    assert "lookup" in run(scenario)  # it serves
    said = stderr.read_text()
    assert f"policy file {scene.policy} guards 'procss_item', which the upstream" in said, said
    assert "[tools.lookup]: once uses {id}, which is not among the tool's arguments (item_id)" in said, said
    assert "Traceback" not in said


@pytest.mark.parametrize(
    ("upstream", "said"),
    [
        (["/nonexistent/tools-server"], "cannot start the upstream MCP server (/nonexistent/tools-server)"),
        ([sys.executable, "-c", "print('hello')"], "failed the MCP handshake"),
    ],
    ids=["no-such-command", "not-mcp"],
)
def test_an_upstream_that_cannot_start_is_one_message(tmp_path: Path, upstream: list[str], said: str):
    scene = Scene(tmp_path, PROCESS)
    args = [*gate_args(scene)[: gate_args(scene).index("--") + 1], *upstream]
    done = subprocess.run(
        [sys.executable, *args],
        env=gate_env(f"http://127.0.0.1:{free_port()}", scene),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 1, done.stderr
    assert f"memory-service gate: {'the upstream' if 'handshake' in said else 'cannot'}" in done.stderr, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_gate_over_streamable_http(service: InProcessService, tmp_path: Path):
    scene = Scene(tmp_path, PROCESS)
    port = free_port()
    log = (tmp_path / "gate-http.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, *gate_args(scene, "--transport", "http", "--port", str(port))],
        env=gate_env(service.url, scene),
        cwd=str(ROOT),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    item = unique("H")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "gate-http.log").read_text()
                time.sleep(0.2)

        async def scenario() -> list[tuple[bool, str]]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                assert "process_item" in [t.name for t in (await client.list_tools()).tools]
                return [await call(client, "process_item", item_id=item) for _ in range(2)]

        (_, first), (_, second) = run(scenario)
        assert first.startswith("processed") and f"ticket:{item} was already handled" in second, (first, second)
        assert len(scene.runs("process_item")) == 1
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
        log.close()


# ---------------------------------------------------------------- docs/gate.md's snippets, as written

DOC = ROOT / "docs" / "gate.md"


def doc_section() -> str:
    return DOC.read_text().split("## MCP: memory-service gate", 1)[1].split("\n## ", 1)[0]


def test_the_docs_commands_and_flags_exist() -> None:
    from test_readme import commands, unknown_cli

    from memory_service.cli.main import build_parser

    found = commands(doc_section())
    assert any(words[:1] == ["gate"] for words in found), found
    parser = build_parser()
    # what follows `--` is the upstream's command line, not ours
    problems = [
        p for words in found for p in unknown_cli(words[: words.index("--")] if "--" in words else words, parser)
    ]
    assert problems == []


def console_script(tmp_path: Path) -> Path:
    """A `memory-service` on PATH that runs this checkout's package, as the venv's console script runs the
    installed one (the harness passes the gate no PYTHONPATH: the SDK hands a child only HOME, PATH, ...)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "memory-service"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m memory_service "$@"\n')
    script.chmod(0o755)
    return folder


def test_the_docs_snippets_run_as_written(service: InProcessService, tmp_path: Path) -> None:
    """The policy file, the tool server and the harness of docs/gate.md, in a fresh interpreter: only the URL and
    the key are put in, and `memory-service` is found on PATH."""
    policies = re.findall(r"```toml\n(.*?)```", doc_section(), flags=re.S)
    tools, harness = re.findall(r"```python\n(.*?)```", doc_section(), flags=re.S)
    assert len(policies) == 1 and "MCPServer" in tools and "StdioServerParameters" in harness
    (tmp_path / "gate.toml").write_text(policies[0])
    (tmp_path / "my_tools.py").write_text(tools)
    code = harness.replace("http://127.0.0.1:8700", service.url).replace('"KEY"', '"key-a"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    env["PATH"] = os.pathsep.join((str(console_script(tmp_path)), env.get("PATH", "")))
    ran = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert lines[0] == "['process_item', 'send_email']", ran.stdout
    assert lines[1] == "process_item ran: processed 42: closed as duplicate", ran.stdout
    assert lines[2].startswith("process_item refused: ticket:42 was already handled by triage-2 at "), ran.stdout
    assert lines[2].endswith("(process_item: 'processed 42: closed as duplicate'); do not handle it again."), ran.stdout
    assert lines[3] == "send_email ran: sent 'Your ticket' to ana@example.com", ran.stdout
    assert lines[4].startswith("send_email refused: The daily limit 'emails' is used up: 1 of 1 today"), ran.stdout
