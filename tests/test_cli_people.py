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


def cli(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`memory-service ARGV` as a person types it, with no MEMORY_* variable from this environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    return subprocess.run([SCRIPT, *argv], cwd=ROOT, env=env, input=stdin, capture_output=True, text=True, timeout=120)


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
