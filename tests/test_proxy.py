"""`memory-service proxy`: the real `openai` client → the proxy → an upstream speaking llama-server's OpenAI API.

The upstream is the fake llama-server (real HTTP; it records every body it received, so a test reads the very
prompt the model got), the memory service is the real one in this process (app, workers, stores, embedder)
with a second fake as its extraction model. One test runs in front of a real llama-server with the tiny model.

What each test holds the proxy to (docs/proxy.md): a fact told in one session reaches the next session's first
prompt; a session's brief is fixed at one place and never recomputed; each user message and final answer is
saved once, whatever history is re-sent; stream and non-stream pass through; a memory service that is down or
slow never blocks the model call; the upstream's errors pass through with their status and body.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from conftest import ROOT, eventually
from inprocess import InProcessService, LoopbackServer

from memory_service.cli.main import main as cli_main
from memory_service.llm.runtime.server import free_port
from memory_service.proxy.app import ProxyConfig, create_app
from tests.fakes.fake_llama_server import FakeLlamaServer

KEY = "key-a"
RECALL_LIMIT_S = 0.3
SYSTEM = "You are the ops agent of a small team. Answer in one sentence."


@pytest.fixture(scope="module")
def extractor() -> Iterator[FakeLlamaServer]:
    """The memory service's own model (extraction), apart from the upstream the agent talks to."""
    with FakeLlamaServer("ok", tokens_per_s=50_000) as fake:
        yield fake


@pytest.fixture(scope="module")
def service(extractor: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    svc = InProcessService(tmp_path_factory.mktemp("proxy") / "data", extractor.url).start()
    yield svc
    svc.stop()


@pytest.fixture
def upstream() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=50_000) as fake:
        fake.set_mode("ok", content="Noted.")
        yield fake


Proxy = Callable[..., str]


@pytest.fixture
def proxy(upstream: FakeLlamaServer, service: InProcessService) -> Iterator[Proxy]:
    """Start proxies (in this process, on loopback, with their lifespan: the save queue) and stop them after."""
    started: list[LoopbackServer] = []

    def make(memory_url: str | None = None, **options: Any) -> str:
        config = ProxyConfig(
            upstream=options.pop("upstream", upstream.url),
            memory_url=memory_url or service.url,
            api_key=KEY,
            recall_timeout_s=options.pop("recall_timeout_s", RECALL_LIMIT_S),
            **options,
        )
        server = LoopbackServer(create_app(config)).start()
        started.append(server)
        return server.url

    yield make
    for server in started:
        server.stop()


def client(url: str, agent: str | None, session: str | None) -> openai.OpenAI:
    headers = {}
    if agent:
        headers["X-Memory-Agent"] = agent
    if session:
        headers["X-Memory-Session"] = session
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", default_headers=headers, max_retries=0, timeout=30)


def ask(chat: openai.OpenAI, messages: list[dict[str, Any]], **extra: Any) -> str:
    """One turn; the answer is appended to `messages`, as an agent keeps its history."""
    reply = chat.chat.completions.create(model="any", messages=messages, **extra)  # type: ignore[arg-type]
    text = reply.choices[0].message.content or ""
    messages.append({"role": "assistant", "content": text})
    return text


def texts_of(svc: InProcessService, agent: str) -> list[str]:
    with svc.client(KEY) as memory:
        return [m["text"] for m in memory.get("/v1/memories", params={"agent_id": agent, "limit": 500}).json()["items"]]


def recalls(svc: InProcessService) -> float:
    """How many recalls the memory service has answered: its own metric."""
    assert svc.services is not None
    for metric in svc.services.metrics.recall.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                return sample.value
    raise AssertionError("no recall count")


def tell_session_1(url: str, service: InProcessService, agent: str) -> None:
    chat = client(url, agent, f"{agent}-s1")
    history = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Remember this: the deploy key for staging lives in vault path ops/deploy-7."},
    ]
    ask(chat, history)
    eventually("session 1's user message saved", lambda: any("ops/deploy-7" in t for t in texts_of(service, agent)))


def test_a_fact_told_in_session_1_reaches_the_model_in_session_2s_first_request(
    proxy: Proxy, upstream: FakeLlamaServer, service: InProcessService
) -> None:
    url = proxy()
    tell_session_1(url, service, "ops-1")
    upstream.clear_requests()
    chat = client(url, "ops-1", "ops-1-s2")
    ask(chat, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is the staging deploy key?"}])
    [received] = upstream.recorded()
    system = received["messages"][0]
    assert system["role"] == "system" and system["content"].startswith(SYSTEM)
    assert "vault path ops/deploy-7" in system["content"]
    assert len(received["messages"]) == 2  # the brief went into the client's system message, not a new one


def test_later_turns_carry_the_same_brief_at_the_same_place_and_recall_once(
    proxy: Proxy, upstream: FakeLlamaServer, service: InProcessService
) -> None:
    url = proxy()
    tell_session_1(url, service, "ops-2")
    upstream.clear_requests()
    before = recalls(service)
    chat = client(url, "ops-2", "ops-2-s2")
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is the staging deploy key?"}]
    ask(chat, history)
    for question in ("And who rotates it?", "Thanks. Anything else about staging?"):
        history.append({"role": "user", "content": question})
        ask(chat, history)
    received = upstream.recorded()
    assert len(received) == 3
    briefed = [r["messages"][0]["content"] for r in received]
    assert "ops/deploy-7" in briefed[0] and briefed[0] == briefed[1] == briefed[2]  # byte for byte
    for sent in received:  # the rest is the client's history, as it sent it
        assert [m["content"] for m in sent["messages"][1:]] == [
            m["content"] for m in history[1 : len(sent["messages"])]
        ]
    # the session's first request recalled; its later turns did not (nothing else recalls meanwhile)
    assert recalls(service) - before == 1


def test_each_user_message_and_final_answer_is_saved_once(
    proxy: Proxy, upstream: FakeLlamaServer, service: InProcessService
) -> None:
    url = proxy()
    chat = client(url, "saver-1", "saver-1-s1")
    restarted = client(proxy(), "saver-1", "saver-1-s1")  # a proxy that never saw the session: keys alone dedupe
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    answers = ["Answer one: the backup runs at 02:00.", "Answer two: it keeps 14 days.", "Answer three: yes."]
    for n, (question, answer) in enumerate(
        zip(["When does the backup run?", "How long is it kept?", "Is it encrypted?"], answers, strict=True)
    ):
        upstream.set_mode("ok", content=answer)
        history.append({"role": "user", "content": question})
        if n == 1:  # a streamed turn saves its answer too
            stream = chat.chat.completions.create(model="any", messages=history, stream=True)  # type: ignore[arg-type]
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            history.append({"role": "assistant", "content": text})
        else:
            ask(chat if n == 0 else restarted, history)
    expected = sorted(
        [f"User: {q}" for q in ("When does the backup run?", "How long is it kept?", "Is it encrypted?")]
        + [f"Assistant: {a}" for a in answers]
    )
    eventually("six saves", lambda: len(texts_of(service, "saver-1")) >= 6)
    time.sleep(0.5)  # a save sent twice would show up by now
    assert sorted(texts_of(service, "saver-1")) == expected
    assert not any(SYSTEM in t for t in texts_of(service, "saver-1"))  # the system prompt is not a message to keep


def test_tool_calls_pass_through_and_are_not_saved(
    proxy: Proxy, upstream: FakeLlamaServer, service: InProcessService
) -> None:
    url = proxy()
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_ticket",
                "description": "Look a ticket up.",
                "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
            },
        }
    ]
    upstream.set_mode(
        "script",
        script=[{"when": "TK-9", "step": 0, "tool_calls": [{"name": "lookup_ticket", "arguments": {"id": "TK-9"}}]}],
    )
    chat = client(url, "tooler", "tooler-s1")
    history: list[dict[str, Any]] = [{"role": "user", "content": "What is the state of TK-9?"}]
    reply = chat.chat.completions.create(model="any", messages=history, tools=tools)  # type: ignore[arg-type]
    call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "lookup_ticket" and json.loads(call.function.arguments) == {"id": "TK-9"}
    history.append(reply.choices[0].message.model_dump(exclude_none=True))
    history.append({"role": "tool", "tool_call_id": call.id, "content": "TK-9 is closed since Monday."})
    assert ask(chat, history, tools=tools) == "Done."
    assert upstream.recorded()[1]["tools"] == tools  # the schemas went on untouched
    eventually("two saves", lambda: len(texts_of(service, "tooler")) >= 2)
    time.sleep(0.3)
    assert sorted(texts_of(service, "tooler")) == ["Assistant: Done.", "User: What is the state of TK-9?"]


def test_stream_and_non_stream_pass_content_finish_and_usage_through(proxy: Proxy, upstream: FakeLlamaServer) -> None:
    url = proxy(memory_url=f"http://127.0.0.1:{free_port()}")  # no memory: the pass-through alone
    upstream.set_mode("ok", content="The quick brown fox jumps over the lazy dog.")
    messages = [{"role": "user", "content": "Say the pangram."}]
    via, direct = client(url, "streamer", "st-1"), openai.OpenAI(base_url=f"{upstream.url}/v1", api_key="unused")
    got, want = (c.chat.completions.create(model="any", messages=messages) for c in (via, direct))  # type: ignore[arg-type]
    assert (
        got.choices[0].message.content
        == want.choices[0].message.content
        == "The quick brown fox jumps over the lazy dog."
    )
    assert got.choices[0].finish_reason == "stop" and got.usage == want.usage and got.usage is not None
    chunks = list(via.chat.completions.create(model="any", messages=messages, stream=True))  # type: ignore[arg-type]
    assert len(chunks) > 5  # streamed as it came, not gathered
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == want.usage.completion_tokens  # type: ignore[union-attr]
    models = via.models.list()
    assert [m.id for m in models.data] == [m.id for m in direct.models.list().data]


class SleepyService(http.server.ThreadingHTTPServer):
    """A memory service that answers nothing in time: every request sleeps, then gets a 503."""

    daemon_threads = True

    def __init__(self, sleep_s: float) -> None:
        sleep = sleep_s

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(sleep)
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST  # noqa: N815

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.mark.parametrize("memory", ["stopped", "slow"])
def test_a_memory_service_down_or_slow_never_blocks_the_model_call(
    memory: str, proxy: Proxy, upstream: FakeLlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    sleepy = SleepyService(5.0) if memory == "slow" else None
    url = proxy(memory_url=sleepy.url if sleepy else f"http://127.0.0.1:{free_port()}")
    chat = client(url, "lonely", f"lonely-{memory}")
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Is the build green?"}]
    with caplog.at_level("INFO", logger="memory_service.proxy"):
        for _ in range(2):  # a second turn (history re-sent, a brief tried again) is not slowed either
            began = time.monotonic()
            ask(chat, history)
            assert time.monotonic() - began < RECALL_LIMIT_S + 0.7  # the upstream answers in a few ms
            history.append({"role": "user", "content": "And the deploy?"})
    received = upstream.recorded()
    assert received[0]["messages"] == history[:2]  # no brief: sent as the client sent it
    assert "without a brief" in caplog.text
    if sleepy:
        sleepy.shutdown()


@pytest.mark.parametrize("mode,status", [("http_500", 500), ("http_503", 503), ("tiny_context", 400)])
def test_upstream_errors_pass_through_with_status_and_body(
    mode: str, status: int, proxy: Proxy, upstream: FakeLlamaServer
) -> None:
    url = proxy(memory_url=f"http://127.0.0.1:{free_port()}")
    if mode == "tiny_context":
        upstream.set_mode("ok", n_ctx=8)
    else:
        upstream.set_mode(mode)
    body = {"model": "any", "messages": [{"role": "user", "content": "Hello there, how are you today?"}]}
    direct = httpx.post(f"{upstream.url}/v1/chat/completions", json=body)
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as raised:
            client(url, "errs", "errs-1").chat.completions.create(stream=stream, **body)  # type: ignore[call-overload]
        assert raised.value.status_code == status == direct.status_code
        assert raised.value.response.json() == direct.json()


@pytest.mark.parametrize("how", ["stopped", "broke off"])
def test_an_upstream_that_cannot_be_reached_is_a_502_naming_it(
    how: str, proxy: Proxy, upstream: FakeLlamaServer
) -> None:
    if how == "stopped":
        gone = f"http://127.0.0.1:{free_port()}"
    else:  # the head of an answer, half its body, then the connection closed
        gone = upstream.url
        upstream.set_mode("drop", drop_style="partial")
    url = proxy(memory_url=f"http://127.0.0.1:{free_port()}", upstream=gone)
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as raised:
            client(url, "lost", "lost-1").chat.completions.create(
                model="any", messages=[{"role": "user", "content": "hi"}], stream=stream
            )
        assert raised.value.status_code == 502
        assert gone in raised.value.response.json()["error"]["message"]


def test_requests_out_of_bounds_are_refused_in_words(proxy: Proxy, upstream: FakeLlamaServer) -> None:
    url = proxy(memory_url=f"http://127.0.0.1:{free_port()}")
    post = lambda **kw: httpx.post(f"{url}/v1/chat/completions", **kw)  # noqa: E731
    too_many = {"messages": [{"role": "user", "content": "x"}] * 5000}
    for response, words in (
        (post(content=b"{not json"), "not JSON"),
        (post(json={"model": "m"}), "messages"),
        (post(json=too_many), "at most"),
        (post(content=b"x" * (9 << 20), headers={"content-type": "application/json"}), "too large"),
        (
            post(json={"messages": [{"role": "user", "content": "hi"}]}, headers={"X-Memory-Agent": "no spaces"}),
            "X-Memory-Agent",
        ),
        (httpx.post(f"{url}/v1/chat/completions", json={}, headers={"Host": "evil.example"}), "Host"),
    ):
        assert 400 <= response.status_code < 500, response.text
        assert words in response.json()["error"]["message"], response.text
    assert upstream.recorded() == []


def test_the_command_refuses_to_listen_beyond_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["proxy", "--upstream", "http://127.0.0.1:9", "--host", "0.0.0.0"])
    err = capsys.readouterr().err
    assert code == 2 and "loopback" in err and "Traceback" not in err


@pytest.mark.process  # the snippet runs in a fresh interpreter, as a user runs it
def test_the_doc_snippet_runs_as_written(proxy: Proxy, service: InProcessService, tmp_path: Any) -> None:
    [snippet] = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "proxy.md").read_text(), flags=re.S)
    code = snippet.replace("http://127.0.0.1:8702", proxy())
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    ran = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == ["Noted.", "Noted."]
    said = ["User: Where does the staging deploy key live?", "User: Thanks. Who rotates it?"]
    eventually("the snippet's messages saved", lambda: set(said) <= set(texts_of(service, "ops")))


@pytest.mark.model
def test_in_front_of_a_real_llama_server_the_brief_holds_the_prefix(
    proxy: Proxy, service: InProcessService, tiny_llama: Any
) -> None:
    """tiny (SmolLM2-135M) behind the proxy: the brief reaches the prompt (more prompt tokens than the client's
    messages alone), and the session's second turn re-uses the cached prefix, brief included."""
    url = proxy(upstream=tiny_llama.url)
    tell_session_1(url, service, "ops-real")
    opening = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is the staging deploy key?"}]
    direct = openai.OpenAI(base_url=f"{tiny_llama.url}/v1", api_key="unused")
    bare = direct.chat.completions.create(model="tiny", messages=opening, max_tokens=8)  # type: ignore[arg-type]
    chat = client(url, "ops-real", "ops-real-s2")
    history = list(opening)
    first = chat.chat.completions.create(model="tiny", messages=history, max_tokens=8)  # type: ignore[arg-type]
    assert first.usage and bare.usage and first.usage.prompt_tokens > bare.usage.prompt_tokens + 5
    history += [{"role": "assistant", "content": first.choices[0].message.content or ""}]
    history += [{"role": "user", "content": "Thanks."}]
    stream = chat.chat.completions.create(model="tiny", messages=history, max_tokens=8, stream=True)  # type: ignore[arg-type]
    chunks = list(stream)
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    second = chat.chat.completions.create(model="tiny", messages=history, max_tokens=8)  # type: ignore[arg-type]
    cached = (second.model_extra or {}).get("timings", {}).get("cache_n", 0)
    assert cached >= first.usage.prompt_tokens - 2, second.model_extra  # the brief's prefix came from the cache
