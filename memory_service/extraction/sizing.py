"""Split text so that system prompt + text + output cap always fit the server's context.

Token counts come from the server's own tokenizer (`/tokenize`); the split is
by characters at sentence or word boundaries, with overlap so a fact that
straddles a boundary is still seen whole in one chunk.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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


async def halves(chunk: Chunk, count_tokens: Callable[[str], Awaitable[int]]) -> list[Chunk]:
    """`chunk` in pieces of about half its tokens (starts relative to it); none when it is as small as a text
    splits (a reply that looped is asked again on a smaller piece)."""
    if chunk.tokens <= 2 * MIN_CHUNK_TOKENS:
        return []
    try:
        pieces = await plan_chunks(chunk.text, budget_tokens=chunk.tokens // 2, count_tokens=count_tokens)
    except ValueError:
        return []
    return pieces if len(pieces) > 1 else []


# --------------------------------------------------------------------------- sizing by time

# What a call is expected to write: the JSON wrapper and one short fact, plus facts that restate at
# most about half of the text. Used only to size chunks; the real cap is set per call.
OUTPUT_BASE_TOKENS = 24
OUTPUT_PER_TEXT_TOKEN = 0.5
# A call is sized to use at most this share of its budget: the measured speed is an average.
TIME_HEADROOM = 0.75
# Below this a text is not split further: a chunk this small that still can't fit is a visible failure.
MIN_CHUNK_TOKENS = 32


def expected_output_tokens(text_tokens: int, max_output: int) -> int:
    return min(max_output, int(OUTPUT_BASE_TOKENS + OUTPUT_PER_TEXT_TOKEN * text_tokens))


def call_seconds(text_tokens: int, uncached_tokens: int, prompt_tps: float, gen_tps: float, max_output: int) -> float:
    """Expected seconds for one call: read the uncached prompt, write the expected answer."""
    return (text_tokens + uncached_tokens) / prompt_tps + expected_output_tokens(text_tokens, max_output) / gen_tps


def time_fit_tokens(
    budget_s: float, uncached_tokens: int, prompt_tps: float | None, gen_tps: float | None, max_output: int
) -> int | None:
    """The most text tokens one call can take and still finish well within `budget_s`; None when unmeasured."""
    if not prompt_tps or not gen_tps:
        return None
    allowed = budget_s * TIME_HEADROOM
    low, high = 0, 1 << 20
    while low < high:  # call_seconds grows with the text: bisect
        mid = (low + high + 1) // 2
        if call_seconds(mid, uncached_tokens, prompt_tps, gen_tps, max_output) <= allowed:
            low = mid
        else:
            high = mid - 1
    return low


CHARS_PER_TOKEN = 3.5  # English text with a BPE tokenizer; only for estimates, never for sizing a prompt


def backlog_seconds(
    jobs: int, chars: int, prompt_tps: float | None, gen_tps: float | None, uncached_tokens: int, max_output: int
) -> float | None:
    """How long `jobs` saves holding `chars` characters take to extract, one after the other; None if unmeasured."""
    if not prompt_tps or not gen_tps or jobs <= 0:
        return None
    tokens = chars / CHARS_PER_TOKEN
    output = jobs * OUTPUT_BASE_TOKENS + OUTPUT_PER_TEXT_TOKEN * tokens
    return (tokens + jobs * uncached_tokens) / prompt_tps + min(output, jobs * max_output) / gen_tps
