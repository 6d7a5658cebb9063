"""The llama-server client: the only place that speaks llama.cpp's HTTP API.

Every completion request carries the contract from the design: thinking off
(`chat_template_kwargs.enable_thinking = false`), temperature 0, an output cap,
`cache_prompt`, a JSON schema, and a total timeout equal to the job's remaining
budget. It is streamed: llama-server stops a streamed task at the next token once we
disconnect, while a plain request was measured running on to its token cap.
It returns `extraction/completion.py`'s shapes, so extraction itself speaks no HTTP.

Every call has a total deadline and a bounded read (issue 53): httpx's timeouts are per read, so a server
that trickles a byte every few seconds would outlive them for ever, and a reply read whole with no cap lets
a broken server fill memory. A call ends at its deadline (`LlmTimeout`) or at `max_reply_bytes`
(`LlmUnavailable`) and holds nothing but the work that asked for it.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any

import httpx

from ..config import Settings
from ..extraction.completion import Completion, ServerProps
from ..extraction.errors import BadReply, ContextOverflow, LlmTimeout, LlmUnavailable
from ..extraction.loops import LoopGuard

LOOP = "loop"  # the finish_reason of a reply this client cut because it repeated itself (see extraction/loops.py)
MAX_REPLY_BYTES = 8 << 20  # MEMORY_LLM_MAX_REPLY_BYTES' default: llama-server's answers are small JSON
TOKENIZE_TIMEOUT_S = 10.0  # a /tokenize outside a recall: its total deadline, at least (see `for_settings`)
STREAM_BYTES_PER_TOKEN = 2048  # a streamed token's event with its timings is ~500 bytes: room to spare


class LlamaClient:
    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 5.0,
        sampling: dict[str, Any] | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        tokenize_timeout_s: float = TOKENIZE_TIMEOUT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # extra llama.cpp sampling fields on every completion (e.g. DRY: dry_multiplier...); none by default:
        # measured on fact quality in docs/extraction.md ("Repetition loops")
        self.sampling = dict(sampling or {})
        self.max_reply_bytes = max_reply_bytes
        self.tokenize_timeout_s = tokenize_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(30.0, connect=connect_timeout_s),
            trust_env=False,
            headers={"Accept-Encoding": "identity"},  # what is counted against the cap is what is held
        )

    @classmethod
    def for_settings(cls, base_url: str, settings: Settings) -> LlamaClient:
        """The service's client of one llama-server. Why these bounds: a reply may hold the token ids of the
        largest text (at most ~8 bytes a token, a token at least a byte), and a /tokenize during extraction
        gets the extraction's own window (MEMORY_EXTRACT_BUDGET_S) when that is longer than 10 s, so a slow
        machine that was never cut off before is not cut off now."""
        return cls(
            base_url,
            max_reply_bytes=max(settings.llm_max_reply_bytes, 8 * settings.max_text_bytes + (64 << 10)),
            tokenize_timeout_s=max(TOKENIZE_TIMEOUT_S, settings.extract_budget_s),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def _timeouts(self, timeout: float) -> httpx.Timeout:
        return httpx.Timeout(timeout, connect=min(timeout, self._connect_timeout_s))

    async def _request(self, method: str, path: str, *, timeout: float, **kwargs: Any) -> Any:
        """One plain call, its JSON answer. `timeout` is the call's total deadline (connect, headers and body),
        not httpx's per read; the body is read up to `max_reply_bytes` and no further."""
        try:
            async with asyncio.timeout(timeout):
                async with self._http.stream(method, path, timeout=self._timeouts(timeout), **kwargs) as response:
                    body = await self._read_capped(response, path, self.max_reply_bytes)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise LlmTimeout(
                f"llama-server at {self.base_url} did not answer {path} within {timeout:.1f}s (request cancelled)"
            ) from exc
        except httpx.HTTPError as exc:
            raise LlmUnavailable(f"llama-server at {self.base_url} unreachable on {path}: {exc!r}") from exc
        _raise_for_status(response.status_code, body, path)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise LlmUnavailable(
                f"llama-server sent a non-JSON body on {path}", raw_reply=body[:2000].decode("utf-8", "replace")
            ) from exc

    async def _read_capped(self, response: httpx.Response, path: str, cap: int) -> bytes:
        """The whole body, refused as soon as it passes `cap` bytes (a declared length over it: before reading)."""
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise self._too_large(path, cap, f"announced {int(declared)} bytes")
        body = bytearray()
        async for piece in response.aiter_bytes():
            body += piece
            if len(body) > cap:
                raise self._too_large(path, cap, "kept sending")
        return bytes(body)

    def _too_large(self, path: str, cap: int, what: str) -> LlmUnavailable:
        return LlmUnavailable(
            f"llama-server at {self.base_url} {what} on {path}, over the {cap}-byte cap on a reply: its answers "
            "are small JSON, so this is not a working llama-server (check MEMORY_LLM_URL), or raise "
            "MEMORY_LLM_MAX_REPLY_BYTES"
        )

    async def _streamed_chat(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """A chat completion read as server-sent events, assembled into the shape of a non-streamed reply.

        Why stream: llama-server writes every token to the socket, so once we close it the task stops at
        the next token. A cancelled plain request was measured running on to its token cap (the tiny
        model's slot busy 10 s more for 600 tokens), holding the slot that the next job or a save needs.
        The same disconnect stops a reply that has fallen into a repetition loop (`LoopGuard`) at once:
        it ends with finish_reason "loop" and what was read, instead of repeating up to its cap.
        """
        path = "/v1/chat/completions"
        content: list[str] = []
        reasoning: list[str] = []
        finish_reason = ""
        timings: dict[str, Any] = {}
        guard, pieces = LoopGuard(), 0
        # an honest stream sends one event per token, so its size follows the output cap
        cap = max(self.max_reply_bytes, int(body.get("max_tokens") or 0) * STREAM_BYTES_PER_TOKEN)
        try:
            async with self._http.stream(
                # timings in every chunk: a reply cut short (a loop) still says what its prompt and tokens cost
                "POST",
                path,
                json={**body, "stream": True, "timings_per_token": True},
                timeout=self._timeouts(timeout),
            ) as response:
                if response.status_code >= 400:
                    _raise_for_status(response.status_code, await self._read_capped(response, path, cap), path)
                async with aclosing(self._capped_lines(response, path, cap)) as lines:
                    async for line in lines:
                        if not line.startswith("data:"):
                            continue  # blank separators and ":" keep-alive pings
                        payload = line[5:].strip()
                        if payload == "[DONE]":
                            break
                        try:
                            chunk = json.loads(payload)
                        except ValueError as exc:
                            raise BadReply(
                                "llama-server sent a malformed stream chunk", raw_reply=payload[:2000]
                            ) from exc
                        if not isinstance(chunk, dict):
                            raise BadReply(
                                "llama-server sent a stream chunk that is not an object", raw_reply=payload[:2000]
                            )
                        if "error" in chunk:
                            raise LlmUnavailable(f"llama-server failed during the reply: {chunk['error']}")
                        for choice in chunk.get("choices") or []:
                            delta = choice.get("delta") or {}
                            content.append(delta.get("content") or "")
                            reasoning.append(delta.get("reasoning_content") or "")
                            finish_reason = choice.get("finish_reason") or finish_reason
                            pieces += 1 if delta.get("content") or delta.get("reasoning_content") else 0
                            guard.feed(delta.get("content") or "")
                        timings = chunk.get("timings") or timings
                        if guard.loop is not None:  # leaving closes the stream: llama-server stops at the next token
                            finish_reason = LOOP
                            break
        except httpx.TimeoutException as exc:
            raise LlmTimeout(f"llama-server did not answer {path} within {timeout:.1f}s (request cancelled)") from exc
        except httpx.HTTPError as exc:
            raise LlmUnavailable(f"llama-server at {self.base_url} broke off the reply on {path}: {exc!r}") from exc
        if not finish_reason:
            raise LlmUnavailable(
                f"llama-server at {self.base_url} ended the reply on {path} before it finished",
                raw_reply="".join(content)[:2000],
            )
        reply: dict[str, Any] = {
            "choices": [
                {
                    "finish_reason": finish_reason,
                    "message": {"content": "".join(content), "reasoning_content": "".join(reasoning)},
                }
            ],
            "timings": timings,
        }
        if guard.loop is not None:  # no final chunk: the last chunk's timings, else the tokens read (one per event)
            reply["timings"] = {"predicted_n": pieces, **timings, "loops": 1}
            reply["loop"] = {"period": guard.loop.period, "chars": guard.loop.chars, "span": guard.loop.span[:120]}
        return reply

    async def _capped_lines(self, response: httpx.Response, path: str, cap: int) -> Any:
        """The stream's lines, while all it sent stays within `cap` bytes: httpx's own line reader keeps a
        line without end whole, so an endless one (or endless events) would grow without bound."""
        sent, pending = 0, b""
        async for piece in response.aiter_bytes():
            sent += len(piece)
            if sent > cap:
                raise self._too_large(path, cap, "kept streaming")
            lines = (pending + piece).split(b"\n")
            pending = lines.pop()
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8", "replace")

    async def health(self, timeout: float = 2.0) -> bool:
        try:
            await self._request("GET", "/health", timeout=timeout)
            return True
        except Exception:
            return False

    async def props(self) -> ServerProps:
        data = await self._request("GET", "/props", timeout=10)
        settings = data.get("default_generation_settings") or {}
        n_ctx = settings.get("n_ctx") or data.get("n_ctx") or 0
        return ServerProps(
            n_ctx=int(n_ctx),
            slots=int(data.get("total_slots") or 1),
            chat_template=data.get("chat_template") or "",
            build_info=str(data.get("build_info") or ""),
            model_path=str(data.get("model_path") or ""),
            raw=data,
        )

    async def count_tokens(self, text: str, timeout: float | None = None) -> int:
        """`text`'s tokens by the server's tokenizer, within `timeout` (default: `tokenize_timeout_s`)."""
        body = {"content": text, "add_special": False}
        data = await self._request("POST", "/tokenize", json=body, timeout=timeout or self.tokenize_timeout_s)
        return len(data.get("tokens") or [])

    async def token_pieces(self, text: str, timeout: float) -> list[Any]:
        """`text`'s tokens with their pieces (a string, or a byte list for part of a character): recall's budget."""
        body = {"content": text, "add_special": False, "with_pieces": True}
        data = await self._request("POST", "/tokenize", json=body, timeout=timeout)
        return [t.get("piece") if isinstance(t, dict) else None for t in data.get("tokens") or []]

    async def apply_template(self, messages: list[dict[str, str]], *, enable_thinking: bool | None) -> str:
        body: dict[str, Any] = {"messages": messages}
        if enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
        data = await self._request("POST", "/apply-template", json=body, timeout=10)
        return data.get("prompt") or ""

    async def complete_json(
        self,
        messages: list[dict[str, str]],
        *,
        schema: dict[str, Any],
        max_tokens: int,
        timeout_s: float,
        stream: bool = True,
        sampling: dict[str, Any] | None = None,
    ) -> Completion:
        """One completion under the contract above, streamed by default: read token by token, so that
        cancelling the call (its deadline, a save that consolidation gives way to, a stop) frees
        llama-server's slot at once (see `_streamed_chat`). `stream=False`: one plain request.
        `sampling`: llama.cpp sampling fields for this call only (e.g. DRY on a piece that looped)."""
        body = {
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_tokens,
            "cache_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "facts", "strict": True, "schema": schema},
            },
            **self.sampling,
            **(sampling or {}),
        }
        timeout_s = max(timeout_s, 0.05)
        # httpx timeouts are per read; a server that trickles bytes could outlive them. The job's
        # deadline is a total: cancelling closes the connection, which cancels the llama-server task.
        try:
            async with asyncio.timeout(timeout_s):
                if stream:
                    data = await self._streamed_chat(body, timeout_s)
                else:
                    data = await self._request("POST", "/v1/chat/completions", json=body, timeout=timeout_s)
        except TimeoutError as exc:
            raise LlmTimeout(f"llama-server did not answer within the job's remaining {timeout_s:.1f}s") from exc
        try:
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError) as exc:
            raise BadReply("llama-server reply has no choices", raw_reply=json.dumps(data)[:4000]) from exc
        # reasoning_content is never used as output: only its size is kept, for diagnosis
        reasoning = message.get("reasoning_content") or ""
        return Completion(
            content=message.get("content") or "",
            finish_reason=choice.get("finish_reason") or "",
            timings=dict(data.get("timings") or {}),
            reasoning_chars=len(reasoning),
            raw=data,
            reasoning=reasoning,
            loop=data.get("loop"),
        )


def _raise_for_status(status: int, body: bytes, path: str) -> None:
    if status < 400:
        return
    message = _error_message(body)
    if status == 400 and "context" in message.lower():
        raise ContextOverflow(f"llama-server refused the prompt: {message}")
    if status >= 500 or status == 429:
        raise LlmUnavailable(f"llama-server answered {status} on {path}: {message}")
    raise BadReply(f"llama-server answered {status} on {path}: {message}")


def _error_message(body: bytes) -> str:
    try:
        data = json.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            return str(error.get("message") or error)
        return str(error or data)[:500]
    except ValueError:
        return body[:500].decode("utf-8", "replace")
