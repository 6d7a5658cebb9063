"""Does the server's chat template turn thinking off when asked?

The field report's worst failure was a thinking model spending 2,000-8,500 tokens per extraction
because its template thought by default. Rendering a probe through `/apply-template` with and
without `enable_thinking` proves what the model will actually be given; no generation needed,
so `/ready` can ask it too.
"""

from __future__ import annotations

import json
from typing import Any

from ..extraction.errors import ExtractionError
from .client import LlamaClient

OK, WARN, FAIL = "OK", "WARN", "FAIL"

THINKING_PROBE = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Reply with the word ready."},
]


async def check_thinking(client: LlamaClient) -> dict[str, Any]:
    """Does the server's chat template turn thinking off when asked? Template rendering only: cheap enough for /ready.

    Renders one probe with no kwarg, with `enable_thinking=true` and with `false`. A thinking template
    renders the off case differently (Qwen3: an empty think block); a template without thinking renders
    all three identically, which is fine; a template with thinking markup that renders identically
    ignores the kwarg, and the model will think on every extraction.
    """
    result: dict[str, Any] = {
        "verdict": WARN,
        "why": "",
        "fix": "",
        "thinking_off_verified": False,
        "template_has_thinking": None,
        "reacts_to_kwarg": None,
    }
    try:
        props = await client.props()
        default = await client.apply_template(THINKING_PROBE, enable_thinking=None)
        on = await client.apply_template(THINKING_PROBE, enable_thinking=True)
        off = await client.apply_template(THINKING_PROBE, enable_thinking=False)
    except ExtractionError as exc:
        result.update(
            why=f"could not render the chat template through /apply-template: {exc}",
            fix="use a llama-server build with /apply-template (b4000 or newer) started with --jinja",
        )
        return result
    has_markup = any("<think>" in text for text in (props.chat_template, default, on, off))
    reacts = off != default or off != on
    result.update(
        template_has_thinking=has_markup,
        reacts_to_kwarg=reacts,
        prompt_tail_default=_tail(default, off),
        prompt_tail_off=_tail(off, default),
    )
    if reacts and off.rstrip().lower().endswith("<think>"):
        result.update(
            verdict=FAIL,
            why="with enable_thinking=false the template still opens a think block",
            fix="start llama-server with a chat template that closes the think block when thinking is off "
            "(--chat-template-file, MEMORY_CHAT_TEMPLATE_FILE)",
        )
    elif reacts:
        base = default if off != default else on
        result.update(
            verdict=OK,
            thinking_off_verified=True,
            why=f"template honours enable_thinking=false: the prompt ends {json.dumps(off[-24:])} instead of "
            f"{json.dumps(base[-24:])}",
        )
    elif has_markup:
        result.update(
            verdict=FAIL,
            why="template ignores enable_thinking: it has <think> markup but renders the same prompt "
            "with enable_thinking=false, so the model will think on every extraction",
            fix="start llama-server with the model's official chat template (--chat-template-file, env "
            "MEMORY_CHAT_TEMPLATE_FILE) or use a non-thinking model (--model default)",
        )
    else:
        result.update(
            verdict=OK,
            thinking_off_verified=True,
            why="template has no thinking mode (no <think> markup; enable_thinking changes nothing, as expected)",
        )
    return result


def _tail(text: str, other: str) -> str:
    """What `text` has after the prefix it shares with `other`: where two renderings differ."""
    n = 0
    for a, b in zip(text, other):
        if a != b:
            break
        n += 1
    return text[n:][:200]
