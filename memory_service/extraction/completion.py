"""What an extraction needs of a model server, as plain data and one protocol.

Why here: extraction stays pure (no HTTP, no llama.cpp API); `llm/client.py`'s `LlamaClient` is the real
`CompletionClient` and returns these shapes, and a test can hand the extractor anything that does the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class ServerProps:
    n_ctx: int
    slots: int
    chat_template: str
    build_info: str
    model_path: str
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass
class Completion:
    content: str
    finish_reason: str
    timings: dict[str, Any]
    reasoning_chars: int
    raw: dict[str, Any]
    reasoning: str = ""  # never used as output; kept to explain a reply that put its answer there
    loop: dict[str, Any] | None = None  # finish_reason "loop": the span repeated, and the tokens read


class CompletionClient(Protocol):
    """What an extraction needs of a model server: its token count and one schema-bound completion.

    `LlamaClient` is the real one; the attempt itself knows nothing of HTTP or llama.cpp's API.
    """

    async def count_tokens(self, text: str, timeout: float = ...) -> int: ...

    async def complete_json(
        self,
        messages: list[dict[str, str]],
        *,
        schema: dict[str, Any],
        max_tokens: int,
        timeout_s: float,
        stream: bool = ...,
        sampling: dict[str, Any] | None = ...,
    ) -> Completion: ...
