"""The installed package stands on its own: `memory-service bench` and `eval` work without the checkout.

Two checks. In this process: every module under memory_service imports, none of them reaches for the
repository's scripts/ (at import or lazily), and no source edits the import path. Then for real: a wheel
is built from the sources, installed into a fresh virtualenv, and its console script runs from a
directory outside the checkout. The fresh venv borrows the heavy dependencies (torch, chromadb) from
this interpreter's site-packages through a .pth line instead of installing them; a plain path line
does not run the .pth files of that directory, so a development (editable) install of
memory_service there cannot shadow the wheel, and the test checks that the wheel is what ran.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import memory_service

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "memory_service"


def _sources() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def test_checkout_under_test_is_the_one_imported() -> None:
    """Otherwise everything below would inspect some other copy of the package."""
    assert Path(memory_service.__file__).resolve().parent == PACKAGE_DIR


def test_every_module_imports_without_scripts_or_import_path_edits() -> None:
    path_before = list(sys.path)
    names = [info.name for info in pkgutil.walk_packages(memory_service.__path__, "memory_service.")]
    assert {
        "memory_service.bench.cli",
        "memory_service.bench.limits",
        "memory_service.evals.cli",
        "memory_service.evals.personaext",
    } <= set(names)
    for name in names:
        module = importlib.import_module(name)
        assert Path(module.__file__).resolve().is_relative_to(PACKAGE_DIR), name
    assert [m for m in sys.modules if m == "scripts" or m.startswith("scripts.")] == []
    assert sys.path == path_before, "importing the package changed the import path"
    # the limits benchmark blocks a *missing* sniffio for its own client only when it runs, never on import
    assert sys.modules.get("sniffio", "absent") is not None


def test_no_source_imports_scripts_or_edits_the_import_path() -> None:
    """Static, so lazy imports inside functions count too; package-internal imports are relative."""
    problems: list[str] = []
    for path in _sources():
        text = path.read_text()
        where = path.relative_to(ROOT)
        if "sys.path" in text:
            problems.append(f"{where}: mentions sys.path")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in ("scripts", "memory_service"):
                    problems.append(f"{where}:{node.lineno}: imports {module}")
    assert problems == []


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


# Runs inside the fresh venv: where the package came from, and the PersonaExt harness's pure functions
# (load a .jsonl, score hand-made extraction results, draw the plot) on a two-line file.
INSTALLED_PROBE = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    import memory_service, memory_service.bench.cli, memory_service.evals.cli
    from memory_service.testbed.results import save_plot
    from memory_service.evals import personaext

    data = Path("dev.jsonl")
    data.write_text(
        json.dumps({"triplets": [{"tokens": ["i", "like", "green", "tea", "."], "head": [0], "tail": [2, 3],
                                  "label": "like_drink"}]}) + "\\n"
        + json.dumps({"tokens": ["hello", "there", "!"]}) + "\\n")
    assert personaext.is_personaext(data)
    utterances = personaext.load(data, limit=None)
    assert [(u.text, u.tail, u.label) for u in utterances] == [
        ("i like green tea.", "green tea", "like_drink"), ("hello there!", None, None)]
    facts = {0: ["The speaker likes Green Tea."], 1: []}
    rows = [{"text": u.text, "label": u.label, "tail": u.tail, "status": "done", "facts": facts[u.index],
             "rejected": [], "reject_reasons": [], "proposed": len(facts[u.index]), "stored": len(facts[u.index]),
             "merged": 0, "predicted_n": 12, "wall_s": 0.5,
             "tail_in_facts": bool(u.tail) and any(personaext.phrase_in(u.tail, f) for f in facts[u.index]),
             "tail_in_facts_lenient": False, "tail_in_proposed": False} for u in utterances]
    result = personaext.summarize(rows)
    assert save_plot(personaext.plot, result, Path("personaext.png"))
    print(json.dumps({
        "package": memory_service.__file__, "bench": memory_service.bench.cli.__file__,
        "evals": memory_service.evals.cli.__file__, "metrics": result["metrics"],
        "png": Path("personaext.png").stat().st_size,
        "scripts": [m for m in sys.modules if m == "scripts" or m.startswith("scripts.")],
    }))
""")


@pytest.mark.process  # pip and a fresh venv
def test_wheel_installed_in_a_fresh_venv_runs_bench_and_eval(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")

    # 1. a wheel from a copy of the sources (an in-tree build would leave build/ and *.egg-info in the checkout)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PACKAGE_DIR, src / "memory_service", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "-w",
            str(dist),
            str(src),
        ],
        cwd=tmp_path,
        env=env,
    )
    wheels = list(dist.glob("memory_service-*.whl"))
    assert len(wheels) == 1, wheels

    # 2. a fresh venv with only the wheel installed; this interpreter's pip installs into it (--python)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, env=env)
    venv_python = venv / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv_python),
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            str(wheels[0]),
        ],
        cwd=tmp_path,
        env=env,
    )
    venv_site = Path(
        _run(
            [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path, env=env
        ).stdout.strip()
    )
    ours = sysconfig.get_paths()
    dep_dirs = dict.fromkeys(p for p in (ours["purelib"], ours["platlib"]) if Path(p).is_dir())
    (venv_site / "_memory_service_test_deps.pth").write_text("".join(f"{p}\n" for p in dep_dirs))
    script = venv / "bin" / "memory-service"
    assert script.read_text().splitlines()[0] == f"#!{venv_python}", "console script bound to another interpreter"

    # 3. from a directory outside the checkout: the package, the subcommands and the harness, all from the wheel
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    probe = json.loads(_run([str(venv_python), "-c", INSTALLED_PROBE], cwd=outside, env=env).stdout)
    for key in ("package", "bench", "evals"):
        assert Path(probe[key]).is_relative_to(venv_site), (key, probe[key])
    assert probe["scripts"] == []
    assert probe["metrics"]["tail_found_in_stored_facts"] == 1.0 and probe["metrics"]["no_gold_utterances"] == 1
    assert probe["png"] > 0
    for cmd in (
        [str(script), "eval", "--help"],
        [str(script), "bench", "--help"],
        [str(venv_python), "-m", "memory_service.bench.cli", "--help"],
        [str(venv_python), "-m", "memory_service.bench.limits", "--help"],
        [str(venv_python), "-m", "memory_service.evals", "--help"],
    ):
        out = _run(cmd, cwd=outside, env=env).stdout
        assert out.startswith("usage:") and "source tree" not in out, cmd


@pytest.mark.parametrize("extra", ["bench", "dev"])
def test_matplotlib_is_an_optional_extra(extra: str) -> None:
    """Plots are optional (the `bench` extra); the test bootstrap installs `dev`, which must keep them."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("matplotlib") for dep in project["dependencies"])
    assert any(dep.startswith("matplotlib") for dep in project["optional-dependencies"][extra])


def _package_import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (at any depth in the file, TYPE_CHECKING included)."""
    root = Path(memory_service.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    deps.add(full if full in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def test_the_package_has_no_import_cycle() -> None:
    graph = _package_import_graph()
    assert "memory_service.services" in graph and graph["memory_service.services"]  # the walk sees real edges
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
