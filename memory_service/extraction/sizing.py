"""Split text so that system prompt + text + output cap always fit the server's context.

Token counts come from the server's own tokenizer (`/tokenize`); the split is
by characters at sentence or word boundaries, with overlap so a fact that
straddles a boundary is still seen whole in one chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Awaitable, Callable

TEMPLATE_MARGIN_TOKENS = 64  # chat-template tokens around the messages
_BOUNDARY = re.compile(r"[.!?\n]\s+|\s+")


@dataclass(frozen=True)
class Chunk:
    text: str
    start: int  # character offset in the original text
    tokens: int = 0  # as the server's tokenizer counts them (0 until counted)


def text_budget(n_ctx: int, system_tokens: int, output_tokens: int) -> int:
    return n_ctx - system_tokens - output_tokens - TEMPLATE_MARGIN_TOKENS


def split_chars(text: str, size: int, overlap: int) -> list[Chunk]:
    """Windows of at most `size` characters, cut at the last sentence/word boundary, overlapping by ~`overlap`."""
    if len(text) <= size:
        return [Chunk(text, 0)]
    chunks: list[Chunk] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            window = text[start:end]
            cut = None
            for match in _BOUNDARY.finditer(window, max(1, len(window) // 2)):
                cut = match.end()
            if cut:
                end = start + cut
        chunks.append(Chunk(text[start:end], start))
        if end >= len(text):
            break
        next_start = max(start + 1, end - overlap)
        # begin the overlap at a word boundary
        space = text.find(" ", next_start, end)
        start = space + 1 if 0 <= space < end - 1 else next_start
    return chunks


async def plan_chunks(
    text: str,
    *,
    budget_tokens: int,
    count_tokens: Callable[[str], Awaitable[int]],
) -> list[Chunk]:
    """Chunks whose token counts (by the server) fit `budget_tokens`."""
    if budget_tokens < 32:
        raise ValueError(f"the context leaves only {budget_tokens} tokens for text; raise -c or lower the output cap")
    total = await count_tokens(text)
    if total <= budget_tokens:
        return [Chunk(text, 0, total)]
    chars_per_token = max(1.0, len(text) / max(total, 1))
    size = int(budget_tokens * chars_per_token * 0.9)
    for _ in range(6):
        chunks = split_chars(text, size, overlap=max(20, size // 10))
        counts = [await count_tokens(c.text) for c in chunks]
        if max(counts) <= budget_tokens:
            return [Chunk(c.text, c.start, n) for c, n in zip(chunks, counts)]
        size = int(size * 0.8)
    raise ValueError("could not split the text into chunks that fit the context")
