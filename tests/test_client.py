"""The Python client against the real service (in this process, over loopback HTTP) with the fake model."""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import pytest
from conftest import ROOT
from inprocess import InProcessService

from memory_service.client import (
    AsyncMemoryClient,
    BadRequest,
    Conflict,
    Forbidden,
    MemoryClient,
    MemoryServiceError,
    NotFound,
    Unauthorized,
)
from memory_service.contract.limits import ConsumeAnswer, HandledOut
from memory_service.contract.models import MemoryOut, RecallResponse, RememberResponse
from tests.fakes.fake_llama_server import FakeLlamaServer


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("client") / "data", fake.url).start()
        yield svc
        svc.stop()


class Flaky(httpx.BaseTransport):
    """The real service behind a transport that loses answers or answers 503 first, on demand."""

    def __init__(self, lose: int = 0, busy: int = 0, retry_after: str = "0") -> None:
        self.inner, self.lose, self.busy, self.retry_after = httpx.HTTPTransport(), lose, busy, retry_after
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        if self.busy:
            self.busy -= 1
            return httpx.Response(
                503,
                json={"error": "unavailable", "detail": "busy, retry"},
                headers={"Retry-After": self.retry_after, "X-Request-ID": "busy-1"},
            )
        response = self.inner.handle_request(request)
        if self.lose:
            self.lose -= 1
            response.read()
            raise httpx.ReadError("connection reset after the request was processed", request=request)
        return response


@pytest.mark.process  # a fresh interpreter: this one has the server loaded
def test_importing_the_client_loads_no_part_of_the_server():
    """The client is contract/ + httpx: an agent's process pays for neither the server nor its stores."""
    probe = (
        "import sys, memory_service.client; "
        "print(sorted({m.split('.')[0] if not m.startswith('memory_service.') else '.'.join(m.split('.')[:2]) "
        "for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    forbidden = {
        "fastapi",
        "starlette",
        "psycopg",
        "chromadb",
        "onnxruntime",
        "torch",
        "sentence_transformers",
        "memory_service.storage",
        "memory_service.api",
        "memory_service.services",
    }
    assert loaded & forbidden == set(), out.stderr
    assert "memory_service.contract" in loaded and "httpx" in loaded  # the probe sees what it should


def test_sync_client_covers_memories_with_typed_results(service):
    marker = uuid.uuid4().hex[:8]
    with MemoryClient(service.url, api_key="key-a") as memory:
        saved = memory.remember(
            f"Rosa Diaz closed incident {marker} on the payments gateway.",
            agent_id="oncall",
            tags=["incident"],
            wait_s=30,
        )
        assert isinstance(saved, RememberResponse) and saved.status == "done"
        got = memory.get(saved.id)
        assert isinstance(got, MemoryOut) and got.facts and got.tags == ["incident"]
        hits = memory.recall(f"incident {marker} payments gateway", k=5)
        assert isinstance(hits, RecallResponse) and hits.items[0].memory_id == saved.id
        assert memory.recall(f"incident {marker}", agent_id="someone-else").items == []
        page = memory.list(agent_id="oncall", limit=10)
        assert page.items[0].id == saved.id and page.items[0].facts >= 1
        exported = [r for r in memory.export() if r.id == saved.id]
        assert exported and exported[0].facts[0].text
        assert memory.forget(saved.id).deleted == 1
        with pytest.raises(MemoryServiceError) as missing:
            memory.get(saved.id)
        assert missing.value.status == 404 and saved.id in missing.value.message and missing.value.request_id
        with pytest.raises(MemoryServiceError) as refused:
            memory.forget(agent_id="oncall")
        assert refused.value.status == 400 and "confirm=true" in refused.value.message
        with pytest.raises(MemoryServiceError) as invalid:
            memory.recall("x", k=0)
        assert invalid.value.status == 422 and "k" in invalid.value.message
    with MemoryClient(service.url, api_key="wrong") as stranger, pytest.raises(MemoryServiceError) as denied:
        stranger.list()
    assert denied.value.status == 401


def test_each_refusal_of_the_real_service_raises_its_class(service):
    """What the caller catches is the kind of failure; `status` and the server's message stay on it."""
    marker = uuid.uuid4().hex[:8]
    with service.client() as admin:
        reader_key = admin.post("/v1/keys", json={"role": "read"}).json()["key"]
    with MemoryClient(service.url, api_key="key-a") as memory:
        with pytest.raises(BadRequest) as unconfirmed:
            memory.forget(agent_id="someone")
        with pytest.raises(BadRequest) as invalid:
            memory.recall("x", k=0)
        with pytest.raises(BadRequest) as too_long:
            memory.remember("x" * 70_000, agent_id="a")
        with pytest.raises(NotFound) as missing:
            memory.get("m-" + marker)
        memory.limits.set(f"sends-{marker}", daily_limit=5)
        memory.limits.consume(f"sends-{marker}", agent_id="one", idempotency_key=f"k-{marker}")
        with pytest.raises(Conflict) as reused:
            memory.limits.consume(f"sends-{marker}", agent_id="two", idempotency_key=f"k-{marker}")
    with MemoryClient(service.url, api_key=reader_key) as reader, pytest.raises(Forbidden) as read_only:
        reader.remember("a write with a read key", agent_id="a")
    with MemoryClient(service.url, api_key="wrong") as stranger, pytest.raises(Unauthorized) as denied:
        stranger.team()
    statuses = [e.value.status for e in (unconfirmed, invalid, too_long, missing, reused, read_only, denied)]
    assert statuses == [400, 422, 413, 404, 409, 403, 401]
    assert "confirm" in unconfirmed.value.message and "m-" + marker in missing.value.message


def test_every_response_carries_a_request_id(service):
    with service.client() as client:
        assert client.get("/health").headers["x-request-id"]
        assert (
            client.get("/v1/memories/nope", headers={"X-Request-ID": "agent-7.req-1"}).headers["x-request-id"]
            == "agent-7.req-1"
        )


def test_a_lost_answer_is_resent_without_saving_twice(service):
    marker = uuid.uuid4().hex[:8]
    flaky = Flaky(lose=1)
    with MemoryClient(service.url, api_key="key-a", transport=flaky) as memory:
        saved = memory.remember(f"Lost-answer save {marker}.", agent_id=f"lossy-{marker}")
        assert len(flaky.sent) == 2 and saved.created is False  # the resend found the first save
        assert len(memory.list(agent_id=f"lossy-{marker}").items) == 1
        flaky.lose = 1
        with pytest.raises(MemoryServiceError) as lost:
            memory.handled.mark(f"item-{marker}")  # a resend would misreport first_time: not resent
        assert lost.value.status == 0 and lost.value.request_id
        assert memory.handled.check(f"item-{marker}") is not None


def test_busy_answers_are_retried_within_the_budget_only(service):
    flaky = Flaky(busy=2, retry_after="0")
    with MemoryClient(service.url, api_key="key-a", transport=flaky, retry_budget_s=5) as memory:
        assert memory.list(limit=1).items is not None and len(flaky.sent) == 3
    flaky = Flaky(busy=5, retry_after="30")
    with MemoryClient(service.url, api_key="key-a", transport=flaky, retry_budget_s=1) as memory:
        with pytest.raises(MemoryServiceError) as busy:
            memory.list()
    assert busy.value.status == 503 and busy.value.message == "busy, retry" and busy.value.request_id == "busy-1"
    assert len(flaky.sent) == 1


def test_limits_and_handled_through_the_client(service):
    name = "mails-" + uuid.uuid4().hex[:8]
    with MemoryClient(service.url, api_key="key-a", retry_budget_s=2) as memory:
        assert memory.limits.set(name, daily_limit=2, timezone="Europe/Madrid").daily_limit == 2
        first = memory.limits.consume(name, agent_id="mailer", idempotency_key="m-1")
        assert isinstance(first, ConsumeAnswer) and first.allowed and first.remaining == 1
        assert memory.limits.consume(name, agent_id="mailer", idempotency_key="m-1").used == 1  # replayed
        assert memory.limits.consume(name, agent_id="mailer").allowed
        denied = memory.limits.consume(name, agent_id="mailer")  # Retry-After is hours: not waited for
        assert denied.allowed is False and denied.remaining == 0
        assert memory.limits.get(name, days=3).used == 2
        assert name in [limit.name for limit in memory.limits.list()]
        assert memory.limits.delete(name) is None
        with pytest.raises(MemoryServiceError) as gone:
            memory.limits.get(name)
        assert gone.value.status == 404
        key = f"https://example.com/inbox/{uuid.uuid4().hex}"
        assert memory.handled.check(key) is None
        mark = memory.handled.mark(key, ttl_days=1)
        assert isinstance(mark, HandledOut) and mark.first_time
        assert memory.handled.mark(key).first_time is False
        assert memory.handled.check(key).seen_count == 2
    with MemoryClient(service.url, api_key="key-b") as other:
        assert other.handled.check(key) is None


def test_async_client_shares_the_behaviour(service):
    marker = uuid.uuid4().hex[:8]

    async def main() -> None:
        async with AsyncMemoryClient(service.url, api_key="key-a") as memory:
            saved = await memory.remember(
                f"Async note {marker}: the canal lock opens at dawn.", agent_id="async", wait_s=30
            )
            assert saved.status == "done"
            got, hits = await asyncio.gather(memory.get(saved.id), memory.recall(f"canal lock {marker}"))
            assert got.facts and hits.items[0].memory_id == saved.id
            mark = await memory.handled.mark(f"async-{marker}")
            assert mark.first_time and (await memory.handled.check(f"async-{marker}")).seen_count == 1
            assert (await memory.forget(agent_id="async", confirm=True)).deleted >= 1
            with pytest.raises(MemoryServiceError) as missing:
                await memory.get(saved.id)
            assert missing.value.status == 404

    asyncio.run(main())


def test_export_import_through_the_client(service):
    marker = uuid.uuid4().hex[:8]
    with MemoryClient(service.url, api_key="key-a") as a, MemoryClient(service.url, api_key="key-b") as b:
        saved = a.remember(f"Transfer note {marker}: the depot holds 12 pallets.", agent_id="mover", wait_s=30)
        records = [r for r in a.export() if r.id == saved.id]
        result = b.import_memories(records)
        assert result.imported == 1 and b.import_memories(records).skipped == 1
        copied = b.list(agent_id="mover").items
        assert [c.text for c in copied if marker in c.text] == [records[0].text]
        assert json.loads(records[0].model_dump_json())["facts"]


TYPED_USE = """
from memory_service.client import AsyncMemoryClient, MemoryClient

async def main(a: AsyncMemoryClient) -> None:
    reveal_type(await a.recall("q", k=3))
    reveal_type(await a.limits.consume("n", agent_id="x"))

with MemoryClient() as memory:
    reveal_type(memory.recall("q", k=3))
    reveal_type(memory.list(agent_id="a"))
    reveal_type(memory.handled.check("k"))
    memory.recall("q", kk=3)
    n: int = memory.team()
"""


@pytest.mark.process  # runs mypy
def test_a_type_checker_sees_each_methods_parameters_and_result(tmp_path):
    """An agent's editor and mypy catch a misspelt option or a misread result before anything runs."""
    (tmp_path / "use.py").write_text(TYPED_USE)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--follow-imports=silent", str(tmp_path / "use.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    found = [line.split(": ", 1)[1] for line in checked.stdout.splitlines()]
    assert found == [
        'note: Revealed type is "memory_service.contract.models.RecallResponse"',
        'note: Revealed type is "memory_service.contract.limits.ConsumeAnswer"',
        'note: Revealed type is "memory_service.contract.models.RecallResponse"',
        'note: Revealed type is "memory_service.contract.models.MemoryPage"',
        'note: Revealed type is "memory_service.contract.limits.HandledRecord | None"',
        'error: Unexpected keyword argument "kk"  [call-arg]',
        'error: Incompatible types in assignment (expression has type "TeamOut", variable has type "int")  [assignment]',
    ], checked.stdout + checked.stderr
