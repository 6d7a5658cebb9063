"""Hermes Agent's Hindsight memory plugin, in its `local_external` mode (any URL), against this service.

`hermes-agent[hindsight]` 0.19.0 from PyPI pins its own dependencies (pydantic, rich, httpx, ...) and
`hindsight-client` 0.6.1, so it lives in a venv of its own, built once under the data cache
(`~/.cache/memory-service/venvs/`) and reused. A driver in that venv calls the plugin's own entry points, as
Hermes does, with no LLM: `initialize`, the `hindsight_retain` and `hindsight_recall` tools, `sync_turn` for two
chat turns, `shutdown` (which flushes its writer). The service is the real one in this process.

Two things the plugin does that this service had to serve (docs/hindsight.md): it probes `GET /version` and,
from API 0.5.0 on, saves each new turn with `update_mode: "append"` into the session's document (before, a
service without /version got the whole session re-sent under one document id per process, and kept only the
first turn); and it recalls `observation` only by default (here: the facts, when nothing consolidates).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import CACHE
from inprocess import InProcessService

from tests.fakes.fake_llama_server import FakeLlamaServer

pytestmark = pytest.mark.process  # a venv of its own, pip, and the plugin's process

HERMES = "hermes-agent[hindsight]==0.19.0"
VENV = CACHE / "venvs" / "hermes-agent-0.19.0"

DRIVE = """
import json, os, sys, time, pathlib
url, home = sys.argv[1], pathlib.Path(sys.argv[2])
(home / "hindsight").mkdir(parents=True, exist_ok=True)
(home / "hindsight" / "config.json").write_text(json.dumps(
    {"mode": "local_external", "api_url": url, "api_key": "key-a", "bank_id": "hermes-bank", "timeout": 60}))
from plugins.memory.hindsight import HindsightMemoryProvider
from importlib.metadata import version
hermes = HindsightMemoryProvider()
hermes.initialize("session-7")
out = {"mode": hermes._mode, "client": version("hindsight-client")}
out["retain"] = json.loads(hermes.handle_tool_call("hindsight_retain", {"content": "The Heron archive moved to vault 12."}))
deadline = time.monotonic() + 90  # its facts are extracted in the background; the plugin recalls observations
while True:
    out["recall"] = json.loads(hermes.handle_tool_call("hindsight_recall", {"query": "Heron archive vault"}))
    if "vault 12" in json.dumps(out["recall"]) or time.monotonic() > deadline:
        break
    time.sleep(0.5)
hermes.sync_turn("My cat is called Miso.", "Noted: your cat is Miso.")
hermes.sync_turn("I moved to Lisbon in March.", "Got it, Lisbon since March.")
hermes.shutdown()
print(json.dumps(out))
"""


def _no_index(output: str) -> bool:
    signs = ("Could not find a version", "No matching distribution", "Failed to establish", "Network is unreachable")
    return any(sign in output for sign in signs)


def hermes_python() -> Path:
    """The cached venv's interpreter; built (a few minutes, once) when missing or of another version."""
    python, marker = VENV / "bin" / "python", VENV / ".installed"
    if marker.exists() and marker.read_text() == HERMES and python.exists():
        return python
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", HERMES]
    installed = subprocess.run(pip, capture_output=True, text=True)
    if installed.returncode != 0 and _no_index(installed.stdout + installed.stderr):
        shutil.rmtree(VENV, ignore_errors=True)
        pytest.skip(f"pip could not reach a package index for {HERMES}: {installed.stderr[-300:]}")
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    marker.write_text(HERMES)
    return python


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", n_ctx=4096, tokens_per_s=5000) as fake:
        with InProcessService(tmp_path_factory.mktemp("hermes") / "data", fake.url) as svc:
            yield svc


def test_hermes_hindsight_plugin_retains_recalls_and_keeps_every_turn(service: InProcessService, tmp_path) -> None:
    python = hermes_python()
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMORY_", "HINDSIGHT_", "HERMES_"))}
    env.update({"HERMES_HOME": str(home), "HOME": str(home)})  # no ~/.hindsight of the machine's user is read
    ran = subprocess.run(
        [str(python), "-c", DRIVE, service.url, str(home)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["mode"] == "local_external" and out["client"] == "0.6.1", out
    assert out["retain"] == {"result": "Memory stored successfully."}, out
    assert "vault 12" in out["recall"]["result"], out  # its default recall_types: observation only
    with httpx.Client(base_url=service.url, headers={"Authorization": "Bearer key-a"}, timeout=30) as http:
        session = http.get("/v1/default/banks/hermes-bank/documents/session-7")
        assert session.status_code == 200, session.text  # the session's document: appended to, turn by turn
        text = session.json()["original_text"]
        assert "Miso" in text and "Lisbon" in text, text
        other = httpx.get(
            service.url + "/v1/default/banks/hermes-bank/documents", headers={"Authorization": "Bearer key-b"}
        )
        assert other.json()["total"] == 0  # another team's key sees none of it
