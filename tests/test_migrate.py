"""`memory-service migrate --to postgresql://…`: an embedded data dir moves into PostgreSQL, nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory_service.storage.catalog import export_records
from memory_service.storage.database import PostgresDatabase
from memory_service.storage.gate import GateCall
from memory_service.storage.journal import QUEUED, FactPlan, Journal, NewFact
from memory_service.storage.keys import KeyStore
from memory_service.storage.limits import LimitStore

pytestmark = pytest.mark.process  # migrate runs as the CLI

ROOT = Path(__file__).resolve().parents[1]


def fact(text: str, fact_id: str) -> NewFact:
    from memory_service.contract.text import normalize
    from memory_service.extraction.grounding import shape

    norm = normalize(text)
    return NewFact(id=fact_id, text=text, norm=norm, shape=shape(norm), spans=[(0, len(text))])


def build_data_dir(data: Path) -> dict:
    journal = Journal(data / "journal.sqlite3")
    plans = [
        FactPlan(new=[fact("Ana lives in Porto", "f-porto")]),
        FactPlan(new=[fact("Ana lives in Lisbon", "f-lisbon")], superseded=[("f-porto", "f-lisbon")]),
        FactPlan(new=[fact("Ticket QX-4411 is closed", "f-ticket")]),
        FactPlan(new=[fact("Bruno prefers tea", "f-tea")]),
        None,  # the fifth job: cut off mid-extraction
    ]
    ids = []
    texts = [
        "Ana lives in Porto",
        "Ana lives in Lisbon now",
        "Ticket QX-4411 is closed",
        "Bruno prefers tea",
        "still extracting when the service stopped",
    ]
    for n, (text, plan) in enumerate(zip(texts, plans, strict=True)):
        memory, _ = journal.insert(
            team="team-a" if n < 4 else "team-b",
            agent_id=f"agent-{n % 2}",
            text=text,
            run_id="run-1",
            tags=["t"] if n == 2 else [],
            metadata={"n": n},
            idempotency_key=f"key-{n}",
            budget_s=20,
            now=1_700_000_000.0 + n,
        )
        ids.append(memory.id)
        # each job is claimed as soon as it is saved: the fair queue serves teams and agents in turn, so a
        # claim after all five saves would not take them in the order the plans assume
        claimed = journal.claim_next("w", 60)
        assert claimed is not None and claimed.id == memory.id
        if plan is not None:
            journal.complete(claimed, plan, raw_reply="r", timings=None, report={"stored": 1})
    journal.close()

    clock = lambda: datetime.now(UTC)  # noqa: E731
    limits = LimitStore(data / "limits.sqlite3", now=clock)
    limits.set_limit("team-a", "emails", 5, "Europe/Madrid", "agent")
    for _ in range(3):
        limits.consume("team-a", "emails", "agent-0", idempotency_key=None)
    first = limits.consume("team-a", "emails", "agent-1", idempotency_key="send-1")
    limits.mark_handled("team-a", "https://example.com/item/1")
    limits.mark_handled("team-a", "https://example.com/item/1")
    done = limits.reserve("team-a", GateCall(tool="process_item", key="ticket:1", agent_id="agent-0"))
    limits.finish("team-a", done.reservation or "", "closed")
    held = limits.reserve("team-a", GateCall(tool="process_item", key="ticket:2", limit="emails", agent_id="agent-0"))
    limits.close()
    keys = KeyStore(data / "keys.sqlite3")
    made = keys.create("team-a", "write", agent_id="agent-0", label="ci")
    keys.close()
    assert held.allowed
    return {"ids": ids, "first_consume": first, "key": made.key}


def migrate(data: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "memory_service.cli.main",
            "--json",
            "migrate",
            "--to",
            url,
            "--data-dir",
            str(data),
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={
            k: v
            for k, v in __import__("os").environ.items()
            if not k.startswith("MEMORY_") or k in ("MEMORY_CACHE_DIR", "MEMORY_EMBEDDER")
        },
    )


def test_migrate_copies_everything_and_reindexes(tmp_path: Path, postgres_url: str) -> None:
    data = tmp_path / "data"
    made = build_data_dir(data)
    before = {team: list(export_records(Journal(data / "journal.sqlite3"), team)) for team in ("team-a", "team-b")}

    done = migrate(data, postgres_url)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["copied"]["memories"] == 5 and summary["copied"]["facts"] == 4
    assert summary["reindex"]["passages_embedded"] == 5 and summary["reindex"]["facts_embedded"] == 3

    db = PostgresDatabase(postgres_url)
    try:
        journal = Journal(db)
        for team in ("team-a", "team-b"):
            after = list(export_records(journal, team))
            for record in after + before[team]:
                record.pop("status")
            assert after == before[team]  # ids, texts, times, facts, spans, supersession: all the same
        facts = journal.facts_by_ids("team-a", ["f-porto", "f-lisbon"])
        assert facts["f-porto"].superseded_by == "f-lisbon" and facts["f-lisbon"].superseded_by is None
        assert journal.get("team-b", made["ids"][4]).status == QUEUED  # the cut-off job runs again
        hits = journal.keyword_search("team-a", "QX-4411", kinds={"passage", "fact"}, limit=5)
        assert {h.memory_id for h in hits} == {made["ids"][2]}

        limits = LimitStore(db)
        view = limits.get_limit("team-a", "emails", agent_id="agent-0")
        assert (view.used, view.timezone, view.per) == (4, "Europe/Madrid", "agent")
        replay = limits.consume("team-a", "emails", "agent-1", idempotency_key="send-1")
        assert replay.replayed and replay.used == made["first_consume"].used  # the idempotency record came too
        handled = limits.get_handled("team-a", "https://example.com/item/1")
        assert handled is not None and handled.seen_count == 2
        # the gate's records and its reservation in progress came too: the held key still refuses
        finished = limits.get_handled("team-a", "ticket:1")
        assert finished is not None and (finished.by, finished.tool, finished.result) == (
            "agent-0",
            "process_item",
            "closed",
        )
        assert limits.reserve("team-a", GateCall(tool="process_item", key="ticket:2")).reason == "in_progress"
        assert KeyStore(db).lookup(made["key"]).team == "team-a"
    finally:
        db.close()

    again = migrate(data, postgres_url, "--no-reindex")
    assert again.returncode == 0, again.stderr
    assert set(json.loads(again.stdout)["copied"].values()) == {0}  # a re-run copies nothing twice


def test_migrate_refuses_bad_targets_with_a_clear_message(tmp_path: Path) -> None:
    data = tmp_path / "data"
    Journal(data / "journal.sqlite3").close()
    wrong = migrate(data, "mysql://x@localhost/db")
    assert wrong.returncode == 1 and "postgresql://" in wrong.stderr
    unreachable = migrate(data, "postgresql://nobody@127.0.0.1:9/none")
    assert unreachable.returncode == 1 and "unreachable" in unreachable.stderr
    empty = migrate(tmp_path / "nothing-here", "postgresql://nobody@127.0.0.1:9/none")
    assert empty.returncode == 1 and "journal.sqlite3" in empty.stderr
