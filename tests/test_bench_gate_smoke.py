"""The gate benchmark runs end to end, small (issue 54): `memory-service serve`, the package's upstream MCP
server (testbed/mcp_upstream.py) straight and behind `memory-service gate`, a few calls of each path. It checks
the JSON's shape, that every guarded `once` key ran exactly once (the upstream's own log) and that repeats of
handled keys were refused, not the times (a busy CI machine judges nothing).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory_service.bench import gate


@pytest.mark.process
def test_the_gate_benchmark_reports_every_path_and_runs_each_key_once(tmp_path: Path) -> None:
    result = gate.run(quick=True, workdir=tmp_path, calls=5)
    json.dumps(result)  # the JSON the command prints
    assert result["benchmark"] == "gate" and result["failed_checks"] == []
    assert set(result["paths"]) == {"bare", "unguarded", "once", "limit"}
    assert all(summary["n"] == 5 for summary in result["paths"].values())
    assert set(result["service_alone"]) == {"reserve", "finish", "health"}
    for path in ("unguarded", "once", "limit"):
        assert result["added_over_bare"][path]["p50_ms"] is not None
    keys = result["once_keys"]
    assert keys["keys"] == gate.WARMUP + 5 == keys["ran_once"]  # every guarded key ran, and only once
    assert keys["ran_more_than_once"] == keys["never_ran"] == 0
    assert keys["repeats"] == keys["repeats_refused"] == 5  # handled keys called again: refused, not run
    ran = [json.loads(line) for line in (tmp_path / "gate-logs" / "gate.jsonl").read_text().splitlines()]
    assert sum(1 for r in ran if r["tool"] == "send_email") == gate.WARMUP + 5  # the limit path ran every time
    assert set(result["goals"]) == {"once_added_p50_ms", "limit_added_p50_ms"}
    assert set(result["breakdown_p50_ms"]) >= {"stdio_hop", "reserve", "finish"}
