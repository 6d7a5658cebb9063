"""Streamed completions: the same reply as a plain request, and a cancel that really frees llama-server.

Extraction and consolidation stream their model calls so that a deadline or a save frees the slot at
once: llama-server stops a streamed task at the next token once the client is gone. A cancelled plain
request was found to run on to its token cap on the real server (10 s for 600 tokens of the tiny
model), which is why this matters.
Real llama-server with the tiny model, plus the fake for the failures a real server won't produce.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from memory_service.extraction.errors import LlmUnavailable
from memory_service.llm.client import LlamaClient
from tests.fakes.fake_llama_server import FakeLlamaServer

MESSAGES = [
    {"role": "system", "content": "Answer in JSON."},
    {"role": "user", "content": "Name one fact about the sea."},
]
SHORT = {"type": "object", "properties": {"fact": {"type": "string", "maxLength": 60}}, "required": ["fact"]}
# a reply the grammar forces to be long: forty sentences of at least 30 characters each
LONG = {
    "type": "object",
    "properties": {"points": {"type": "array", "minItems": 40, "items": {"type": "string", "minLength": 30}}},
    "required": ["points"],
}
LONG_CAP = 600


def slot(url: str) -> dict[str, Any]:
    return httpx.get(url + "/slots", timeout=5, trust_env=False).json()[0]


def decoded(state: dict[str, Any]) -> int:
    tokens = state.get("next_token") or [{}]
    return int((tokens[0] if isinstance(tokens, list) else tokens).get("n_decoded") or 0)


async def until(check, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_a_streamed_reply_equals_the_plain_one(tiny_llama) -> None:
    async def both() -> tuple[Any, Any]:
        client = LlamaClient(tiny_llama.url)
        try:
            plain = await client.complete_json(MESSAGES, schema=SHORT, max_tokens=48, timeout_s=120, stream=False)
            streamed = await client.complete_json(MESSAGES, schema=SHORT, max_tokens=48, timeout_s=120)
            return plain, streamed
        finally:
            await client.aclose()

    plain, streamed = asyncio.run(both())
    assert streamed.content == plain.content and streamed.content.strip().startswith("{")
    assert streamed.finish_reason == plain.finish_reason
    assert streamed.timings["predicted_n"] == plain.timings["predicted_n"] > 0
    assert streamed.timings["prompt_n"] + streamed.timings["cache_n"] > 0


def test_cancelling_a_streamed_call_stops_the_server_task_long_before_its_cap(tiny_llama) -> None:
    """Watched through the server's /slots: once cancelled, the task generates a few tokens more at most
    (a plain request, cancelled the same way, ran on to its 600-token cap)."""

    async def cancel_mid_reply() -> tuple[int, int]:
        client = LlamaClient(tiny_llama.url)
        try:
            call = asyncio.create_task(client.complete_json(MESSAGES, schema=LONG, max_tokens=LONG_CAP, timeout_s=300))
            await until(
                lambda: slot(tiny_llama.url).get("is_processing") and decoded(slot(tiny_llama.url)) >= 10,
                "the call to be generating",
            )
            call.cancel()
            at_cancel = peak = decoded(slot(tiny_llama.url))
            deadline = time.monotonic() + 300
            while (state := await asyncio.to_thread(slot, tiny_llama.url)).get("is_processing"):
                peak = max(peak, decoded(state))
                assert time.monotonic() < deadline, "the slot was never released"
                await asyncio.sleep(0.01)
            with pytest.raises(asyncio.CancelledError):
                await call
            return at_cancel, peak
        finally:
            await client.aclose()

    at_cancel, peak = asyncio.run(cancel_mid_reply())
    assert 10 <= at_cancel <= peak < LONG_CAP // 4, (at_cancel, peak)


def test_a_streamed_call_maps_server_failures_like_a_plain_one() -> None:
    async def call(fake: FakeLlamaServer) -> None:
        client = LlamaClient(fake.url)
        try:
            await client.complete_json(MESSAGES, schema=SHORT, max_tokens=48, timeout_s=10)
        finally:
            await client.aclose()

    with FakeLlamaServer(tokens_per_s=5000) as fake:
        fake.set_mode("ok")
        asyncio.run(call(fake))  # the fake's stream assembles into a reply
        for mode in ("http_500", "http_503", "drop"):
            fake.set_mode(mode)
            with pytest.raises(LlmUnavailable):
                asyncio.run(call(fake))
