"""Self-tests of the fake llama-server: the service's failure tests are only as good as it is."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.fake_llama_server import FakeLlamaServer

MESSAGES = [
    {"role": "system", "content": "Extract durable facts as JSON."},
    {"role": "user", "content": "I live in Lyon. My cat is called Miso! I prefer tea over coffee."},
]
NO_THINK = {"enable_thinking": False}


@pytest.fixture
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer(tokens_per_s=20_000, think_tokens=400) as server:
        yield server


def chat(fake: FakeLlamaServer, timeout: float = 5.0, **body: Any) -> httpx.Response:
    return httpx.post(f"{fake.url}/v1/chat/completions", json={"messages": MESSAGES, **body}, timeout=timeout)


def test_ok_returns_schema_json_with_llama_cpp_shape(fake: FakeLlamaServer) -> None:
    reply = chat(fake, max_tokens=256, temperature=0).json()
    choice = reply["choices"][0]
    assert reply["object"] == "chat.completion"
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    assert json.loads(choice["message"]["content"]) == {
        "facts": ["I live in Lyon.", "My cat is called Miso!", "I prefer tea over coffee."]
    }
    timings = reply["timings"]
    assert {"cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"} <= set(timings)
    assert reply["usage"]["completion_tokens"] == timings["predicted_n"] > 0

    # prompt_n is the token count of the rendered template, as /tokenize counts it.
    prompt = httpx.post(f"{fake.url}/apply-template", json={"messages": MESSAGES}).json()["prompt"]
    tokens = httpx.post(f"{fake.url}/tokenize", json={"content": prompt}).json()["tokens"]
    assert all(isinstance(t, int) for t in tokens)
    assert len(tokens) == timings["prompt_n"] == reply["usage"]["prompt_tokens"]


def test_health_props_and_models(fake: FakeLlamaServer) -> None:
    assert httpx.get(f"{fake.url}/health").json() == {"status": "ok"}
    props = httpx.get(f"{fake.url}/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 4096
    assert props["total_slots"] == 1 and props["build_info"].startswith("b11434")
    assert "enable_thinking" in props["chat_template"] and props["model_path"]
    assert httpx.get(f"{fake.url}/v1/models").json()["data"][0]["object"] == "model"


def test_configured_facts_and_max_tokens_truncation(fake: FakeLlamaServer) -> None:
    fake.set_mode("ok", facts=["alpha fact", "beta fact"])
    assert json.loads(chat(fake).json()["choices"][0]["message"]["content"]) == {"facts": ["alpha fact", "beta fact"]}
    reply = chat(fake, max_tokens=4).json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["timings"]["predicted_n"] == 4


def test_thinking_without_kwarg_runs_out_of_tokens_inside_think(fake: FakeLlamaServer) -> None:
    fake.set_mode("thinking")
    reply = chat(fake, max_tokens=50).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"].startswith("<think>")
    assert "</think>" not in choice["message"]["content"]
    assert reply["timings"]["predicted_n"] == 50


def test_thinking_with_kwarg_false_answers_json(fake: FakeLlamaServer) -> None:
    fake.set_mode("thinking")
    choice = chat(fake, max_tokens=256, chat_template_kwargs=NO_THINK).json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["content"])["facts"]


def test_apply_template_shows_whether_the_kwarg_is_honoured(fake: FakeLlamaServer) -> None:
    def render(**extra: Any) -> str:
        return httpx.post(f"{fake.url}/apply-template", json={"messages": MESSAGES, **extra}).json()["prompt"]

    assert render().endswith("<|im_start|>assistant\n")
    assert render(chat_template_kwargs=NO_THINK).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    fake.set_mode("ignore_kwarg")
    assert render(chat_template_kwargs=NO_THINK) == render()
    content = chat(fake, max_tokens=20, chat_template_kwargs=NO_THINK).json()["choices"][0]["message"]["content"]
    assert content.startswith("<think>")


def test_hang_times_out_client_and_stop_stays_prompt() -> None:
    server = FakeLlamaServer("hang").start()
    try:
        with pytest.raises(httpx.ReadTimeout):
            chat(server, timeout=0.5)
        # A second hanging request is still pending while other endpoints answer.
        pending = threading.Thread(target=lambda: _swallow(lambda: chat(server, timeout=10)), daemon=True)
        pending.start()
        time.sleep(0.1)
        assert httpx.get(f"{server.url}/health", timeout=2).status_code == 200
    finally:
        started = time.monotonic()
        server.stop()
    assert time.monotonic() - started < 1.0
    pending.join(timeout=2)
    assert not pending.is_alive()


def _swallow(call: Any) -> None:
    try:
        call()
    except httpx.HTTPError:
        pass


def test_mode_switch_over_http_and_request_log(fake: FakeLlamaServer) -> None:
    state = httpx.post(f"{fake.url}/_fake/mode", json={"mode": "http_503"}).json()
    assert state["mode"] == "http_503"
    failed = chat(fake, chat_template_kwargs=NO_THINK, response_format={"type": "json_object"}, cache_prompt=True)
    assert failed.status_code == 503 and failed.json()["error"]["code"] == 503

    assert httpx.post(f"{fake.url}/_fake/mode", json={"mode": "no_such_mode"}).status_code == 400
    assert httpx.post(f"{fake.url}/_fake/mode", json={"mode": "fail_then_ok", "fail_count": 1}).status_code == 200
    assert [chat(fake).status_code for _ in range(3)] == [500, 200, 200]

    logged = httpx.get(f"{fake.url}/_fake/requests").json()["requests"]
    assert len(logged) == len(fake.requests) == 4
    assert logged[0]["chat_template_kwargs"] == NO_THINK and logged[0]["cache_prompt"] is True
    assert httpx.delete(f"{fake.url}/_fake/requests").json() == {"requests": []}
    assert fake.requests == []


def test_context_overflow_is_a_llama_cpp_400(fake: FakeLlamaServer) -> None:
    fake.set_mode("ok", n_ctx=64)
    assert httpx.get(f"{fake.url}/props").json()["default_generation_settings"]["n_ctx"] == 64
    response = chat(fake, max_tokens=512)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 64
    assert "exceeds the available context size" in error["message"]


@pytest.mark.parametrize(
    ("mode", "check"),
    [
        ("unclosed_think", lambda m: m["content"].startswith("<think>") and "</think>" not in m["content"]),
        ("think_then_json", lambda m: json.loads(m["content"].split("</think>", 1)[1])["facts"]),
        ("reasoning_content", lambda m: json.loads(m["content"])["facts"] and m["reasoning_content"]),
        ("reasoning_only", lambda m: m["content"] == "" and '"facts"' in m["reasoning_content"]),
        ("malformed", lambda m: m["content"].startswith("Here are the facts:")),
        ("tool_call", lambda m: "<tool_call>" in m["content"] and m["tool_calls"] is None),
    ],
)
def test_content_faults(fake: FakeLlamaServer, mode: str, check: Any) -> None:
    fake.set_mode(mode, reasoning_tokens=30)
    assert check(chat(fake).json()["choices"][0]["message"])


def test_truncated_and_drop(fake: FakeLlamaServer) -> None:
    fake.set_mode("truncated")
    choice = chat(fake).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    with pytest.raises(ValueError):
        json.loads(choice["message"]["content"])
    for style in ("close", "partial"):
        fake.set_mode("drop", drop_style=style)
        with pytest.raises(httpx.RemoteProtocolError):
            chat(fake)
