"""The webhook isolation benchmark runs end to end, small (issue 53): `memory-service serve` in its own
process, a quiet team with one receiver and a team with 10 hostile ones (trickled bodies, silence, 3 GB
bodies). Before delivery was isolated per subscription none of the quiet team's events arrived within 90 s
and the service grew by 16 GB, so this fails there.

It asserts that every event arrived and the hostile receivers were really holding connections, and that the
service's memory stayed within a few MB per held connection; the latency ratio is reported, not judged, on
a busy CI machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_service.bench import webhooks
from tests.fakes.fake_llama_server import FakeLlamaServer


@pytest.mark.process
def test_a_quiet_teams_events_arrive_while_another_teams_receivers_misbehave(tmp_path: Path) -> None:
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        result = webhooks.run(llm_url=fake.url, workdir=tmp_path, saves=4)
    assert result["failed_checks"] == []
    assert result["team_q_quiet"]["n"] == result["team_q_with_hostile_team"]["n"] == 4
    assert result["team_h"]["held_connections_while_q_measured"]["max"] > 0
    assert result["goals"]["rss_grown_mb"]["met"], result["service_rss_mb"]
    assert result["ratio_hostile_to_quiet"]["p95_ms"] is not None
