"""Arguments as small models send them: a bad one answers one sentence the model can act on.

The SDK answers a bad argument with pydantic's report ("1 validation error for recallArguments ... visit
https://errors.pydantic.dev/..."), which a 1.5B model cannot act on: it repeats the call. `PlainTool` checks the
arguments first and answers one sentence naming the argument, what is allowed and what to send instead.
It also takes what small models send besides: an optional argument sent as null or "" counts as not sent,
and an argument the tool does not have is ignored (the SDK's argument model ignores extras).
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver.tools import Tool
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ..contract.ids import ID_RULE
from ..contract.limit_rules import MAX_HANDLED_KEY_LEN, NAME_RULE
from .argument_types import RECALL_TOKENS, RECALL_TOKENS_MAX, RECALL_TOKENS_MIN, ToolFailed

# Per argument name (the same in every tool that takes it): what is allowed, and an example to send.
ALLOWED: dict[str, tuple[str, str]] = {
    "query": ("a string", "'digest sent this week?'"),
    "text": ("a string of plain words", "'Sent digest to 40 users.'"),
    "tags": ("a list of short labels", "['billing']"),
    "agent_id": (f"an agent id ({ID_RULE})", "'mailer-1'"),
    "max_tokens": (f"a whole number from {RECALL_TOKENS_MIN} to {RECALL_TOKENS_MAX}", str(RECALL_TOKENS)),
    "memory_id": ("a memory_id copied from a recall result", "'mem_3f2a9c'"),
    "name": (f"a limit name ({NAME_RULE})", "'emails'"),
    "amount": ("a whole number of at least 1", "1"),
    "key": (f"an item id of 1-{MAX_HANDLED_KEY_LEN} characters", "'msg-1187'"),
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return "a string"


def sentence(tool: str, error: ErrorDetails, required: bool) -> str:
    """One sentence for one pydantic error: the argument, what is allowed, what to send instead."""
    arg = str(error["loc"][0]) if error["loc"] else "arguments"
    allowed, example = ALLOWED.get(arg, ("a value as the tool's schema shows", "a value"))
    instead = f"send e.g. {arg}={example}" + ("" if required else f", or leave {arg} out")
    kind, given = error["type"], error.get("input")
    if kind == "value_error":  # our own validators' sentences (tools.py `_refused`), already specific
        said = str(error.get("ctx", {}).get("error", error["msg"])).rstrip(".")
        return f"{said}." if arg in said else f"{arg}: {said}."
    if kind == "missing" or (required and given is None):
        return f"{tool} needs the argument {arg} ({allowed}): call {tool} again with it, e.g. {arg}={example}."
    if kind in ("string_too_long", "too_long"):
        most = error.get("ctx", {}).get("max_length", "fewer")
        return f"{arg} is too long (at most {most}): send a shorter {arg}."
    if len(error["loc"]) > 1:  # one item of a list, e.g. tags=[1]
        return f"Each item of {arg} must be text, and {arg} must be {allowed}: {instead}."
    return f"{arg} must be {allowed}, not {_kind(given)}: {instead}."


class PlainTool(Tool):
    """A tool whose bad arguments answer one sentence, never pydantic's report (see the module docstring)."""

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        fields = self.fn_metadata.arg_model.model_fields
        arguments = {
            name: value
            for name, value in arguments.items()
            if not (value in (None, "") and name in fields and not fields[name].is_required())
        }
        try:
            self.fn_metadata.validate_arguments(arguments)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else ""
            raise ToolFailed(sentence(self.name, first, name in fields and fields[name].is_required())) from None
        return await super().run(arguments, context, convert_result)
