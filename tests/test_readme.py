"""README.md says what the machine does: its commands, flags, scripts and variables exist, and its Python runs.

Modelled on Datasette's tests/test_docs.py: the document is read as data. Every `memory-service ...` command
(in ```bash/```sh blocks and in `inline code`) is walked through the real parser (memory_service.cli.main.
build_parser): its subcommands and flags must exist. Every script path must exist, every `MEMORY_*` name
must be read by config.py (or, for set-up, by the scripts). And every ```python block of README.md,
docs/client.md and docs/gate.md runs unchanged against `memory-service serve` in a subprocess, keyless as
`./scripts/serve.sh` starts it, with MEMORY_URL pointing at it and the fake llama-server as its model.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

from memory_service.cli.main import build_parser
from memory_service.config import Settings
from memory_service.testbed.service_runner import ServiceRunner
from tests.fakes.fake_llama_server import FakeLlamaServer

README = ROOT / "README.md"
RUNNABLE = (
    README,
    ROOT / "docs" / "client.md",
    ROOT / "docs" / "gate.md",
)  # the documents whose Python an agent copies
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SHELL = ("bash", "sh", "shell", "console")
COMMAND_ENDS = ("|", "&&", ";", "#", ">", "2>", "||")


def blocks(text: str, languages: tuple[str, ...]) -> list[str]:
    return [body for language, body in FENCE.findall(text) if language in languages]


def shell_lines(text: str) -> list[str]:
    """Each command line of the shell blocks (continuations joined) and each inline code span of the prose."""
    lines = [line for body in blocks(text, SHELL) for line in body.replace("\\\n", " ").splitlines()]
    prose = FENCE.sub("", text)
    return lines + SPAN.findall(prose)


def commands(text: str) -> list[list[str]]:
    """The words after each `memory-service` (or `.venv/bin/memory-service`), up to a pipe, `&&` or comment."""
    found = []
    for line in shell_lines(text):
        for match in re.finditer(r"(?:^|[\s(/])memory-service\s+(.*)", line):
            try:
                words = shlex.split(match.group(1), comments=False)
            except ValueError:
                words = match.group(1).split()
            taken = []
            for word in words:
                if word in COMMAND_ENDS or word.startswith("#"):
                    break
                taken.append(word.strip("[]"))
            found.append([w for w in taken if w])
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def unknown_cli(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """What of `memory-service <words>` the parser does not know: a subcommand or a flag."""
    problems, path, skip = [], ["memory-service"], False
    for word in words:
        if skip:
            skip = False
            continue
        if word.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", word):
            flag = word.split("=", 1)[0]
            action = parser._option_string_actions.get(flag)
            if action is None:
                problems.append(f"`{' '.join(path)}` has no option {flag}")
            elif action.nargs != 0 and "=" not in word:
                skip = True  # its value
            continue
        choices = _subcommands(parser)
        if choices:
            if word not in choices:
                problems.append(f"`{' '.join(path)}` has no subcommand {word!r} (it has {', '.join(choices)})")
                return problems
            parser = choices[word]
            path.append(word)
    return problems


def cli_problems(text: str) -> list[str]:
    parser = build_parser()
    return [problem for words in commands(text) for problem in unknown_cli(words, parser)]


def script_problems(text: str) -> list[str]:
    """Every `scripts/...` or `.ci/...` path named must exist; a shell script must be executable."""
    problems = []
    for name in sorted(set(re.findall(r"(?:\./)?((?:scripts|\.ci)/[\w./-]*\w)", text))):
        path = ROOT / name
        if not path.exists():
            problems.append(f"{name} does not exist")
        elif path.suffix == ".sh" and not os.access(path, os.X_OK):
            problems.append(f"{name} is not executable")
    return problems


def known_variables() -> set[str]:
    """The MEMORY_* names something reads: Settings' fields and aliases, config.py's own reads (the client
    side: MEMORY_URL, MEMORY_API_KEY, ...), and the set-up scripts' (MEMORY_BOOTSTRAP_*, MEMORY_VENV)."""
    names = {f"MEMORY_{name.upper()}" for name in Settings.model_fields}
    for field in Settings.model_fields.values():
        alias = field.validation_alias
        names.update(str(choice).upper() for choice in getattr(alias, "choices", [alias]) if choice)
    readers = [ROOT / "memory_service" / "config.py", *(ROOT / "scripts").glob("*.sh"), ROOT / ".ci" / "run"]
    for path in readers:
        names.update(re.findall(r"MEMORY_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    return names


def variable_problems(text: str) -> list[str]:
    named = set(re.findall(r"\bMEMORY_[A-Z0-9_]*[A-Z0-9]\b", text))
    return [f"{name} is read by nothing (config.py, scripts/)" for name in sorted(named - known_variables())]


# -- the README as it is -------------------------------------------------------------------------------------


def test_every_cli_command_and_flag_in_the_readme_exists():
    text = README.read_text()
    assert len(commands(text)) >= 5  # the extraction sees the README's commands
    assert cli_problems(text) == []


def test_every_script_the_readme_names_exists():
    assert script_problems(README.read_text()) == []


def test_every_variable_the_readme_names_is_read():
    assert variable_problems(README.read_text()) == []


def test_the_readme_names_the_keyless_team():
    """Saves made before the first key belong to a team; a reader who makes keys must know its name."""
    text = README.read_text()
    assert "`local`" in text and "--team local" in text


# -- the checks catch what they are for --------------------------------------------------------------------


def test_the_checks_catch_a_wrong_command_flag_script_or_variable():
    wrong = """
```bash
memory-service recal "email quota"
./scripts/serv.sh
```
Or `memory-service remember "x" --agent mailer`, `memory-service keys create --tean ops`; set `MEMORY_PROT`.
"""
    assert cli_problems(wrong) == [
        "`memory-service` has no subcommand 'recal' (it has " + ", ".join(_subcommands(build_parser())) + ")",
        "`memory-service remember` has no option --agent",
        "`memory-service keys create` has no option --tean",
    ]
    assert script_problems(wrong) == ["scripts/serv.sh does not exist"]
    assert variable_problems(wrong) == ["MEMORY_PROT is read by nothing (config.py, scripts/)"]


# -- the Python runs ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`memory-service serve` keyless, as ./scripts/serve.sh starts it, with the fake model."""
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        service = ServiceRunner(tmp_path_factory.mktemp("readme") / "data", api_keys={}, llm_url=fake.url)
        service.start(timeout_s=180)
        try:
            yield service.url
        finally:
            service.stop()


# a section whose Python needs files beside it (a tool server, a policy file): its own test runs it with them
RUN_ELSEWHERE = {ROOT / "docs" / "gate.md": "## MCP: memory-service gate"}  # tests/test_gate_mcp.py


def python_blocks() -> list[tuple[str, int, str]]:
    found = []
    for path in RUNNABLE:
        text = path.read_text()
        if path in RUN_ELSEWHERE:
            text = text.split(RUN_ELSEWHERE[path], 1)[0]
        for n, body in enumerate(blocks(text, ("python",))):
            found.append((path.relative_to(ROOT).as_posix(), n, body))
    return found


@pytest.mark.process  # serve in a subprocess, and each snippet in a fresh interpreter
@pytest.mark.parametrize(("document", "n", "code"), python_blocks(), ids=lambda v: str(v)[:20])
def test_each_python_snippet_runs_as_written(served, tmp_path: Path, document: str, n: int, code: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")} | {"MEMORY_URL": served}
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, f"{document}, python block {n + 1}:\n{ran.stderr[-3000:]}"
    assert ran.stdout.strip(), "a snippet shows what it got"


def test_readme_has_python_to_run():
    assert any(document == "README.md" for document, _, _ in python_blocks())
