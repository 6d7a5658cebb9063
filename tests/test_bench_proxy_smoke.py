"""The proxy benchmark runs end to end, small: `memory-service serve` and `memory-service proxy` in processes of
their own, the fake llama-server as the upstream, a few turns each way. It checks the JSON's shape and that
every turn was answered, not the times (a busy CI machine judges nothing).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_service.bench import proxy


@pytest.mark.process
def test_the_proxy_benchmark_reports_both_paths(tmp_path: Path) -> None:
    result = proxy.run(quick=True, workdir=tmp_path, turns=5)
    for kind in ("non_stream", "stream"):
        assert result[kind]["direct"]["n"] == result[kind]["proxy"]["n"] == 5
        assert result[kind]["added_p50_ms"] is not None
    assert result["first_request"]["n"] == proxy.QUICK_SESSIONS
    assert set(result["goals"]) == {"non_stream_added_p50_ms", "stream_added_p50_ms"}
