"""MEMORY_LLM_URL lists several llama-servers: a pool that survives one of them dying.

Two real llama-servers (tiny model, one thread each) behind one real service over HTTP:
one is SIGKILLed while it extracts, its job and the rest go to the other, and once it is
restarted on the same port it is reported up and takes jobs again.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import eventually, start_llama, wait_status

from memory_service.config import ConfigError, Settings
from memory_service.llm.pool import ModelPool
from memory_service.ops.doctor import run_doctor
from memory_service.testbed.service_runner import llama_busy
from tests.fakes.fake_llama_server import FakeLlamaServer

TEXTS = [
    "The Kestrel build server moved to rack {n} in the Lisbon office.",
    "Dana Whitfield owns the billing alerts for region {n}.",
    "The Osprey nightly backup now starts at 0{n}:30 UTC.",
    "Invoice batch {n} for Acme Corp was approved by Priya on Monday.",
]


def save(client: httpx.Client, text: str) -> str:
    response = client.post("/v1/remember", json={"text": text, "agent_id": "pool"})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def server_of(memory: dict[str, Any]) -> str:
    """Which llama-server of the pool extracted it (the worker writes it on the attempt)."""
    return memory["timings"]["attempt"]["server"]


def servers_up(client: httpx.Client) -> dict[str, bool]:
    return {s["url"]: s["reachable"] for s in client.get("/ready").json()["model_servers"]}


def test_a_pool_keeps_extracting_when_one_server_dies_and_uses_it_again_once_it_is_back(
    tmp_path: Path, service_factory
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = start_llama("tiny", tmp_path / "a"), start_llama("tiny", tmp_path / "b")
    try:
        service = service_factory(f"{first.url},{second.url}", env={"MEMORY_METRICS_TOKEN": "scrape"})
        with service.client() as client:
            ready = client.get("/ready")
            assert ready.status_code == 200, ready.text
            body = ready.json()
            assert [s["url"] for s in body["model_servers"]] == [first.url, second.url]
            assert all(s["reachable"] and s["slots"] == 1 for s in body["model_servers"])
            assert body["model_server"]["url"] == first.url  # the single-server view: the first one up
            metrics = client.get("/metrics", headers={"Authorization": "Bearer scrape"}).text
            assert f'memory_model_up{{server="{first.url}"}} 1.0' in metrics
            assert f'memory_model_up{{server="{second.url}"}} 1.0' in metrics

            ids = [save(client, template.format(n=1)) for template in TEXTS]
            # SIGKILL the first server while it is in the middle of extracting one of them
            eventually("the first server to be extracting", lambda: llama_busy(first.url), timeout=60)
            first.stop(grace_s=0)
            memories = [wait_status(client, memory_id, timeout=180) for memory_id in ids]
            assert [m["status"] for m in memories] == ["done"] * len(ids), [m["last_error"] for m in memories]
            # the job cut off mid-request was handed on without spending an attempt, and the second finished it
            handed_on = [m for m in memories if m["deferrals"]]
            assert handed_on and all(m["attempts"] == 1 and server_of(m) == second.url for m in handed_on)
            assert all(
                "unreachable" in m["extraction"]["deferred"] and "slow" not in m["extraction"] for m in handed_on
            )
            down = client.get("/ready").json()
            assert {s["url"]: s["reachable"] for s in down["model_servers"]} == {first.url: False, second.url: True}
            assert down["status"] == "ready" and down["model_server"]["url"] == second.url
            assert next(s for s in down["model_servers"] if s["url"] == first.url)["error"]

            # back on the same port: reported up again, and it takes jobs again
            first.start()
            eventually("the first server to be reported up", lambda: servers_up(client)[first.url], timeout=30)
            later = [save(client, template.format(n=2)) for template in TEXTS]
            memories = [wait_status(client, memory_id, timeout=180) for memory_id in later]
            assert all(m["status"] == "done" for m in memories)
            assert first.url in {server_of(m) for m in memories}
    finally:
        first.stop()
        second.stop()


def test_a_single_url_behaves_as_before_and_a_bad_entry_is_named() -> None:
    assert Settings(llm_url="http://127.0.0.1:8080/").llm_urls == ["http://127.0.0.1:8080"]
    assert Settings(llm_url="http://a:1, https://b:2/").llm_urls == ["http://a:1", "https://b:2"]
    for bad, says in [
        ("http://a:1,b:2", "entry 'b:2' must look like http://host:port"),
        ("http://a:1,ftp://b", "entry 'ftp://b'"),
        ("http://a:99999", "entry 'http://a:99999'"),
        ("http://a:1,http://a:1/", "listed twice"),
    ]:
        with pytest.raises(ConfigError) as error:
            Settings().with_overrides(llm_url=bad)
        assert str(error.value).startswith(f"MEMORY_LLM_URL={bad!r}: ") and says in str(error.value)


def test_doctor_checks_each_server_of_the_pool_and_fails_when_one_is_down(
    capsys: pytest.CaptureFixture[str],
) -> None:
    gone = FakeLlamaServer().start()
    down = gone.url
    gone.stop()
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        up = fake.url
        code = run_doctor(argparse.Namespace(llm_url=f"{up},{down}", model=None, json=False))
    out = capsys.readouterr().out
    assert code == 1
    assert f"memory-service doctor: llama-server at {up}" in out
    assert f"memory-service doctor: llama-server at {down}" in out and "FAIL  server" in out
    assert out.strip().splitlines()[-1] == (
        f"RESULT: FAIL for the pool of 2 llama-servers (1 failing: {down}; the others keep extracting)"
    )


def test_the_pool_estimates_with_the_servers_that_are_up_side_by_side() -> None:
    settings = Settings(llm_url="http://127.0.0.1:1,http://127.0.0.1:2")
    pool = ModelPool.open(settings, speed_prior=(200.0, 20.0))
    alone, basis = pool.handles[0].estimate(10, 400, 150)
    assert alone and basis == "bootstrap smoke test"
    # none up yet: the jobs wait for the servers, which then work side by side
    assert pool.estimate(10, 400, 150)[0] == pytest.approx(alone / 2, abs=0.02)
    for handle in pool.handles:
        handle._ready.set()
    assert pool.estimate(10, 400, 150) == (pytest.approx(alone / 2, abs=0.02), basis)
    assert pool.servers() == {"http://127.0.0.1:1": True, "http://127.0.0.1:2": True}
    pool.handles[0].mark_down("gone")  # one down: the other does it all
    assert pool.primary is pool.handles[1] and pool.estimate(10, 400, 150) == (alone, basis)
    asyncio.run(pool.aclose())
