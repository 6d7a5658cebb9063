"""The recall benchmark runs end to end past the 10k level (issue 40): a small configuration of
`python -m memory_service.bench.recall`, its own `memory-service serve` child on real HTTP.

At 10,000 facts in one team the service searches it through an in-process clustered index, and the
benchmark waits until /metrics says that index is ready; the series is no team's, so since /metrics gives a
team's key only its own labelled series the wait must read it with the service's metrics token (it ran to
its 600 s timeout with the team key). The rows measured while extraction runs (here against the fake
llama-server) count every team's jobs on /ready, which a team's key no longer sees either.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_service.bench import recall
from memory_service.recall.vectors import UNFILTERED_EXACT_MAX_ROWS
from tests.fakes.fake_llama_server import FakeLlamaServer

LEVEL = 10_000


@pytest.mark.process
def test_recall_benchmark_runs_past_the_10k_level(tmp_path: Path) -> None:
    with FakeLlamaServer("ok", tokens_per_s=400) as fake:
        result = recall.run(workdir=tmp_path, llm_url=fake.url, levels=[LEVEL], pool_size=400, n_queries=8)
    level = result["levels"][str(LEVEL)]
    assert level["facts"] > UNFILTERED_EXACT_MAX_ROWS  # big enough for the clustered index
    http = level["http"]
    assert http["index_ready_after_s"] < 600
    for name in recall.VARIANTS:
        assert http[name]["p50_ms"] > 0 and http[name]["items_mean"] > 0, name
    busy = level["http_while_extracting"]
    assert busy["model_busy"]["queued_before"] + busy["model_busy"]["extracting_before"] >= 1  # /ready, every team
    assert set(busy) >= set(recall.VARIANTS)
