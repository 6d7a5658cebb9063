"""The client alone: `pip install ./clients/python` brings httpx and pydantic, not the server.

clients/python/ is a second distribution, `memory-service-client`, whose `memory_service/client` and
`memory_service/contract` are symlinks to the package's own folders. The slow test installs it into a fresh
venv and talks to the real service from there; the quick ones hold the client to its imports.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT
from inprocess import InProcessService

from tests.fakes.fake_llama_server import FakeLlamaServer

SLIM = ROOT / "clients" / "python"
PACKAGE = ROOT / "memory_service"
# what the slim distribution may import besides the standard library
ALLOWED_THIRD_PARTY = {"httpx", "pydantic"}
SERVER_DISTRIBUTIONS = {"chromadb", "onnxruntime", "kubernetes", "fastapi", "uvicorn", "psycopg", "torch"}


def _imports(folder: Path) -> set[str]:
    """Absolute top-level modules and package-relative targets (`..contract`) imported by `folder`'s modules."""
    found: set[str] = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.level >= 2:
                found.add("memory_service." + (node.module or "").split(".")[0])
    return found


def test_the_client_and_the_contract_import_nothing_else_of_the_service():
    """What the slim distribution ships must be all it needs: no `..config`, no `..storage`."""
    imported = _imports(PACKAGE / "client") | _imports(PACKAGE / "contract")
    ours = {name for name in imported if name.startswith("memory_service.")}
    third_party = {name for name in imported if name not in sys.stdlib_module_names} - ours - {"__future__"}
    assert ours <= {"memory_service.contract"}, ours
    assert third_party <= ALLOWED_THIRD_PARTY, third_party


def test_the_slim_distribution_is_the_packages_own_source_and_version():
    slim = tomllib.loads((SLIM / "pyproject.toml").read_text())["project"]
    full = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert slim["version"] == full["version"]
    for part in ("client", "contract", "__init__.py"):
        assert (SLIM / "memory_service" / part).resolve() == (PACKAGE / part).resolve()
    assert not {dep.split(">")[0].split("=")[0] for dep in slim["dependencies"]} & SERVER_DISTRIBUTIONS


USE = """
import importlib.util, json, sys
from memory_service.client import MemoryClient, NotFound
with MemoryClient(sys.argv[1], api_key="key-a") as memory:
    saved = memory.remember("The slim client saved this note about the canal lock.", agent_id="slim", wait_s=30)
    found = memory.recall("canal lock", k=3)
    try:
        memory.get("m-nope")
    except NotFound as exc:
        missing = exc.status
print(json.dumps({
    "saved": saved.status, "found": found.items[0].memory_id == saved.id, "missing": missing,
    "server": sorted(m for m in sys.argv[2:] if importlib.util.find_spec(m)),
}))
"""


def _no_index(output: str) -> bool:
    signs = ("Could not find a version", "No matching distribution", "Failed to establish", "Network is unreachable")
    return any(sign in output for sign in signs)


@pytest.mark.process  # a fresh venv, pip, and a client process against the real service
def test_pip_installs_the_client_alone_into_a_clean_venv(tmp_path):
    source = tmp_path / "source"  # a copy with the symlinks resolved: the build writes nothing into the repo
    shutil.copytree(SLIM, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    # an empty venv, filled by this venv's pip through --python: ensurepip's own pip (seconds of a 2-core
    # machine, a minute under load) is not what is tested; --no-compile: bytecode is written on import anyway
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check"]
    installed = subprocess.run([*pip, "install", "--no-compile", str(source)], capture_output=True, text=True)
    if installed.returncode != 0 and _no_index(installed.stdout + installed.stderr):
        pytest.skip(f"pip could not reach a package index for httpx and pydantic: {installed.stderr[-300:]}")
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    listed = subprocess.run([*pip, "list", "--format=json"], capture_output=True, text=True, check=True)
    names = {row["name"].lower() for row in json.loads(listed.stdout)}
    assert "memory-service-client" in names and "httpx" in names and not names & SERVER_DISTRIBUTIONS, names
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        service = InProcessService(tmp_path / "data", fake.url).start()
        try:
            used = subprocess.run(
                [python, "-c", USE, service.url, *sorted(SERVER_DISTRIBUTIONS)],
                capture_output=True,
                text=True,
                cwd=tmp_path,  # not the clone: the import must come from the venv
                timeout=120,
            )
        finally:
            service.stop()
    assert used.returncode == 0, used.stderr
    assert json.loads(used.stdout) == {"saved": "done", "found": True, "missing": 404, "server": []}
