"""The package's shape, kept by a test: a small root, short modules and functions.

Which way imports point is test_import_contracts.py's.

Static reads of the source (no imports), so they run in the fast tier in well under a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "memory_service"
ROOT_MODULES = {"__init__.py", "__main__.py", "config.py", "services.py", "logs.py", "metrics.py", "app.py"}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
# modules allowed past the cap, each with its reason: a split there would be by the count, not by meaning
LONGER_MODULES = {
    "memory_service/services.py": (
        600,
        "the one facade the HTTP edge awaits and the owner of every pool: a reader finds all a route may do in one file",
    ),
}


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_package_root_holds_only_the_leaves_and_the_composition_root() -> None:
    assert {p.name for p in PACKAGE.glob("*.py")} <= ROOT_MODULES


def test_no_module_is_over_400_lines_and_no_function_over_80() -> None:
    long_modules = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in _sources()
        if (n := p.read_text().count("\n")) > LONGER_MODULES.get(str(p.relative_to(ROOT)), (MAX_MODULE_LINES,))[0]
    ]
    long_functions = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length}")
    assert long_modules == [] and long_functions == []
