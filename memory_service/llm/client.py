"""The llama-server client: the only place that speaks llama.cpp's HTTP API.

Every completion request carries the contract from the design: thinking off
(`chat_template_kwargs.enable_thinking = false`), temperature 0, an output cap,
`cache_prompt`, a JSON schema, and a total timeout equal to the job's remaining
budget. It is streamed: llama-server stops a streamed task at the next token once we
disconnect, while a plain request was measured running on to its token cap.
It returns `extraction/completion.py`'s shapes, so extraction itself speaks no HTTP.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from ..extraction.completion import Completion, ServerProps
from ..extraction.errors import BadReply, ContextOverflow, LlmTimeout, LlmUnavailable
from ..extraction.loops import LoopGuard

LOOP = "loop"  # the finish_reason of a reply this client cut because it repeated itself (see extraction/loops.py)


class LlamaClient:
    def __init__(
        self, base_url: str, *, connect_timeout_s: float = 5.0, sampling: dict[str, Any] | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # extra llama.cpp sampling fields on every completion (e.g. DRY: dry_multiplier...); none by default:
        # measured on fact quality in docs/extraction.md ("Repetition loops")
        self.sampling = dict(sampling or {})
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(30.0, connect=connect_timeout_s), trust_env=False
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(
                method,
                path,
                timeout=httpx.Timeout(timeout) if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                **kwargs,
            )
        except httpx.TimeoutException as exc:
            raise LlmTimeout(
                f"llama-server did not answer {path} within {timeout or 30:.1f}s (request cancelled)"
            ) from exc
        except httpx.HTTPError as exc:
            raise LlmUnavailable(f"llama-server at {self.base_url} unreachable on {path}: {exc!r}") from exc
        _raise_for_status(response, path)
        try:
            return response.json()
        except ValueError as exc:
            raise LlmUnavailable(
                f"llama-server sent a non-JSON body on {path}", raw_reply=response.text[:2000]
            ) from exc

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
        try:
            async with self._http.stream(
                # timings in every chunk: a reply cut short (a loop) still says what its prompt and tokens cost
                "POST",
                path,
                json={**body, "stream": True, "timings_per_token": True},
                timeout=httpx.Timeout(timeout),
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for_status(response, path)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators and ":" keep-alive pings
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    try:
                        chunk = json.loads(payload)
                    except ValueError as exc:
                        raise BadReply("llama-server sent a malformed stream chunk", raw_reply=payload[:2000]) from exc
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

    async def count_tokens(self, text: str, timeout: float = 10.0) -> int:
        data = await self._request("POST", "/tokenize", json={"content": text, "add_special": False}, timeout=timeout)
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


def _raise_for_status(response: httpx.Response, path: str) -> None:
    if response.status_code < 400:
        return
    message = _error_message(response)
    if response.status_code == 400 and "context" in message.lower():
        raise ContextOverflow(f"llama-server refused the prompt: {message}")
    if response.status_code >= 500 or response.status_code == 429:
        raise LlmUnavailable(f"llama-server answered {response.status_code} on {path}: {message}")
    raise BadReply(f"llama-server answered {response.status_code} on {path}: {message}")


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
        error = data.get("error")
        if isinstance(error, dict):
            return str(error.get("message") or error)
        return str(error or data)[:500]
    except ValueError:
        return response.text[:500]
