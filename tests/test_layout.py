"""The package's shape, kept by a test: a small root, short modules and functions, a wire that stands alone.

Static reads of the source (no imports), so they run in the fast tier in well under a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "memory_service"
ROOT_MODULES = {"__init__.py", "__main__.py", "config.py", "services.py", "logs.py", "metrics.py"}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_package_root_holds_only_the_leaves_and_the_composition_root() -> None:
    assert {p.name for p in PACKAGE.glob("*.py")} <= ROOT_MODULES


def test_no_module_is_over_400_lines_and_no_function_over_80() -> None:
    long_modules = [f"{p.relative_to(ROOT)}: {n}" for p in _sources() if (n := p.read_text().count("\n")) > 400]
    long_functions = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length}")
    assert long_modules == [] and long_functions == []


def test_the_contract_and_the_client_import_nothing_of_the_server() -> None:
    """Read from the source, lazy imports included: contract/ needs only itself, client/ only contract/,
    integrations/ (the framework adapters, over the client) only client/ and contract/."""
    allowed = {
        "contract": {"contract"},
        "client": {"contract", "client"},
        "integrations": {"contract", "client", "integrations"},
    }
    problems = []
    for folder, may in allowed.items():
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level:
                    # `from .x import` stays in the folder; `from ..y import` names a sibling folder
                    target = folder if node.level == 1 else (node.module or "").split(".")[0]
                    if target not in may:
                        problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {'.' * node.level}{node.module}")
                elif isinstance(node, ast.ImportFrom | ast.Import):
                    names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                    problems += [
                        f"{path.relative_to(ROOT)}: {n}" for n in names if n and n.startswith("memory_service")
                    ]
    assert problems == []


def test_extraction_imports_only_the_contract_and_no_http() -> None:
    """extraction/ stays pure over `completion.py`'s protocol: llm/ (the llama-server client) sits above it."""
    problems = []
    for path in (PACKAGE / "extraction").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 1:
                if (node.module or "").split(".")[0] != "contract":
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {'.' * node.level}{node.module}")
            elif isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                bad = [n for n in names if n and n.split(".")[0] in {"memory_service", "httpx"}]
                problems += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in bad]
    assert problems == []
