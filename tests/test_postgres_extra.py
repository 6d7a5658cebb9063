"""PostgreSQL's driver is the [postgres] extra: a SQLite-only install has none, and a postgresql:// URL on such
an install stops with the one command that fixes it, not a traceback or "PostgreSQL is unreachable".

Why: psycopg (with its binary libpq) was a dependency of every install, though only MEMORY_DATABASE_URL or
`migrate --to` use it. The tests below run the real console script in an interpreter where `import psycopg`
fails, as it does without the extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT

from memory_service.storage.datadir import DataDir

CLI = Path(sys.executable).parent / "memory-service"
FIX = "pip install 'memory-service[postgres]'"
URL = "postgresql://memory@127.0.0.1:9/memory"  # never reached: the driver is missing first
BLOCK_DRIVER = '''
import sys


class _NoDriver:
    """An install without the [postgres] extra: psycopg and its pool are not there."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("psycopg", "psycopg_pool", "psycopg_binary"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoDriver())
'''


def _name(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()


def test_the_driver_is_an_extra_that_dev_installs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert "psycopg" not in {_name(r) for r in project["dependencies"]}
    assert "psycopg" in {_name(r) for r in extras["postgres"]}
    assert "memory-service[postgres]" in extras["dev"]  # test.sh and CI install dev: the PostgreSQL tests run


def _without_driver(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCK_DRIVER)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), **env}
    check = subprocess.run(
        [sys.executable, "-c", "import psycopg"], env=environment, capture_output=True, text=True, timeout=60
    )
    assert check.returncode != 0, "the driver was not blocked"
    return subprocess.run([str(CLI), *args], env=environment, capture_output=True, text=True, timeout=120)


@pytest.mark.process
def test_serve_with_a_postgres_url_names_the_extra(tmp_path: Path) -> None:
    out = _without_driver(
        tmp_path,
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
        MEMORY_DATABASE_URL=URL,
        MEMORY_LLM_URL="http://127.0.0.1:9",
    )
    assert out.returncode == 1, out.stderr
    assert FIX in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "unreachable" not in out.stderr  # the server was never the problem


@pytest.mark.process
def test_migrate_to_postgres_names_the_extra(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data")
    data.prepare()
    data.open_journal().close()  # a data dir with a journal: what migrate copies
    out = _without_driver(tmp_path, "migrate", "--to", URL, "--data-dir", str(data.path))
    assert out.returncode == 1, out.stderr
    assert FIX in out.stdout + out.stderr and "Traceback" not in out.stderr, out.stdout + out.stderr
