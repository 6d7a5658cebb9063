"""The idempotency keys Hindsight retains derive: unambiguous (a hash of [kind, bank, id, index]), in a
namespace no client key may enter, and documents retained under the old keys still replay.

Against the real app in this process (real SQLite and Chroma), the Hindsight routes driven as the client does.
"""

from __future__ import annotations

import json

import pytest

from memory_service.contract.hindsight import derived_key, legacy_document_key

HS = "/v1/default/banks"


def _retain(client, bank: str, body: dict) -> dict:
    answer = client.post(f"{HS}/{bank}/memories", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["success"] is True
    return answer.json()


def _document(client, bank: str, doc: str) -> dict:
    answer = client.get(f"{HS}/{bank}/documents/{doc}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_an_operation_id_and_a_document_id_that_spell_the_same_old_key_are_both_stored(inprocess) -> None:
    """`operation_id: nightly` and `document_id: op:nightly` made one key `hindsight:bank:op:nightly:0`: the
    second retain answered success and stored nothing."""
    client = inprocess.client()
    _retain(
        client,
        "keys-ops",
        {"items": [{"content": "The nightly run rotated the logs."}], "async": True, "operation_id": "nightly"},
    )
    _retain(
        client, "keys-ops", {"items": [{"content": "The op manual says to page Dana.", "document_id": "op:nightly"}]}
    )
    assert _document(client, "keys-ops", "op:nightly")["original_text"] == "The op manual says to page Dana."
    status = client.get(f"{HS}/keys-ops/operations/nightly")
    assert status.status_code == 200, status.text


def test_a_colon_in_bank_or_document_id_cannot_make_two_documents_one(inprocess) -> None:
    """Bank `support` + document `bot:t1` and bank `support:bot` + document `t1` were one key (a 409)."""
    client = inprocess.client()
    _retain(client, "support", {"items": [{"content": "Ticket one: the printer jams.", "document_id": "bot:t1"}]})
    _retain(client, "support:bot", {"items": [{"content": "Ticket t1: the badge fails.", "document_id": "t1"}]})
    assert _document(client, "support", "bot:t1")["original_text"] == "Ticket one: the printer jams."
    assert _document(client, "support:bot", "t1")["original_text"] == "Ticket t1: the badge fails."


@pytest.mark.parametrize("key", ["hindsight:victim:handover:0", "hindsight:v2:" + "0" * 64, "import:mem_0123"])
def test_a_client_key_cannot_enter_the_derived_namespace(inprocess, key: str) -> None:
    """A key pinned to `mallory` took the victim's predictable key, and the victim's later retain was a 409."""
    admin = inprocess.client()
    made = admin.post("/v1/keys", json={"role": "write", "agent_id": "mallory"})
    assert made.status_code == 201, made.text
    mallory = inprocess.client(made.json()["key"])
    before = inprocess.jobs()
    taken = mallory.post(
        "/v1/remember", json={"text": "Mallory was here.", "agent_id": "mallory", "idempotency_key": key}
    )
    assert taken.status_code == 422, taken.text
    assert "reserved" in taken.json()["detail"] and taken.json()["errors"][0]["field"] == "idempotency_key"
    assert inprocess.jobs() == before
    _retain(admin, "victim", {"items": [{"content": "The victim's handover note.", "document_id": "handover"}]})
    assert _document(admin, "victim", "handover")["original_text"] == "The victim's handover note."


def _store_as_before(inprocess, bank: str, doc: str, text: str) -> str:
    """A document item as the old retain stored it: its run, and the old key."""
    memory, created = inprocess.services.journal.insert(
        team="team-a",
        agent_id=bank,
        text=text,
        run_id=doc,
        tags=[],
        metadata={"hindsight": {"document_id": doc}},
        idempotency_key=legacy_document_key(bank, doc, 0),
        budget_s=60.0,
    )
    assert created
    return memory.id


def test_a_document_retained_under_the_old_keys_still_replays(inprocess) -> None:
    """Documents are re-retained by id for months: one stored before the new keys is found again, not doubled;
    a row whose old key only *spells* the same string (another bank) is not taken for it."""
    client = inprocess.client()
    _store_as_before(inprocess, "legacy", "runbook", "The runbook says restart the pump.")
    _retain(client, "legacy", {"items": [{"content": "The runbook says restart the pump.", "document_id": "runbook"}]})
    doc = _document(client, "legacy", "runbook")
    assert doc["original_text"] == "The runbook says restart the pump."

    # old key `hindsight:legacy:ops:t9:0`, stored by bank `legacy`, document `ops:t9`
    _store_as_before(inprocess, "legacy", "ops:t9", "Ticket nine, stored before.")
    _retain(client, "legacy:ops", {"items": [{"content": "Ticket t9 of another bank.", "document_id": "t9"}]})
    assert _document(client, "legacy:ops", "t9")["original_text"] == "Ticket t9 of another bank."
    assert _document(client, "legacy", "ops:t9")["original_text"] == "Ticket nine, stored before."


def test_a_retried_retain_stores_nothing_twice_and_the_export_imports_back(inprocess) -> None:
    """The new keys replay a retry; an export holding them (reserved for clients) imports into another team."""
    client = inprocess.client()
    body = {
        "items": [
            {"content": "Shift A starts at six.", "document_id": "rota"},
            {"content": "Shift B starts at two.", "document_id": "rota"},
        ]
    }
    _retain(client, "rota-bank", body)
    _retain(client, "rota-bank", body)
    assert _document(client, "rota-bank", "rota")["original_text"] == "Shift A starts at six.\n\nShift B starts at two."
    lines = client.get("/v1/export").text
    assert '"idempotency_key": "hindsight:v2:' in lines
    moved = inprocess.client("key-b").post("/v1/import", content=lines.encode())
    assert moved.status_code == 200 and moved.json()["failed"] == 0, moved.json()
    again = inprocess.client("key-b").post("/v1/import", content=lines.encode())
    assert (
        again.json()["imported"] == 0 and again.json()["skipped"] == moved.json()["imported"] + moved.json()["skipped"]
    )


def _line(agent: str, text: str, key: str, run: str | None = None, n: int = 0) -> bytes:
    """One import line as an export writes it, with `key` as its idempotency key."""
    line = {"id": f"mem_{n:032x}", "text": text, "agent_id": agent, "created_at": 1_700_000_000.0}
    return (json.dumps(line | {"run_id": run, "idempotency_key": key}) + "\n").encode()


def _texts(client, agent: str) -> list[str]:
    listed = client.get("/v1/memories", params={"agent_id": agent, "limit": 100})
    assert listed.status_code == 200, listed.text
    return [item["text"] for item in listed.json()["items"]]


def test_an_import_line_cannot_take_the_key_of_another_banks_retain(inprocess) -> None:
    """Issue 53: a line filed under `mallory` with the key the victim's retain of `handover` derives was stored,
    and the victim's retain was a 409 on every retry. The line is refused, with the reason, as /v1/remember
    refuses the key."""
    admin = inprocess.client()
    taken = derived_key("victim53", "document", "handover", 0)
    answer = admin.post("/v1/import", content=_line("mallory", "Mallory's planted line.", taken, "handover", 531))
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert (report["imported"], report["failed"]) == (0, 1), report
    assert report["errors"][0]["line"] == 1 and "reserved" in report["errors"][0]["detail"], report
    _retain(admin, "victim53", {"items": [{"content": "The victim's real handover.", "document_id": "handover"}]})
    assert _document(admin, "victim53", "handover")["original_text"] == "The victim's real handover."


def test_an_import_line_under_the_owners_bank_cannot_make_its_retain_store_nothing(inprocess) -> None:
    """Issue 53: a line filed under the victim's own bank and document, with the key its retain derives and
    other text, made that retain answer 200 and store nothing. The key is the retain's: import drops it (the
    line goes in under its lineage, `import:<id>`), so the retain stores its item."""
    admin = inprocess.client()
    owned = derived_key("victim54", "document", "handover", 0)
    answer = admin.post("/v1/import", content=_line("victim54", "A planted handover.", owned, "handover", 541))
    assert answer.status_code == 200 and answer.json()["imported"] == 1, answer.text
    _retain(admin, "victim54", {"items": [{"content": "The victim's real handover.", "document_id": "handover"}]})
    assert "The victim's real handover." in _texts(admin, "victim54")
    with inprocess.services.journal.reading() as conn:
        sql = "SELECT idempotency_key FROM memories WHERE team = 'team-a' AND agent_id = 'victim54'"
        keys = {row[0] for row in conn.execute(sql)}
    assert keys == {owned, f"import:mem_{541:032x}"}, keys  # the retain's own, and the line's lineage
