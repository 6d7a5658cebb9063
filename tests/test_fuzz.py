"""The real service fuzzed over HTTP: schemathesis from its own /openapi.json, then the inputs it never makes.

The service runs in this process (InProcessService: the app, its workers and the guarded HTTP protocol
`serve` runs, on a loopback uvicorn thread), with the fake llama-server in "ok" mode so extraction is
instant, and 2-second header and body timeouts. The schemathesis run and the slow-client cases go to a
`memory-service serve` subprocess (`served`) with the same settings: they are the `process` tier. Every
refusal must be a 4xx with the JSON error body the OpenAPI document declares for its route: never a 5xx,
a hang, or a connection dropped before the answer.

The schemathesis run is bounded (FUZZ_EXAMPLES per operation and phase, default 100; FUZZ_SEED, fixed by
default so CI is repeatable): about a minute on two cores.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServiceProcess
from inprocess import InProcessService
from test_openapi_contract import Contract

from tests.fakes.fake_llama_server import FakeLlamaServer

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))
SEED = os.environ.get("FUZZ_SEED", "20261201")
# What the service promises: no 5xx, every status, content type, header and body as documented, auth
# enforced, deleted things gone. Not `positive_data_acceptance` / `negative_data_rejection`: some rules are
# not expressible in JSON Schema (an opaque cursor, a real IANA timezone, scope=agent needing agent_id,
# metadata depth, bulk forget needing confirm=true), so schema-valid requests are rightly refused.
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "allow_header_conformance",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
)
TIMEOUT_S = 2.0  # MEMORY_HEADER_TIMEOUT_S and MEMORY_BODY_TIMEOUT_S of the service under test
TEN_MB = 10 * 1024 * 1024
NUL = "a\x00b"
# every route with a JSON body: (method, path, documented template, a valid body)
JSON_ROUTES = [
    ("POST", "/v1/remember", "/v1/remember", {"text": "The dock opens at six.", "agent_id": "fuzzer"}),
    ("POST", "/v1/recall", "/v1/recall", {"query": "dock"}),
    ("PUT", "/v1/limits/fuzz", "/v1/limits/{name}", {"daily_limit": 5, "timezone": "UTC"}),
    ("POST", "/v1/limits/fuzz/consume", "/v1/limits/{name}/consume", {"agent_id": "fuzzer"}),
    ("POST", "/v1/handled", "/v1/handled", {"key": "https://example.com/1"}),
    ("POST", "/v1/keys", "/v1/keys", {"role": "read"}),
]


SERVICE_ENV = {"MEMORY_HEADER_TIMEOUT_S": str(TIMEOUT_S), "MEMORY_BODY_TIMEOUT_S": str(TIMEOUT_S)}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as server:
        yield server


@pytest.fixture(scope="module")
def service(fake: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    svc = InProcessService(tmp_path_factory.mktemp("fuzz") / "data", fake.url, env=SERVICE_ENV).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def served(fake: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """`serve` itself, for what is kept to a process: the fuzzer's long run and the slow clients."""
    svc = ServiceProcess(tmp_path_factory.mktemp("fuzz-served") / "data", fake.url, env=SERVICE_ENV)
    svc.start()
    yield svc
    svc.kill()


@pytest.fixture(scope="module")
def contract(service: InProcessService) -> Contract:
    return Contract(httpx.get(service.url + "/openapi.json", timeout=30).json())


@pytest.fixture
def client(service: InProcessService) -> Iterator[httpx.Client]:
    with service.client("key-a") as c:
        yield c


@pytest.fixture
def served_client(served: ServiceProcess) -> Iterator[httpx.Client]:
    with served.client("key-a") as c:
        yield c


def refused(contract: Contract, response: httpx.Response, template: str, status: int | None = None) -> dict:
    """A 4xx (`status` if given) with the `{error, detail}` body, as the document declares for `template`."""
    assert 400 <= response.status_code < 500 and (status is None or response.status_code == status), (
        response.status_code,
        response.text[:500],
    )
    body = response.json()
    assert isinstance(body.get("error"), str) and isinstance(body.get("detail"), str), body
    problems = contract.problems(response, template)
    assert not problems, "\n".join(problems)
    return body


def memories(client: httpx.Client) -> int:
    return client.get("/v1/team").json()["memories"]


# ---------------------------------------------------------------- raw HTTP


def connect(service: InProcessService | ServiceProcess, timeout: float = 15) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes: a reset before that is a failure, not an answer."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def parse(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body[: int(headers["content-length"])])


def request_head(method: str, path: str, *extra: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: fuzz", "Authorization: Bearer key-a", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# ---------------------------------------------------------------- schemathesis


@pytest.mark.process  # schemathesis' own CLI, against `serve`
def test_schemathesis_finds_no_server_error_and_no_undocumented_response(
    served: ServiceProcess, tmp_path: Path
) -> None:
    """All phases (examples, coverage, fuzzing, stateful) against every operation, as an admin env key (env keys
    cannot be revoked, so the stateful phase's key revocations never lock the run out)."""
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{served.url}/openapi.json",
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            SEED,
            "--workers",
            "1",
            "--checks",
            ",".join(CHECKS),
            "--header",
            "Authorization: Bearer key-a",
            "--request-timeout",
            "60",
            "--output-truncate",
            "false",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "SCHEMATHESIS_HOOKS": str(Path(__file__).with_name("fuzz_hooks.py")), "NO_COLOR": "1"},
    )
    elapsed = time.monotonic() - started
    assert run.returncode == 0, f"failed after {elapsed:.0f}s:\n{run.stdout[-20000:]}\n{run.stderr[-3000:]}"
    # warnings (say, operations that mostly answered 404 to made-up ids) are advice, not failures
    assert re.search(r"(\d+) generated, \1 passed", run.stdout), run.stdout[-5000:]
    assert "Internal Server Error" not in served.log()


# ---------------------------------------------------------------- bodies schemathesis never sends


@pytest.mark.parametrize("method,path,template,body", JSON_ROUTES, ids=[r[1] for r in JSON_ROUTES])
def test_a_body_that_is_not_utf8_is_a_400_that_says_so(
    contract: Contract, client: httpx.Client, method: str, path: str, template: str, body: dict
) -> None:
    raw = json.dumps(body).encode()[:-1] + b', "x": "caf\xe9 \xff\xfe"}'
    response = client.request(method, path, content=raw, headers={"content-type": "application/json"})
    assert "UTF-8" in refused(contract, response, template, 400)["detail"]


def test_an_import_line_that_is_not_utf8_is_reported_and_skipped(client: httpx.Client) -> None:
    response = client.post("/v1/import", content=b'{"id": "m1", "text": "caf\xe9"}\n')
    assert response.status_code == 200 and response.json()["failed"] == 1, response.text


@pytest.mark.parametrize("method,path,template,body", JSON_ROUTES, ids=[r[1] for r in JSON_ROUTES])
def test_a_10mb_body_is_a_413_and_the_connection_stays_usable(
    contract: Contract, client: httpx.Client, method: str, path: str, template: str, body: dict
) -> None:
    big = {**body, "padding": "x" * TEN_MB}
    response = client.request(
        method, path, content=json.dumps(big).encode(), headers={"content-type": "application/json"}
    )
    assert "limit" in refused(contract, response, template, 413)["detail"]
    assert client.get("/health").status_code == 200  # same client, same pool: nothing was dropped


def test_a_10mb_body_is_refused_before_it_is_sent(service: InProcessService) -> None:
    """With a Content-Length the 413 comes from the headers alone; chunked, right after the limit is passed.
    Neither waits for (or holds) the rest of the body."""
    with connect(service) as sock:
        sock.sendall(
            request_head(
                "POST",
                "/v1/remember",
                "Content-Type: application/json",
                f"Content-Length: {TEN_MB}",
                "Connection: close",
            )
        )
        status, _, body = parse(read_all(sock))
        assert status == 413 and str(TEN_MB) in body["detail"]
    with connect(service) as sock:
        sock.sendall(
            request_head(
                "POST",
                "/v1/remember",
                "Content-Type: application/json",
                "Transfer-Encoding: chunked",
                "Connection: close",
            )
        )
        chunk = b"x" * 65536
        for _ in range(8):  # 512 KiB of 10 MB: past the 320 KiB limit, then stop sending
            if select.select([sock], [], [], 0)[0]:  # the answer is already here: sending more only earns a reset
                break
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (
                BrokenPipeError,
                ConnectionResetError,
            ):  # answered and closed before the last chunks: what is tested
                break
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 413 "), head[:200]


def test_a_10mb_import_line_is_skipped_without_being_held(client: httpx.Client) -> None:
    good = {"id": "fuzz-import-1", "text": "The ferry leaves at nine.", "agent_id": "porter", "created_at": 1.0}
    body = b'{"id": "huge", "text": "' + b"x" * TEN_MB + b'"}\n' + json.dumps(good).encode() + b"\n"
    result = client.post("/v1/import", content=body).json()
    assert result["failed"] == 1 and result["imported"] + result["skipped"] == 1, result
    assert result["errors"][0]["line"] == 1 and "longer than" in result["errors"][0]["detail"]


def nested(depth: int, leaf: str = "1") -> str:
    return '{"a":' * depth + leaf + "}" * depth


@pytest.mark.parametrize("method,path,template,body", JSON_ROUTES, ids=[r[1] for r in JSON_ROUTES])
def test_10000_deep_json_is_a_400_not_a_recursion_error(
    contract: Contract, client: httpx.Client, method: str, path: str, template: str, body: dict
) -> None:
    raw = json.dumps(body)[:-1] + ', "metadata": ' + nested(10_000) + "}"
    response = client.request(method, path, content=raw.encode(), headers={"content-type": "application/json"})
    assert "too deeply" in refused(contract, response, template, 400)["detail"]


def test_metadata_depth_is_limited_to_32(contract: Contract, client: httpx.Client) -> None:
    """900 levels used to be saved, and then GET /v1/memories/{id} failed with a 500 (serializer recursion)."""

    def remember(depth: int) -> httpx.Response:
        raw = '{"text": "Nested note.", "agent_id": "fuzzer", "metadata": ' + nested(depth - 1, "{}") + "}"
        return client.post("/v1/remember", content=raw.encode(), headers={"content-type": "application/json"})

    before = memories(client)
    for depth in (33, 900):
        body = refused(contract, remember(depth), "/v1/remember", 422)
        assert body["errors"][0]["field"] == "metadata" and "32 levels" in body["detail"]
    assert memories(client) == before
    saved = remember(32)
    assert saved.status_code == 202, saved.text
    shown = client.get(f"/v1/memories/{saved.json()['id']}")
    assert shown.status_code == 200 and not contract.problems(shown, "/v1/memories/{memory_id}")
    line = {
        "id": "deep",
        "text": "Deep import.",
        "agent_id": "fuzzer",
        "created_at": 1.0,
        "metadata": json.loads(nested(100)),
    }
    result = client.post("/v1/import", content=json.dumps(line).encode()).json()
    assert result["failed"] == 1 and "32 levels" in result["errors"][0]["detail"], result


# ---------------------------------------------------------------- NUL in every string field

REMEMBER = {"text": "The dock opens at six.", "agent_id": "fuzzer"}
SPEC = {"daily_limit": 5, "timezone": "UTC"}
# (request, documented template, status, the field the error must name)
NUL_CASES: list[tuple[str, str, str, dict[str, Any], int, str]] = [
    ("POST", "/v1/remember", "/v1/remember", {"json": {**REMEMBER, "text": "dock\x00six"}}, 422, "text"),
    ("POST", "/v1/remember", "/v1/remember", {"json": {**REMEMBER, "agent_id": NUL}}, 422, "agent_id"),
    ("POST", "/v1/remember", "/v1/remember", {"json": {**REMEMBER, "run_id": NUL}}, 422, "run_id"),
    ("POST", "/v1/remember", "/v1/remember", {"json": {**REMEMBER, "tags": [NUL]}}, 422, "tags.0"),
    ("POST", "/v1/remember", "/v1/remember", {"json": {**REMEMBER, "idempotency_key": NUL}}, 422, "idempotency_key"),
    ("POST", "/v1/remember", "/v1/remember", {"json": {**REMEMBER, "metadata": {NUL: 1}}}, 422, "metadata"),
    ("POST", "/v1/remember", "/v1/remember", {"json": {**REMEMBER, "metadata": {"k": [NUL]}}}, 422, "metadata"),
    ("POST", "/v1/recall", "/v1/recall", {"json": {"query": NUL}}, 422, "query"),
    (
        "POST",
        "/v1/recall",
        "/v1/recall",
        {"json": {"query": "dock", "scope": "agent", "agent_id": NUL}},
        422,
        "agent_id",
    ),
    ("POST", "/v1/recall", "/v1/recall", {"json": {"query": "dock", "tags": [NUL]}}, 422, "tags.0"),
    ("POST", "/v1/recall", "/v1/recall", {"json": {"query": "dock", "scope": NUL}}, 422, "scope"),
    ("POST", "/v1/recall", "/v1/recall", {"json": {"query": "dock", "kinds": [NUL]}}, 422, "kinds.0"),
    ("POST", "/v1/recall", "/v1/recall", {"json": {"query": "dock", "since": NUL}}, 422, "since"),
    ("GET", "/v1/memories", "/v1/memories", {"params": {"agent_id": NUL}}, 422, "query.agent_id"),
    ("GET", "/v1/memories", "/v1/memories", {"params": {"run_id": NUL}}, 422, "query.run_id"),
    ("GET", "/v1/memories", "/v1/memories", {"params": {"tag": NUL}}, 422, "query.tag"),
    ("GET", "/v1/memories", "/v1/memories", {"params": {"status": NUL}}, 422, "query.status"),
    ("GET", "/v1/memories", "/v1/memories", {"params": {"since": NUL}}, 422, "query.since"),
    ("GET", "/v1/memories", "/v1/memories", {"params": {"cursor": NUL}}, 400, ""),
    ("GET", "/v1/memories/a%00b", "/v1/memories/{memory_id}", {}, 404, ""),
    ("DELETE", "/v1/memories/a%00b", "/v1/memories/{memory_id}", {}, 404, ""),
    ("DELETE", "/v1/memories", "/v1/memories", {"params": {"agent_id": NUL, "confirm": "true"}}, 422, "query.agent_id"),
    ("DELETE", "/v1/memories", "/v1/memories", {"params": {"run_id": NUL, "confirm": "true"}}, 422, "query.run_id"),
    ("PUT", "/v1/limits/a%00b", "/v1/limits/{name}", {"json": SPEC}, 422, "path.name"),
    (
        "PUT",
        "/v1/limits/fuzz",
        "/v1/limits/{name}",
        {"json": {**SPEC, "timezone": "Europe/Ma\x00drid"}},
        422,
        "timezone",
    ),
    ("PUT", "/v1/limits/fuzz", "/v1/limits/{name}", {"json": {**SPEC, "per": NUL}}, 422, "per"),
    ("GET", "/v1/limits/a%00b", "/v1/limits/{name}", {}, 422, "path.name"),
    ("GET", "/v1/limits/fuzz", "/v1/limits/{name}", {"params": {"agent_id": NUL}}, 422, "query.agent_id"),
    ("GET", "/v1/limits", "/v1/limits", {"params": {"agent_id": NUL}}, 422, "query.agent_id"),
    ("DELETE", "/v1/limits/a%00b", "/v1/limits/{name}", {}, 422, "path.name"),
    ("POST", "/v1/limits/a%00b/consume", "/v1/limits/{name}/consume", {"json": {"agent_id": "x"}}, 422, "path.name"),
    ("POST", "/v1/limits/fuzz/consume", "/v1/limits/{name}/consume", {"json": {"agent_id": NUL}}, 422, "agent_id"),
    (
        "POST",
        "/v1/limits/fuzz/consume",
        "/v1/limits/{name}/consume",
        {"json": {"agent_id": "x", "idempotency_key": NUL}},
        422,
        "idempotency_key",
    ),
    ("POST", "/v1/handled", "/v1/handled", {"json": {"key": NUL}}, 422, "key"),
    ("POST", "/v1/handled", "/v1/handled", {"json": {"key": "k", "agent_id": NUL}}, 422, "agent_id"),
    ("GET", "/v1/handled", "/v1/handled", {"params": {"key": NUL}}, 422, "query.key"),
    ("GET", "/v1/handled/a%00b", "/v1/handled/{key}", {}, 422, "path.key"),
    ("GET", "/v1/handled/k", "/v1/handled/{key}", {"params": {"agent_id": NUL}}, 422, "query.agent_id"),
    ("POST", "/v1/keys", "/v1/keys", {"json": {"role": NUL}}, 422, "role"),
    ("POST", "/v1/keys", "/v1/keys", {"json": {"role": "read", "agent_id": NUL}}, 422, "agent_id"),
    ("POST", "/v1/keys", "/v1/keys", {"json": {"role": "read", "label": NUL}}, 422, "label"),
    ("GET", "/v1/keys", "/v1/keys", {"params": {"include_revoked": NUL}}, 422, "query.include_revoked"),
    ("DELETE", "/v1/keys/a%00b", "/v1/keys/{key_id}", {}, 404, ""),
    ("POST", "/v1/import", "/v1/import", {"params": {"re_extract": NUL}, "content": b""}, 422, "query.re_extract"),
]


@pytest.fixture(scope="module")
def limit_fuzz(service: InProcessService) -> None:
    with service.client("key-a") as c:
        assert c.put("/v1/limits/fuzz", json=SPEC).status_code in (200, 201)


@pytest.mark.parametrize(
    "method,path,template,kwargs,status,field", NUL_CASES, ids=[f"{c[0]} {c[1]} {c[5] or c[4]}" for c in NUL_CASES]
)
def test_nul_in_every_string_field_is_refused(
    contract: Contract,
    client: httpx.Client,
    limit_fuzz: None,
    method: str,
    path: str,
    template: str,
    kwargs: dict,
    status: int,
    field: str,
) -> None:
    before = memories(client)
    body = refused(contract, client.request(method, path, **kwargs), template, status)
    if field:
        assert field in [e["field"] for e in body.get("errors") or []], body
    assert memories(client) == before


def test_nul_in_every_field_of_an_import_line_is_reported(client: httpx.Client) -> None:
    good = {
        "id": "nul-ok",
        "text": "The ferry leaves at ten.",
        "agent_id": "porter",
        "created_at": 2.0,
        "facts": [{"id": "f1", "text": "The ferry leaves at ten."}],
    }
    bad = {
        "id": {"id": NUL},
        "text": {"text": NUL},
        "agent_id": {"agent_id": NUL},
        "run_id": {"run_id": NUL},
        "tags.0": {"tags": [NUL]},
        "metadata": {"metadata": {NUL: NUL}},
        "idempotency_key": {"idempotency_key": NUL},
        "facts.0.id": {"facts": [{"id": NUL, "text": "x"}]},
        "facts.0.text": {"facts": [{"id": "f", "text": NUL}]},
    }
    lines = [json.dumps({**good, "id": f"nul-{n}", **change}) for n, change in enumerate(bad.values())]
    result = client.post("/v1/import", content="\n".join([*lines, json.dumps(good)]).encode()).json()
    assert result["failed"] == len(bad) and result["imported"] + result["skipped"] == 1, result
    for error, field in zip(result["errors"], bad):
        assert error["detail"].startswith(f"{field}: "), (field, error)


@pytest.mark.parametrize(
    "head",
    [
        request_head("GET", "/v1/team").replace(b"Bearer key-a", b"Bearer key-\x00a"),
        request_head("GET", "/v1/team", "X-Request-ID: a\x00b"),
        request_head("GET", "/v1/te\x00am"),
        request_head("GET", "/v1/team", "X-Note: caf\x01e"),
    ],
    ids=["nul-in-authorization", "nul-in-request-id", "nul-in-path", "control-char-in-header"],
)
def test_nul_in_the_request_line_or_headers_is_a_json_400(service: InProcessService, head: bytes) -> None:
    with connect(service) as sock:
        sock.sendall(head)
        status, headers, body = parse(read_all(sock))
    assert status == 400 and headers["content-type"] == "application/json", (status, headers)
    assert body["error"] == "bad_request" and "malformed" in body["detail"]


def test_headers_over_64kib_are_a_json_431_without_a_reset(service: InProcessService) -> None:
    with connect(service) as sock:
        sock.sendall(request_head("GET", "/v1/team", *(["X-Pad: " + "p" * 100] * 2000)))
        status, _, body = parse(read_all(sock))
    assert status == 431 and "65536" in body["detail"]


# ---------------------------------------------------------------- slow clients


@pytest.mark.process  # a slow client, against `serve` itself
def test_slowloris_headers_get_a_408_while_others_are_served(served: ServiceProcess) -> None:
    """Headers one byte at a time: the service keeps answering everyone else, and after MEMORY_HEADER_TIMEOUT_S
    answers the slow one 408 and closes, instead of holding the connection for as long as it drips."""
    drip = b"GET /health HTTP/1.1\r\nHost: fuzz\r\nX-Slow: " + b"y" * 300
    stop = threading.Event()
    with connect(served) as slow:
        started = time.monotonic()

        def trickle() -> None:
            for byte in drip:
                if stop.is_set():
                    return
                try:
                    slow.send(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.1)

        threading.Thread(target=trickle, daemon=True).start()
        with httpx.Client(base_url=served.url, timeout=10) as other:
            for _ in range(4):
                t = time.monotonic()
                assert other.get("/health").status_code == 200
                assert time.monotonic() - t < 2.0
                time.sleep(0.3)
        try:
            status, _, body = parse(read_all(slow))
        finally:
            stop.set()
        elapsed = time.monotonic() - started
    assert status == 408 and "MEMORY_HEADER_TIMEOUT_S" in body["detail"], body
    assert TIMEOUT_S - 0.5 <= elapsed < TIMEOUT_S + 6, elapsed


@pytest.mark.process  # a slow client, against `serve` itself
def test_a_stalled_body_gets_a_408_and_stores_nothing(served: ServiceProcess, served_client: httpx.Client) -> None:
    before = memories(served_client)
    with connect(served) as sock:
        sock.sendall(
            request_head("POST", "/v1/remember", "Content-Type: application/json", "Content-Length: 200")
            + b'{"text": "half a bo'
        )
        started = time.monotonic()
        status, _, body = parse(read_all(sock))
    assert status == 408 and "MEMORY_BODY_TIMEOUT_S" in body["detail"], body
    assert time.monotonic() - started < TIMEOUT_S + 6
    assert memories(served_client) == before


@pytest.mark.process  # a slow client, against `serve` itself
def test_a_slow_but_steady_body_is_not_cut(served: ServiceProcess) -> None:
    """The body timeout is between bytes, not for the whole body: a slow link still gets its save in."""
    raw = json.dumps({"text": "Sent slowly but surely.", "agent_id": "fuzzer"}).encode()
    pieces = [raw[i : i + 8] for i in range(0, len(raw), 8)]
    with connect(served) as sock:
        sock.sendall(
            request_head(
                "POST",
                "/v1/remember",
                "Content-Type: application/json",
                f"Content-Length: {len(raw)}",
                "Connection: close",
            )
        )
        started = time.monotonic()
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(TIMEOUT_S / 3)
        status, _, body = parse(read_all(sock))
    assert time.monotonic() - started > TIMEOUT_S  # longer than the timeout in all, so only idle time counts
    assert status == 202, body


@pytest.mark.process  # a slow client, against `serve` itself
def test_an_idle_connection_is_closed_without_an_answer(served: ServiceProcess) -> None:
    with connect(served) as sock:
        started = time.monotonic()
        assert read_all(sock) == b""
    assert TIMEOUT_S - 0.5 <= time.monotonic() - started < TIMEOUT_S + 4


# ---------------------------------------------------------------- what schemathesis found


def test_405_lists_every_method_the_path_serves(client: httpx.Client) -> None:
    """The router's own 405 named only the first route matching the path (`Allow: POST` on /v1/keys)."""
    for method, path, allowed in (
        ("OPTIONS", "/v1/keys", "GET, POST"),
        ("PATCH", "/v1/limits/x", "GET, PUT, DELETE"),
        ("OPTIONS", "/v1/memories/m1", "GET, DELETE"),
        ("PUT", "/v1/import", "POST"),
    ):
        response = client.request(method, path)
        assert response.status_code == 405 and response.headers["allow"] == allowed, (path, response.headers)
        assert allowed in response.json()["detail"]


def test_numbers_are_json_numbers(contract: Contract, client: httpx.Client, limit_fuzz: None) -> None:
    """158.0 is an integer to JSON Schema, so it is accepted where an integer is; true and "5" are not numbers."""
    consume = "/v1/limits/{name}/consume"
    assert client.post("/v1/limits/fuzz/consume", json={"agent_id": "n", "amount": 1.0}).status_code in (200, 429)
    assert client.post("/v1/handled", json={"key": "float-ttl", "ttl_days": 3.0}).status_code == 200
    assert client.post("/v1/recall", json={"query": "dock", "k": 2.0}).status_code == 200
    refused(contract, client.post("/v1/limits/fuzz/consume", json={"agent_id": "n", "amount": True}), consume, 422)
    refused(contract, client.post("/v1/limits/fuzz/consume", json={"agent_id": "n", "amount": "2"}), consume, 422)
    refused(contract, client.post("/v1/limits/fuzz/consume", json={"agent_id": "n", "amount": 1.5}), consume, 422)
    refused(contract, client.post("/v1/recall", json={"query": "dock", "min_score": False}), "/v1/recall", 422)
    refused(contract, client.post("/v1/recall", json={"query": "dock", "k": True}), "/v1/recall", 422)
    refused(contract, client.post("/v1/remember", json={**REMEMBER, "wait_s": True}), "/v1/remember", 422)
