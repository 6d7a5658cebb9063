"""Which tools a server lists (the `core` profile by default, `full` on request) and what the list costs.

A small model pays for every token of the tool list in every prompt, and a 4B model with 16k of context
runs out when the schemas are large; so by default the server lists one tool per job, the one that does
the job and answers the question in the same call: `recall`, `remember`, `consume_limit` (it says what is
left) and `mark_handled` (it says whether the item was handled before). `full` adds the tools that only
look (`check_limit`, `was_handled`, `get_memory`) and `forget`. A key that may not write gets the looking
tool of each job instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal, get_args

Profile = Literal["core", "full"]
PROFILES: tuple[Profile, ...] = get_args(Profile)
DEFAULT_PROFILE: Profile = "core"

# The jobs, each with its tools in order of preference: `core` lists the first one the key's role allows.
CORE_JOBS: tuple[tuple[str, ...], ...] = (
    ("remember",),
    ("recall",),
    ("consume_limit", "check_limit"),
    ("mark_handled", "was_handled"),
)

# Optional arguments `core` does not show (still accepted): a small model fills every optional argument it sees
# with a guess (an agent id, a tag, a token budget), and a guessed filter empties the answer. Core shows only
# what the job needs: recall a query, remember a text, one unit of a limit per call.
CORE_HIDDEN_ARGUMENTS: dict[str, frozenset[str]] = {
    "recall": frozenset({"agent_id", "tags", "max_tokens"}),
    "remember": frozenset({"tags"}),
    "consume_limit": frozenset({"amount"}),
}

# Bytes per token of the default model's tokenizer (Qwen2.5) on this JSON tool list, below the measured 3.40
# (core) and 3.29 (full) (tests/test_mcp_profiles.py checks it with the model's /tokenize): dividing by it
# over-counts, so a fast test without the model still catches a list grown past its budget.
BYTES_PER_TOKEN_FLOOR = 3.2
CORE_TOKEN_BUDGET = 500


def select(allowed: Iterable[str], profile: Profile) -> tuple[str, ...]:
    """The tools to list, in `allowed`'s order: all of them (`full`) or the first allowed one per job."""
    allowed = tuple(allowed)
    if profile == "full":
        return allowed
    chosen = {next(name for name in job if name in allowed) for job in CORE_JOBS if set(job) & set(allowed)}
    return tuple(name for name in allowed if name in chosen)


def shown_schema(tool: str, schema: dict[str, Any], profile: Profile) -> dict[str, Any]:
    """The argument schema as the profile lists it: `core` leaves out `CORE_HIDDEN_ARGUMENTS`."""
    hidden = CORE_HIDDEN_ARGUMENTS.get(tool, frozenset()) if profile == "core" else frozenset()
    if not hidden:
        return schema
    properties = {k: v for k, v in schema.get("properties", {}).items() if k not in hidden}
    return {**schema, "properties": properties}


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """MCP tools as an agent hands them to an OpenAI-style chat model (`tools` of /v1/chat/completions):
    name, description and argument schema, which is what the model reads and what the budget counts."""
    return [
        {
            "type": "function",
            "function": {"name": tool.name, "description": tool.description or "", "parameters": tool.input_schema},
        }
        for tool in tools
    ]


def tool_list_text(tools: Sequence[Any]) -> str:
    """The tool list serialized as chat templates do (`tojson`: JSON with `, ` and `: ` separators)."""
    return json.dumps(openai_tools(tools), ensure_ascii=False)


def estimate_tokens(text: str) -> int:
    """An upper estimate of the default tokenizer's count, for when the model is not at hand."""
    return math.ceil(len(text.encode()) / BYTES_PER_TOKEN_FLOOR)
