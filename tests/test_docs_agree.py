"""The docs agree with the code and with each other: every setting is documented with its real default, the
examples use the service's real port, and a fresh set-up's time is one measured figure everywhere.

Why: a user trusts the docs until one is wrong. Two settings had no row (MEMORY_MAX_FACTS,
MEMORY_MAX_FACT_CHARS), docs/hindsight.md pointed clients at port 8080 (the service listens on 8700), and
the README, the bootstrap's banner, operations.md and the build's log line gave four different set-up times.
Static reads of the files, so they run in the fast tier in well under a second.
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT

from memory_service.config import WORKER_SPEED_PRIOR, Settings

CONFIGURATION = ROOT / "docs" / "configuration.md"
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
SCRIPTS = [*sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run", ROOT / "Dockerfile"]
NOT_SETTINGS = {WORKER_SPEED_PRIOR}  # how `serve` hands a measurement to its workers, never set by people

# the one measured figure for a fresh machine's first `serve.sh` (issue 42: to ready, 2-core AMD EPYC without
# AMX, no pip cache), and the places that state the set-up time
SETUP_FIGURE = "6 min 41 s"
SETUP_PLACES = {
    ROOT / "README.md": "## The two commands",
    ROOT / "docs" / "operations.md": "## Setting up",
    ROOT / "docs" / "development.md": "| cold ",
    ROOT / "scripts" / "bootstrap.sh": "fresh set-up:",
    ROOT / "memory_service" / "llm" / "runtime" / "compile.py": "building llama-server",
}
DURATION = re.compile(r"\b\d+(?:\.\d+)?\s*min(?:ute)?s?\b(?:\s*\d+\s*s\b)?|\b\d+[-–]\d+\s*min(?:ute)?s?\b")


def env_name(field: str) -> str:
    alias = Settings.model_fields[field].validation_alias
    names = [c for c in getattr(alias, "choices", ()) if isinstance(c, str) and c.startswith("MEMORY_")]
    return names[0] if names else f"MEMORY_{field.upper()}"


def config_variables() -> set[str]:
    """Every MEMORY_* variable config.py reads: the Settings fields, and the names it reads itself."""
    source = (ROOT / "memory_service" / "config.py").read_text()
    named = set(re.findall(r"\bMEMORY_[A-Z0-9_]*[A-Z0-9]\b", source))
    return ({env_name(f) for f in Settings.model_fields} | named) - NOT_SETTINGS


def table_rows(text: str) -> dict[str, str]:
    """`| `MEMORY_X` / `MEMORY_Y` | default | meaning |` -> {variable: default cell}."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`MEMORY_"):
            names = re.findall(r"`(MEMORY_[A-Z0-9_]+)`", cells[0])
            defaults = cells[1].split(" / ") if len(names) > 1 else [cells[1]]
            rows.update(zip(names, defaults if len(defaults) == len(names) else [cells[1]] * len(names)))
    return rows


def test_every_setting_config_reads_is_documented_once() -> None:
    text = CONFIGURATION.read_text()
    documented = table_rows(text)
    assert sorted(config_variables() - documented.keys()) == []
    rows = [re.match(r"\| `(MEMORY_[A-Z0-9_]+)`", line) for line in text.splitlines()]
    names = [m.group(1) for m in rows if m]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_every_variable_the_set_up_scripts_read_is_documented() -> None:
    documented = table_rows(CONFIGURATION.read_text())
    read = {v for path in SCRIPTS for v in re.findall(r"\bMEMORY_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())}
    assert sorted(read - documented.keys()) == []


def test_documented_defaults_are_the_real_ones() -> None:
    """Where a table gives a default as a literal (`20`, `onnx-q8`, `1`), it is the Settings default."""
    wrong = []
    for doc in (CONFIGURATION, ROOT / "README.md"):
        rows = table_rows(doc.read_text())
        for field, info in Settings.model_fields.items():
            cell = rows.get(env_name(field), "")
            literal = re.fullmatch(r"`([^`]+)`(?: \(off\))?", cell)
            if literal is None or not isinstance(info.default, bool | int | float | str | Path):
                continue
            shown, real = literal.group(1), info.default
            if isinstance(real, bool):
                same = shown == ("1" if real else "0")
            elif isinstance(real, int | float):
                same = float(shown) == float(real)
            else:
                same = Path(shown).expanduser() == real if isinstance(real, Path) else shown == real
            if not same:
                wrong.append(f"{doc.name}: {env_name(field)} documented {shown}, is {real}")
    assert wrong == []


def test_loopback_examples_use_the_ports_that_answer() -> None:
    """A loopback URL in the docs is the service (8700), the MCP server (8701), the memory proxy (8702), a server
    the same page starts with `--port N` (`-p N`: PostgreSQL), or another kind of server named right before it
    (an eval's model endpoint, the proxy's upstream, Chroma)."""
    others = (
        "--agent-url",
        "--reader-url",
        "--judge-url",
        "--upstream",
        "MEMORY_LLM_URL",
        "MEMORY_CHROMA_URL",
        "Chroma server",
    )
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        for match in re.finditer(r"(?:127\.0\.0\.1|localhost):(\d+)", text):
            port, before = match.group(1), text[max(0, match.start() - 60) : match.start()]
            declared = f"--port {port}" in text or f"-p {port}" in text
            if port in ("8700", "8701", "8702") or declared or any(o in before for o in others):
                continue
            line = text.count("\n", 0, match.start()) + 1
            wrong.append(f"{doc.relative_to(ROOT)}:{line}: {match.group(0)}")
    assert wrong == []


def test_the_set_up_time_is_one_measured_figure() -> None:
    """Each place that says how long a fresh set-up takes gives the same figure, and no other (the CI budget
    of 15 minutes is a budget, not a measurement)."""
    found = {}
    for path, anchor in SETUP_PLACES.items():
        text = path.read_text()
        start = text.find(anchor)
        passage = text[start : start + 1500] if start >= 0 else "(its passage is missing)"
        figures = {d for d in DURATION.findall(passage) if d != "15 minutes"}
        found[path.relative_to(ROOT).as_posix()] = sorted(figures)
    assert found == {place: [SETUP_FIGURE] for place in found}
