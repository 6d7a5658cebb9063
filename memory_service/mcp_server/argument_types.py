"""The tools' argument types: each checked against the contract before any HTTP call, each refusal one
sentence the model can act on (the argument, what is allowed, what to send instead).

A checked rule is not shown in the schema where it would only cost tokens (a regular expression is tokens a
small model cannot use); `arguments.py` turns every refusal into the tool's error text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import AfterValidator, Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator

from ..contract.ids import ID_RULE, MAX_MEMORY_ID_LEN, MEMORY_ID_PATTERN, MEMORY_ID_RULE, is_id
from ..contract.limit_rules import MAX_HANDLED_KEY_LEN, MAX_NAME_LEN, NAME_PATTERN, NAME_RULE, check_name
from ..contract.models import RecallRequest
from ..contract.types import MAX_TAG_LEN, MAX_TAGS


class ToolFailed(ToolError):
    """A failure the model can act on: the SDK returns it as a tool error whose text the model reads."""


def _refused(say: Callable[[Any], str]) -> WrapValidator:
    """A value outside the schema's pattern is refused before any HTTP call, with a sentence the model can act
    on (pydantic's own message would only quote the regular expression)."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(say(value)) from None

    return WrapValidator(validate)


def _short(value: Any) -> str:
    return repr(value if not isinstance(value, str) else value[:80])


def _agent_id(value: str) -> str:
    if not is_id(value):
        raise ValueError("not an agent id")
    return value


def _item_key(value: str) -> str:
    if not 1 <= len(value) <= MAX_HANDLED_KEY_LEN or not value.strip():
        raise ValueError("not an item key")
    return value


# Every id argument is checked against the contract's own pattern: a prompt-injected "id" such as
# '../limits/emails' never reaches a URL (the client would refuse it too, but the model reads this message).
MemoryId = Annotated[
    str,
    Field(
        max_length=MAX_MEMORY_ID_LEN,
        pattern=MEMORY_ID_PATTERN,
        description="A memory_id from a recall result, e.g. 'mem_3f2a9c…'.",
    ),
    _refused(lambda v: f"No memory with id {_short(v)} can exist: a memory_id is {MEMORY_ID_RULE}. Copy it exactly."),
]
LimitName = Annotated[
    str,
    Field(max_length=MAX_NAME_LEN, pattern=NAME_PATTERN, description="Limit name, e.g. 'emails'."),
    AfterValidator(check_name),  # no '..' either, which the pattern cannot say
    _refused(
        lambda v: (
            f"No limit can be named {_short(v)}: a limit name is {NAME_RULE}; send the name as the task "
            "gives it, e.g. 'emails'."
        )
    ),
]
AgentId = Annotated[
    str,
    Field(description="Only this agent's memories."),
    AfterValidator(_agent_id),  # checked, not shown: a regular expression is tokens a small model can't use
    _refused(
        lambda v: (
            f"No agent can have the id {_short(v)}: an agent_id is {ID_RULE}; leave agent_id out to search all agents."
        )
    ),
]
ItemKey = Annotated[
    str,
    Field(description="Item id, e.g. a URL or 'msg-1187'."),
    AfterValidator(_item_key),  # checked, not shown (as agent ids)
    _refused(
        lambda v: (
            f"No item key can be {_short(v)}: a key is 1-{MAX_HANDLED_KEY_LEN} characters, not only spaces; "
            "send the item's own id, e.g. 'msg-1187'."
        )
    ),
]


# recall's answer size in tokens (of the service's counter): enough for a few dated lines by default, and
# bounded so that one answer cannot fill a small model's context
RECALL_TOKENS, RECALL_TOKENS_MIN, RECALL_TOKENS_MAX = 400, 64, 4000


def _recall_tokens(value: int) -> int:
    if not RECALL_TOKENS_MIN <= value <= RECALL_TOKENS_MAX:
        raise ValueError("out of bounds")
    return value


RecallTokens = Annotated[
    int,
    AfterValidator(_recall_tokens),  # checked, not shown (16 tokens of every prompt)
    _refused(
        lambda v: (
            f"max_tokens={_short(v)} is not allowed: send a whole number from {RECALL_TOKENS_MIN} to "
            f"{RECALL_TOKENS_MAX}, e.g. {RECALL_TOKENS}, or leave max_tokens out."
        )
    ),
]


# The service's own bound on a recall query (RecallRequest.query's max_length), checked here so that the model
# reads one sentence instead of the service's validation report.
MAX_QUERY_LEN = next(m.max_length for m in RecallRequest.model_fields["query"].metadata if hasattr(m, "max_length"))


def _query(value: str) -> str:
    if not value.strip():
        raise ValueError("query is empty: send a few words of what you look for, e.g. 'digest sent this week?'.")
    if len(value) > MAX_QUERY_LEN:
        raise ValueError(
            f"query is too long ({len(value)} characters, at most {MAX_QUERY_LEN}): send a few words of what you "
            "look for, e.g. 'digest sent this week?'."
        )
    return value


Query = Annotated[str, Field(description="e.g. 'digest sent this week?'"), AfterValidator(_query)]


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("text is empty: send what to save in plain words, e.g. 'Sent digest to 40 users.'.")
    return value


Text = Annotated[str, Field(description="Plain words, e.g. 'Sent digest to 40 users.'"), AfterValidator(_text)]


def too_long_to_save(text: str, said: str) -> str:
    """The service's 413 for a text past MEMORY_MAX_TEXT_BYTES, as one sentence on what to send instead."""
    limit = re.search(r"limit is (\d+) bytes", said)
    most = f"at most {limit.group(1)} bytes" if limit else "more than the memory service takes"
    return (
        f"text is too long to save ({len(text.encode())} bytes, {most}): split it into shorter saves or save a summary."
    )


def _tags(value: list[str] | None) -> list[str] | None:
    """Blank labels dropped (a small model sends `[""]` for "none"); the service's bounds checked here, so that
    the model reads one sentence instead of the service's validation report."""
    kept = [tag for tag in value or () if tag.strip()]
    if len(kept) > MAX_TAGS or any(len(tag) > MAX_TAG_LEN for tag in kept):
        raise ValueError(
            f"tags must be at most {MAX_TAGS} short labels of at most {MAX_TAG_LEN} characters each: send e.g. "
            "tags=['billing'], or leave tags out."
        )
    return kept or None


SaveTags = Annotated[list[str] | None, Field(description="Optional labels."), AfterValidator(_tags)]
FilterTags = Annotated[list[str] | None, Field(description="Only with all these tags."), AfterValidator(_tags)]
