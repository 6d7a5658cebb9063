"""The fairness benchmark runs end to end, small (issue 40): `memory-service serve` in its own process,
two teams, the fake llama-server at a fixed speed. Team B queues 40 saves; team A's saves made meanwhile are
extracted while most of B's flood is still queued. In global order (before the fair claim) A's first
flooded save waited behind all 40 of B's and the flood drained before A finished, so this fails.

It asserts on queue order (B's jobs still queued when A is done, every A save extracted), not on times:
the ratio of the latencies is reported, not judged, on a busy CI machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_service.bench import fairness
from tests.fakes.fake_llama_server import FakeLlamaServer

FLOOD = 40
A_SAVES = 4


@pytest.mark.process
def test_team_a_is_served_while_team_b_floods(tmp_path: Path) -> None:
    with FakeLlamaServer("ok", tokens_per_s=fairness.FAKE_TOKENS_PER_S) as fake:
        result = fairness.run(llm_url=fake.url, workdir=tmp_path, flood_size=FLOOD, a_saves=A_SAVES)
    assert result["failed_checks"] == []
    assert result["team_a_quiet"]["n"] == result["team_a_flooded"]["n"] == A_SAVES
    assert result["team_b_flood"]["queued_before_a"] >= FLOOD - 2
    # A's 4 saves took at most 4 of B's jobs' turns, plus the one running when each arrived
    assert result["team_b_still_queued_after_a"] >= FLOOD - 2 * A_SAVES - 2
    assert result["ratio_flooded_to_quiet"]["p95_ms"] is not None
