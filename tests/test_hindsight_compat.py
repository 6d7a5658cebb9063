"""Hindsight's own PyPI client (`hindsight-client`, pinned in the dev extra) against this service's Hindsight API.

Nothing here reads Hindsight's code: the real client, its sync and async calls, talks over loopback HTTP to the
in-process service (real stores and workers; a fake llama-server thread extracts). A bank is an agent of the
key's team; the mapping is in docs/hindsight.md.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight
from hindsight_client_api.exceptions import ApiException

from tests.fakes.fake_llama_server import FakeLlamaServer, count_tokens
from tests.inprocess import InProcessService

DAY = "2026-03-14T09:30:00+00:00"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", n_ctx=4096, tokens_per_s=5000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("hindsight") / "data", fake.url)
        with svc:
            yield svc


def client(service: InProcessService, key: str = "key-a") -> Hindsight:
    return Hindsight(base_url=service.url, api_key=key, timeout=30)


def run(coro: Any) -> Any:
    """The loop the client's sync wrappers use, so its aiohttp session is on one loop."""
    return asyncio.get_event_loop().run_until_complete(coro)


def raw(service: InProcessService, method: str, path: str, key: str = "key-a", **kw: Any) -> httpx.Response:
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        return http.request(method, path, **kw)


def test_sync_round_trip_retain_recall_list_get_delete(service: InProcessService) -> None:
    hs = client(service)
    bank = "sync-agent"
    answer = hs.retain(
        bank,
        "The Heron archive moved to vault 12 on Friday.",
        timestamp=DAY,
        context="ops handover notes",
        document_id="handover-1",
        metadata={"source": "slack"},
        tags=["ops"],
    )
    assert answer.success and answer.items_count == 1 and not answer.var_async
    found = hs.recall(bank, "Where is the Heron archive?")
    passage = next(r for r in found.results if r.type == "experience")
    assert "vault 12" in passage.text
    assert passage.document_id == "handover-1" and passage.context == "ops handover notes"
    assert passage.metadata == {"source": "slack"} and passage.tags == ["ops"]
    assert passage.occurred_start is not None and passage.occurred_start.startswith("2026-03-14T09:30")
    docs = run(hs.documents.list_documents(bank))
    assert [d.id for d in docs.items] == ["handover-1"] and docs.total == 1
    doc = run(hs.documents.get_document(bank, "handover-1"))
    assert doc.original_text == "The Heron archive moved to vault 12 on Friday." and doc.tags == ["ops"]
    gone = run(hs.documents.delete_document(bank, "handover-1"))
    assert gone.success and gone.memory_units_deleted == 1
    assert not hs.recall(bank, "Where is the Heron archive?").results
    with pytest.raises(ApiException) as missing:
        run(hs.documents.get_document(bank, "handover-1"))
    assert missing.value.status == 404
    hs.close()


def test_async_round_trip(service: InProcessService) -> None:
    async def main() -> None:
        hs = client(service)
        bank = "async-agent"
        await hs.aretain(bank, "Mira prefers the night shift.", document_id="prefs", tags=["people"])
        found = await hs.arecall(bank, "Which shift does Mira prefer?")
        assert any("night shift" in r.text for r in found.results)
        docs = await hs.documents.list_documents(bank)
        assert [d.id for d in docs.items] == ["prefs"]
        doc = await hs.documents.get_document(bank, "prefs")
        assert doc.original_text == "Mira prefers the night shift."
        await hs.documents.delete_document(bank, "prefs")
        assert not (await hs.arecall(bank, "Which shift does Mira prefer?")).results
        assert (await hs.documents.list_documents(bank)).total == 0
        await hs.aclose()

    asyncio.run(main())


def test_batch_retain_groups_by_document_and_is_idempotent(service: InProcessService) -> None:
    hs = client(service)
    bank = "batch-agent"
    items = [
        {"content": "Part one: the pump failed at noon.", "document_id": "incident-7"},
        {"content": "Part two: the pump was replaced by 3pm.", "document_id": "incident-7"},
        {"content": "The canteen closes early on Fridays."},
    ]
    assert hs.retain_batch(bank, items, document_tags=["batch"]).items_count == 3
    hs.retain_batch(bank, items[:2], document_tags=["batch"])  # a retry: document_id is the idempotency key
    docs = run(hs.documents.list_documents(bank))
    assert docs.total == 2
    incident = run(hs.documents.get_document(bank, "incident-7"))
    assert incident.original_text == "Part one: the pump failed at noon.\n\nPart two: the pump was replaced by 3pm."
    assert incident.tags == ["batch"]
    single = next(d for d in docs.items if d.id != "incident-7")
    assert single.id.startswith("mem_")  # an item without document_id is a document of its own
    assert run(hs.documents.get_document(bank, single.id)).original_text == "The canteen closes early on Fridays."
    hs.close()


def test_async_retain_is_polled_to_completed(service: InProcessService) -> None:
    hs = client(service)
    bank = "poll-agent"
    operation = str(uuid.uuid4())
    answer = hs.retain(bank, "The backup window moved to 02:00 UTC.", retain_async=True, operation_id=operation)
    assert answer.var_async and answer.operation_id == operation
    deadline = time.monotonic() + 60
    status = run(hs.operations.get_operation_status(bank, operation))
    while status.status != "completed" and time.monotonic() < deadline:
        assert status.status in ("pending", "processing"), status
        time.sleep(0.2)
        status = run(hs.operations.get_operation_status(bank, operation))
    assert status.status == "completed"
    with pytest.raises(ApiException) as unknown:
        run(hs.operations.get_operation_status(bank, str(uuid.uuid4())))
    assert unknown.value.status == 404
    hs.close()


def test_banks_list_and_create(service: InProcessService) -> None:
    hs = client(service)
    profile = hs.create_bank("new-bank", name="New bank")
    assert profile.bank_id == "new-bank" and profile.name == "New bank"
    hs.retain("listed-bank", "A memory makes the bank appear in the list.")
    banks = run(hs.banks.list_banks())
    ids = {b.bank_id for b in banks.banks}
    assert "listed-bank" in ids and banks.total == len(banks.banks)
    hs.close()


def test_tags_and_types_filters(service: InProcessService) -> None:
    hs = client(service)
    bank = "filter-agent"
    hs.retain(bank, "Quartz alpha note about the red door.", tags=["red"])
    hs.retain(bank, "Quartz beta note about the blue door.", tags=["blue"])
    hs.retain(bank, "Quartz gamma note about the plain door.")

    def texts(**kw: Any) -> set[str]:
        return {r.text for r in hs.recall(bank, "Quartz note door", types=["experience"], **kw).results}

    assert texts(tags=["red"], tags_match="any_strict") == {"Quartz alpha note about the red door."}
    assert texts(tags=["red"], tags_match="any") == {
        "Quartz alpha note about the red door.",
        "Quartz gamma note about the plain door.",
    }
    assert texts(tags=["red", "blue"], tags_match="all_strict") == set()
    assert all(r.type == "experience" for r in hs.recall(bank, "Quartz door", types=["experience"]).results)
    assert all(r.type == "world" for r in hs.recall(bank, "Quartz door", types=["world"]).results)
    hs.close()


def test_max_tokens_bounds_the_results(service: InProcessService) -> None:
    hs = client(service)
    bank = "budget-agent"
    for n in range(6):
        hs.retain(bank, f"Lantern report {n}: " + "the lantern on the pier flickers at dusk. " * 8)
    everything = hs.recall(bank, "lantern pier report", types=["experience"], max_tokens=100_000).results
    budget = 3 * count_tokens(everything[0].text)  # by the fake llama-server's /tokenize, as the service counts
    bounded = hs.recall(bank, "lantern pier report", types=["experience"], max_tokens=budget).results
    assert 0 < len(bounded) < len(everything)
    assert sum(count_tokens(r.text) for r in bounded) <= budget
    hs.close()


def test_what_is_not_served_is_a_501_naming_the_subset(service: InProcessService) -> None:
    hs = client(service)
    with pytest.raises(ApiException) as reflect:
        hs.reflect("any-bank", "What do I know?")
    assert reflect.value.status == 501
    assert "reflect" in str(reflect.value.body) and "memories/recall" in str(reflect.value.body)
    for method, path in (("GET", "/v1/default/banks/b1/mental-models"), ("GET", "/v1/default/banks/b1/entities")):
        answer = raw(service, method, path)
        assert answer.status_code == 501 and answer.json()["error"] == "not_implemented"
    hs.close()


def test_another_team_sees_nothing(service: InProcessService) -> None:
    hs_a, hs_b = client(service), client(service, "key-b")
    hs_a.retain("shared-name", "Team A's secret: the vault code is 4417.", document_id="secret")
    assert not hs_b.recall("shared-name", "vault code").results
    assert run(hs_b.documents.list_documents("shared-name")).total == 0
    assert "shared-name" not in {b.bank_id for b in run(hs_b.banks.list_banks()).banks}
    for call in (hs_b.documents.get_document, hs_b.documents.delete_document):
        with pytest.raises(ApiException) as refused:
            run(call("shared-name", "secret"))
        assert refused.value.status == 404
    assert any("4417" in r.text for r in hs_a.recall("shared-name", "vault code").results)
    assert raw(service, "GET", "/v1/default/banks", key="no-such-key").status_code == 401
    hs_a.close()
    hs_b.close()


@pytest.mark.parametrize(
    "path",
    [
        "/v1/default/banks/..%2F..%2Fetc/memories/recall",
        "/v1/default/banks/" + "b" * 200 + "/memories/recall",
        "/v1/default/banks/-dash/memories/recall",
        "/v1/default/banks/ok/documents/..%2F..%2Fpasswd",
        "/v1/default/banks/ok/documents/" + "d" * 200,
        "/v1/default/banks/ok/documents/a%2Fb%2Fc",
        "/v1/default/banks/ok/documents/%2E%2E",
        "/v1/default/banks/%2E%2E/documents",
    ],
)
def test_hostile_ids_answer_422(service: InProcessService, path: str) -> None:
    method = "POST" if path.endswith("recall") else "GET"
    answer = raw(service, method, path, json={"query": "x"} if method == "POST" else None)
    assert answer.status_code == 422, (path, answer.status_code, answer.text)  # never a 501 or a 500
    assert answer.json()["error"] == "invalid_request"


def test_hostile_ids_through_the_client(service: InProcessService) -> None:
    hs = client(service)
    for bank, doc in (("../../etc", "x"), ("ok", "../../passwd"), ("b" * 129, "x"), ("ok", "a/b")):
        with pytest.raises(ApiException) as refused:
            run(hs.documents.get_document(bank, doc))
        assert 400 <= refused.value.status < 500
    with pytest.raises(ApiException) as refused:
        hs.retain("ok", "text", document_id="../escape")
    assert refused.value.status == 422
    hs.close()


def test_roles_and_pinned_keys_hold(service: InProcessService) -> None:
    """The same keys and roles as /v1: a read key cannot retain, a write key cannot delete, a pinned key acts
    only in its own bank."""

    def key(**body: Any) -> str:
        answer = raw(service, "POST", "/v1/keys", json=body)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["key"])

    reader, writer, pinned = key(role="read"), key(role="write"), key(role="write", agent_id="own-bank")
    read_only = client(service, reader)
    with pytest.raises(ApiException) as refused:
        read_only.retain("role-bank", "A reader may not write.")
    assert refused.value.status == 403
    hs = client(service, writer)
    hs.retain("role-bank", "A writer may write.", document_id="w1")
    with pytest.raises(ApiException) as refused:
        run(hs.documents.delete_document("role-bank", "w1"))
    assert refused.value.status == 403
    mine = client(service, pinned)
    mine.retain("own-bank", "A pinned key writes in its bank.")
    for call in (lambda: mine.retain("role-bank", "elsewhere"), lambda: mine.recall("role-bank", "writer")):
        with pytest.raises(ApiException) as refused:
            call()
        assert refused.value.status == 403
    assert {b.bank_id for b in run(mine.banks.list_banks()).banks} == {"own-bank"}
    for c in (read_only, hs, mine):
        c.close()


def test_version_tells_the_api_served_and_its_features(service: InProcessService) -> None:
    """What integrations probe before they send newer fields (Hermes Agent: update_mode 'append' from 0.5.0)."""
    hs = client(service)
    answer = hs.get_version()
    assert answer.api_version == "1.1.0" and answer.features.worker and not answer.features.mcp
    assert raw(service, "GET", "/version", key="no-such-key").status_code == 401
    hs.close()


def test_append_adds_each_new_part_to_the_document_once(service: InProcessService) -> None:
    """update_mode 'append': how Hermes Agent's Hindsight plugin saves each chat turn into its session's document.
    A new part is stored; the same part retried is not stored twice."""
    hs = client(service)
    bank = "append-agent"
    for part in ("Turn one: Mira adopted a cat called Miso.", "Turn two: Mira moved to Lisbon in March."):
        hs.retain(bank, part, document_id="session-1", update_mode="append")
    hs.retain(bank, "Turn two: Mira moved to Lisbon in March.", document_id="session-1", update_mode="append")
    doc = run(hs.documents.get_document(bank, "session-1"))
    assert doc.original_text == "Turn one: Mira adopted a cat called Miso.\n\nTurn two: Mira moved to Lisbon in March."
    assert any("Lisbon" in r.text for r in hs.recall(bank, "Mira moved to Lisbon").results)
    hs.close()


def test_observations_are_the_facts_when_nothing_consolidates(service: InProcessService) -> None:
    """Hermes Agent's plugin recalls `observation` only by default; without MEMORY_CONSOLIDATE those are the
    facts (deduplicated at extraction), not an empty answer."""
    hs = client(service)
    hs.retain("observer", "The west gate code changed to 5521 on Tuesday.", retain_async=False)
    deadline = time.monotonic() + 60
    found = hs.recall("observer", "west gate code", types=["observation"]).results
    while not found and time.monotonic() < deadline:  # facts are extracted in the background
        time.sleep(0.2)
        found = hs.recall("observer", "west gate code", types=["observation"]).results
    assert found and all(r.type == "world" for r in found) and any("5521" in r.text for r in found)
    hs.close()
