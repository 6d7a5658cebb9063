"""What another team's rows cost one team's keyword leg: the bound of the time that teams still share.

The FTS5 keyword index is one for every team, so a query walks every team's rows that hold its words
before it keeps its own (the plan and the scores are the team's own: see docs/security.md). This times
team A's keyword search, in process on the journal, for a query whose rare words team A does not hold,
while team B holds them in 0, 1,500, 15,000 (and 100,000) rows: cold (A's document-frequency counts not
cached, as on a query's first use and every `DOC_FREQ_TTL_S` after) and warm.

    python -m memory_service.bench.recall_keyword_teams [--quick]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from ..testbed.probes import machine_info
from ..testbed.stats import latency_summary
from .texts import agent_text

TEAM_A, TEAM_B = "team-a", "team-b"
A_ROWS = 2_000
RARE = "quillwort zephyrine"  # words only team B's rows hold
QUERY = f"what did the {RARE} notes say about the staging deploy"  # A holds 'staging', 'deploy'
REPEATS = 30


def _add_rows(path: Path, team: str, first: int, count: int, text_of: Any) -> None:
    """Rows straight into the journal (its triggers fill the FTS5 index), as the recall benchmark loads."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    now = time.time()
    for i in range(first, first + count):
        conn.execute(
            "INSERT INTO memories (id, team, agent_id, run_id, text, tags, metadata, created_at, status, attempts, "
            "next_attempt_at, deadline_at, finished_at, indexed) VALUES (?,?,?,NULL,?,'[]','{}',?, 'done', 1, ?, ?, ?, 1)",
            (f"mem_{team}_{i:08d}", team, "agent", text_of(i), now + i * 1e-3, now, now, now),
        )
    conn.execute("COMMIT")
    conn.close()


def _time_a(journal: Any) -> dict[str, Any]:
    """Team A's keyword search of QUERY, REPEATS times cold (counts not cached) and REPEATS times warm."""
    cold, warm, found = [], [], 0
    for _ in range(REPEATS):
        journal._df_cache.clear()
        t0 = time.perf_counter()
        hits = journal.keyword_search(TEAM_A, QUERY, kinds={"passage"}, limit=30)
        cold.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        journal.keyword_search(TEAM_A, QUERY, kinds={"passage"}, limit=30)
        warm.append(time.perf_counter() - t1)
        found = len(hits)
    return {"cold": latency_summary(cold), "warm": latency_summary(warm), "a_hits": found}


def run(quick: bool = False) -> dict[str, Any]:
    from ..storage.journal import Journal

    levels = [0, 1_500, 15_000] if quick else [0, 1_500, 15_000, 100_000]
    with tempfile.TemporaryDirectory(prefix="bench-keyword-teams-") as tmp:
        path = Path(tmp) / "journal.sqlite3"
        Journal(path).close()  # the schema and its triggers
        _add_rows(path, TEAM_A, 0, A_ROWS, agent_text)
        out: dict[str, Any] = {}
        loaded = 0
        for level in levels:
            _add_rows(path, TEAM_B, loaded, level - loaded, lambda i: f"{RARE} field note {i}: {agent_text(i)}")
            loaded = level
            journal = Journal(path)
            try:
                _time_a(journal)  # SQLite's page cache and the stemmer, not measured
                out[f"b_rows_{level}"] = _time_a(journal)
            finally:
                journal.close()
    return {
        "benchmark": "keyword_leg_other_team_rows",
        "query": QUERY,
        "team_a_rows": A_ROWS,
        "levels": out,
        "notes": "team A's keyword search (passages, limit 30) in process; team B's rows all hold the query's "
        "rare words, team A's none: A's answer is the same at every level, its time is what B's rows cost",
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="up to 15,000 of team B's rows (no 100,000)")
    args = parser.parse_args(argv)
    print(json.dumps(run(quick=args.quick), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
