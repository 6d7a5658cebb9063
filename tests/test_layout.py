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


def test_the_mcp_server_imports_only_the_wire_the_client_and_the_http_guards() -> None:
    """The MCP server is a client of the API (issue 45): besides itself, contract/ and client/, only the leaf
    config and the two HTTP guards that load no store (api/host_names.py, api/http_guard.py), lazy imports too."""
    may = {"mcp_server", "contract", "client", "config", "api.host_names", "api.http_guard"}
    problems = []
    for path in (PACKAGE / "mcp_server").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                target = "mcp_server" if node.level == 1 else node.module or ""
                if target not in may and target.split(".")[0] not in may:
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {'.' * node.level}{node.module}")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                problems += [f"{path.relative_to(ROOT)}: {n}" for n in names if n and n.startswith("memory_service")]
    assert problems == []
