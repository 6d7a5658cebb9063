"""The architecture's import rules as contracts (`[tool.importlinter]` in pyproject.toml), checked by
import-linter: the package keeps them, and each contract fails when one import breaking it is injected
into a copy of the package, so no contract passes only because it checks nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT
from importlinter import configuration
from importlinter.application import use_cases

PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# contract id -> (a file of the package, an import that breaks that contract from there)
INJECTED = {
    "layers": ("storage/journal.py", "from ..pipeline import worker"),
    "wire": ("client/core.py", "from ..storage import journal"),
    "mcp": ("mcp_server/tools.py", "from ..storage import keys"),
    "proxy": ("proxy/brief.py", "from ..recall import context"),
    "gate": ("gate/guard.py", "from ..services import Services"),
    "storage": ("storage/catalog.py", "from ..extraction import grounding"),
    "leaves": ("llm/runtime/__init__.py", "from ...storage import datadir"),
    "extraction": ("extraction/prompt.py", "from ..llm import client"),
    "edge": ("api/routes/team.py", "from ...storage import journal"),
}


def _contract_ids() -> list[str]:
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return [c["id"] for c in config["contracts"]]


def test_the_package_keeps_every_import_contract(capsys: pytest.CaptureFixture[str]) -> None:
    """In process, through import-linter's use case rather than its CLI function, which reconfigures logging
    (every logger the tests after it read would be disabled)."""
    configuration.configure()
    kept = use_cases.lint_imports(config_filename=str(PYPROJECT), cache_dir=None, no_logo=True)
    assert kept, capsys.readouterr().out


def test_every_contract_has_an_injected_violation() -> None:
    assert sorted(_contract_ids()) == sorted(INJECTED)


@pytest.mark.process
@pytest.mark.parametrize("contract", sorted(INJECTED))
def test_a_contract_fails_on_an_injected_import(contract: str, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "memory_service", tmp_path / "memory_service", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    path, line = INJECTED[contract]
    target = tmp_path / "memory_service" / path
    target.write_text(target.read_text() + f"\n{line}  # injected\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", "--contract", contract],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BROKEN" in run.stdout and "injected" not in run.stderr
