"""The command line as people and scripts meet it: the commonest mistakes answer one sentence on stderr that names
the URL, file or flag (no traceback unless --debug), exit codes follow the table in `memory-service --help`.

Every case runs the real console script (`.venv/bin/memory-service`) in a subprocess against the real service in
this process (on a loopback port, the fake llama-server behind it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT
from fakes.fake_llama_server import FakeLlamaServer
from inprocess import InProcessService

from memory_service.llm.runtime.server import free_port

pytestmark = pytest.mark.process  # the CLI in its own process

SCRIPT = str(Path(sys.executable).with_name("memory-service"))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("cli-people") / "data", fake.url).start()
        yield svc
        svc.stop()


# the embedder's cache and choice stay: backup/restore/reindex load it
KEPT = ("MEMORY_CACHE_DIR", "MEMORY_EMBED_THREADS", "MEMORY_EMBEDDER")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_") or k in KEPT}


def cli(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`memory-service ARGV` as a person types it, with no MEMORY_* variable from this environment."""
    return subprocess.run([SCRIPT, *argv], cwd=ROOT, env=ENV, input=stdin, capture_output=True, text=True, timeout=300)


def on_a_terminal(*argv: str) -> tuple[int, str, str]:
    """`memory-service ARGV` with stderr on a terminal (a pty), as a person sees it: (exit code, stdout, stderr)."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([SCRIPT, *argv], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            piece = os.read(leader, 1 << 16)
        except OSError:  # EIO: the command closed the terminal
            break
        if not piece:
            break
        seen += piece
    os.close(leader)
    out = proc.stdout.read() if proc.stdout else b""
    return proc.wait(timeout=300), out.decode(), seen.decode(errors="replace")


def on(service: InProcessService, key: str | None = "key-a") -> list[str]:
    return ["--url", service.url, *(["--api-key", key] if key else [])]


def explained(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The run failed with `code`, said so on stderr only, in words (no traceback) that include `words`."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stdout == "", result.stdout + result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    return result.stderr


def test_service_down_names_the_url_and_how_to_start_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    err = explained(cli("recall", "email quota", "--url", url), 1, url, "memory-service serve", "--url")
    assert len(err.splitlines()) <= 2


def test_debug_shows_the_traceback() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for argv in (["--debug", "list", "--url", url], ["list", "--url", url, "--debug"]):
        result = cli(*argv)
        assert result.returncode == 1 and "Traceback" in result.stderr and "ConnectError" in result.stderr
        assert url in result.stderr.splitlines()[-2]  # the sentence still ends it


def test_a_url_without_a_scheme_is_read_as_http(service: InProcessService) -> None:
    bare = service.url.removeprefix("http://")
    result = cli("--json", "list", "--url", bare, "--api-key", "key-a")
    assert result.returncode == 0, result.stderr
    assert "items" in json.loads(result.stdout)
    explained(cli("list", "--url", "ftp://" + bare), 2, "--url", "http://")


def test_a_missing_import_file_is_named(service: InProcessService, tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    explained(cli("import", str(missing), *on(service)), 1, str(missing), "No such file")


def test_a_bad_key_is_explained(service: InProcessService) -> None:
    err = explained(cli("list", *on(service, "not-a-key")), 1, "401", "--api-key", "keys create")
    assert len(err.splitlines()) <= 3


def test_an_import_whose_lines_failed_exits_1(service: InProcessService, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\nnot json\n{"id": "x"}\n')
    result = cli("--json", "import", str(bad), *on(service))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert json.loads(result.stdout)["failed"] == 3
    assert "3 of 3 lines failed" in result.stderr


def test_bulk_forget_asks_for_the_flag_not_the_api_parameter(service: InProcessService) -> None:
    err = explained(cli("forget", "--agent-id", "nobody", *on(service)), 2, "--yes")
    assert "confirm=true" not in err


def test_version_and_the_exit_code_table() -> None:
    from importlib.metadata import version

    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"memory-service {version('memory-service')}"
    helped = cli("--help").stdout
    assert "exit codes" in helped and "130" in helped and "limits" in helped
    handled = cli("limits", "handled", "--help").stdout
    assert "with --check" in handled and "never handled" in handled


def test_people_get_lines_and_scripts_get_json(service: InProcessService, tmp_path: Path) -> None:
    """remember --wait prints the facts it waited for; recall prints the context block and scored hits; list
    and get short lines; export --out says what it wrote. --json (before or after the command) keeps the
    service's answer for scripts."""
    text = "The boiler in building 7 was serviced on Monday; its pressure is 1.5 bar."
    saved = cli("remember", text, "--agent-id", "janitor", "--wait", "60", *on(service))
    assert saved.returncode == 0, saved.stderr
    assert "fact" in saved.stdout and "{" not in saved.stdout and "done" in saved.stdout, saved.stdout
    memory_id = saved.stdout.split()[0]

    human = cli("recall", "boiler pressure", "-k", "3", *on(service))
    assert human.returncode == 0 and "{" not in human.stdout, human.stdout
    assert "[" in human.stdout.splitlines()[0] and "janitor]" in human.stdout.splitlines()[0]  # the context block
    assert "score" in human.stdout and memory_id in human.stdout
    machine = cli("recall", "boiler pressure", "-k", "3", "--json", *on(service))
    assert json.loads(machine.stdout)["items"][0]["memory_id"] == memory_id
    context = cli("recall", "boiler pressure", "--context", *on(service)).stdout
    assert "score" not in context and "boiler" in context

    listed = cli("list", "--agent-id", "janitor", *on(service)).stdout
    assert memory_id in listed and "boiler" in listed and "{" not in listed
    assert (
        json.loads(cli("--json", "list", "--agent-id", "janitor", *on(service)).stdout)["items"][0]["id"] == memory_id
    )
    shown = cli("get", memory_id, *on(service)).stdout
    assert shown.startswith(memory_id) and "fact" in shown and "{" not in shown

    dump = tmp_path / "team.jsonl"
    wrote = cli("export", "--out", str(dump), *on(service))
    count = len(dump.read_text().splitlines())
    assert wrote.returncode == 0 and f"exported {count} memor" in wrote.stdout and str(dump) in wrote.stdout
    assert json.loads(cli("export", "--out", str(dump), "--json", *on(service)).stdout)["exported"] == count
    assert "imported 0, skipped" in cli("import", str(dump), *on(service)).stdout


def test_every_argument_has_help() -> None:
    from memory_service.cli.main import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("remember", "recall", "get", "list", "forget", "export", "import"):
        for action in commands[name]._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_long_commands_show_progress_on_a_terminal_only(service: InProcessService, tmp_path: Path) -> None:
    """import, export, remember --wait, backup, restore and reindex draw bars with counts on stderr when it is a
    terminal; in a pipe stderr stays empty (errors only) and stdout holds only the answer."""
    with service.client("key-a") as client:
        for n in range(3):
            client.post("/v1/remember", json={"text": f"Progress note {n}: the fern needs water.", "agent_id": "fern"})
    dump = tmp_path / "team.jsonl"
    code, out, err = on_a_terminal("export", "--out", str(dump), *on(service))
    count = len(dump.read_text().splitlines())
    assert code == 0 and f"exported {count}" in out and "exporting" in err and f"{count}/{count} memories" in err, err
    piped = cli("export", "--out", str(dump), *on(service))
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr

    code, out, err = on_a_terminal("import", str(dump), *on(service))
    assert code == 0 and "importing" in err and f"{count}/{count} lines" in err, err
    code, out, err = on_a_terminal(
        "remember", "The fern got water today.", "--agent-id", "fern", "--wait", "60", *on(service)
    )
    assert code == 0 and "extracting facts" in err and "fact" in out, out + err

    backup_dir, restored = tmp_path / "backup", tmp_path / "restored"
    code, out, err = on_a_terminal("backup", str(backup_dir), "--data-dir", str(service.data_dir))
    assert code == 0 and "copying" in err and "backup done" in out, out + err
    code, out, err = on_a_terminal("restore", str(backup_dir), "--data-dir", str(restored))
    assert code == 0 and "embedding saved texts" in err and "restore done" in out, out + err  # vectors rebuilt
    code, out, err = on_a_terminal("reindex", "--data-dir", str(restored))
    assert code == 0 and "embedding facts" in err and "reindex done" in out, out + err
    quiet = cli("--json", "backup", str(tmp_path / "again"), "--data-dir", str(service.data_dir))
    assert quiet.returncode == 0 and quiet.stderr == "" and json.loads(quiet.stdout)["memories"] >= 3


def test_a_key_pinned_to_an_agent_forgets_only_its_own_and_is_told_why(service: InProcessService) -> None:
    """`forget` with a key pinned to one agent (issue 53): another agent's memory is a 404 like an unknown id, a
    bulk forget of another agent is refused with a hint about the pin (it said before: "this key's role does
    not allow it", sending the person to look for a role), a bad --agent-id names the flag (it named
    `query.agent_id`), a bulk forget by run counts only its own agent's, and no other agent's memory goes."""
    admin = service.services.keys.create("team-a", "admin", agent_id="pin-mine").key
    api = service.client("key-a")
    ids = {
        agent: [
            api.post(
                "/v1/remember", json={"text": f"{agent} filed report {i}.", "agent_id": agent, "run_id": "pin-run"}
            ).json()["id"]
            for i in range(n)
        ]
        for agent, n in (("pin-mine", 2), ("pin-other", 3))
    }
    err = explained(cli("forget", ids["pin-other"][0], *on(service, admin)), 1, "404", "no memory with id")
    assert "pin-other" not in err
    err = explained(cli("forget", "--agent-id", "pin-other", "--yes", *on(service, admin)), 1, "403", "pinned")
    assert "role" not in err and "leave out --agent-id" in err
    err = explained(cli("forget", "--agent-id", "not an id!", "--yes", *on(service, admin)), 1, "422", "--agent-id")
    assert "query." not in err
    result = cli("forget", "--run-id", "pin-run", "--yes", *on(service, admin))
    assert result.returncode == 0 and result.stdout.strip() == "forgot 2 memories", result.stdout + result.stderr
    assert [api.get(f"/v1/memories/{i}").status_code for i in ids["pin-other"]] == [200] * 3
    assert [api.get(f"/v1/memories/{i}").status_code for i in ids["pin-mine"]] == [404] * 2
