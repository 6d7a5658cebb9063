"""The gate's wire: reserve -> finish (or release) of a tool call, its answers, refusal sentences and key templates.

A gate (the MCP front, the Python wrapper, another language's gateway) asks the service before it runs a
guarded tool: is this item handled already, is it in progress, is the daily limit used up? The service answers
in one transaction of the limits store, and a refusal carries one plain sentence a small model can act on.
The sentences are written here, once, so every front says the same thing. Nothing here imports the server.
"""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .limit_rules import MAX_DAILY_LIMIT, MAX_HANDLED_KEY_LEN
from .types import AgentId, FreeText, HandledKey, JsonInt, LimitName, ToolName

MAX_LEASE_S = 86_400  # a day: a gate that died holds its key at most this long
DEFAULT_LEASE_S = 300
MAX_RESULT_CHARS = 500  # the record's short result (finish), and a release's error note
RESERVATION_PATTERN = r"^res_[0-9a-f]{24}$"
RESERVATION_RULE = "'res_' followed by 24 lowercase hex digits, as POST /v1/gate/reserve answered it"
# a result quoted in a refusal sentence: enough to recognise it, short enough for a small model's context
QUOTED_RESULT_CHARS = 120

Reason = Literal["handled", "in_progress", "limit"]
ReservationId = Annotated[
    str, Field(min_length=28, max_length=28, pattern=RESERVATION_PATTERN, description=RESERVATION_RULE)
]
ShortText = Annotated[FreeText, Field(max_length=MAX_RESULT_CHARS)]


# ---------------------------------------------------------------- requests


class ReserveRequest(BaseModel):
    """POST /v1/gate/reserve: what the gate is about to run, and the key and/or limit that guard it."""

    model_config = ConfigDict(extra="forbid")

    tool: ToolName
    key: HandledKey | None = Field(default=None, description="The handled-ledger key of the item, e.g. ticket:42")
    scope: Literal["team", "agent"] = Field(
        default="team", description="Whose ledger the key is in: the team's, or the agent's (needs agent_id)"
    )
    limit: LimitName | None = Field(default=None, description="A daily limit to consume `units` of before the tool")
    units: JsonInt | None = Field(default=None, ge=1, le=MAX_DAILY_LIMIT, description="Default 1; only with limit")
    agent_id: AgentId | None = Field(default=None, description="The agent making the call (recorded as `by`)")
    lease_s: float = Field(
        default=DEFAULT_LEASE_S,
        ge=1,
        le=MAX_LEASE_S,
        allow_inf_nan=False,
        description=f"Seconds the reservation holds the key if never finished nor released (1-{MAX_LEASE_S})",
    )

    @model_validator(mode="after")
    def _guarded(self) -> ReserveRequest:
        if self.key is None and self.limit is None:
            raise ValueError("give a key (the item), a limit (a daily limit's name), or both: nothing to guard")
        if self.units is not None and self.limit is None:
            raise ValueError("units is only meaningful with limit: name the daily limit the units count against")
        return self


class FinishRequest(BaseModel):
    """POST /v1/gate/finish: the tool ran; record its key handled with a short result."""

    model_config = ConfigDict(extra="forbid")

    reservation: ReservationId
    result: ShortText | None = Field(default=None, description=f"A short result, at most {MAX_RESULT_CHARS} chars")


class ReleaseRequest(BaseModel):
    """POST /v1/gate/release: the tool failed; free the key and refund the units."""

    model_config = ConfigDict(extra="forbid")

    reservation: ReservationId
    error: ShortText | None = Field(default=None, description=f"What failed, at most {MAX_RESULT_CHARS} chars")


# ---------------------------------------------------------------- answers


class GateLimit(BaseModel):
    name: str
    used: int
    limit: int
    remaining: int
    resets_at: str = Field(description="The limit's next local midnight, ISO-8601 with offset")


class HandledBy(BaseModel):
    key: str
    by: str | None = Field(description="The agent that handled it; null if not known")
    at: str = Field(description="When it was first recorded handled, ISO-8601")
    tool: str | None
    result: str | None


class ReserveAnswer(BaseModel):
    """Every answer of reserve: allowed (200), or refused (409 handled/in_progress, 429 limit) with a sentence."""

    allowed: bool
    reservation: str | None = None
    expires_at: str | None = None
    limit: GateLimit | None = None
    reason: Reason | None = None
    message: str | None = Field(default=None, description="One plain sentence a small model can act on")
    handled: HandledBy | None = None


class FinishAnswer(BaseModel):
    finished: bool
    key: str | None = Field(description="The key recorded handled; null for a reservation of a limit alone")
    at: str


class ReleaseAnswer(BaseModel):
    released: bool
    refunded: int = Field(description="Units given back to today's counter (0 without a limit)")


# ---------------------------------------------------------------- key templates

_FORMATTER = string.Formatter()


def template_fields(template: str) -> list[str]:
    """The {field} names of a key template, in order; a ValueError names what is not a plain field.

    `{{` and `}}` are literal braces. Conversions (`{x!r}`), format specs (`{x:>3}`), indexes and attributes
    are refused: a key is the fields' text, nothing else."""
    try:
        parts = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ValueError(f"key template {template!r} is not valid: {exc}") from None
    fields = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"key template {template!r}: {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} is not a plain {{field}}; write each field as {{name}}"
            )
        fields.append(name)
    return fields


def render_key(template: str, arguments: Mapping[str, Any]) -> str:
    """The handled-ledger key of one call: each {field} of `template` replaced by str(arguments[field]).

    Each value is NFC-normalised and trimmed of surrounding whitespace; nothing else is changed (case is
    kept: 'Ticket-7' and 'ticket-7' are two keys). A missing, None or blank field raises a ValueError naming
    it, so the gate refuses the call with that sentence instead of guarding it under a wrong key."""
    fields = template_fields(template)
    values: dict[str, str] = {}
    for name in fields:
        raw = arguments.get(name)
        value = "" if raw is None else unicodedata.normalize("NFC", str(raw)).strip()
        if not value:
            state = "missing" if name not in arguments or raw is None else "empty"
            raise ValueError(
                f"the argument {name!r} is {state}: the key template {template!r} needs it to tell this item "
                "from the others; call the tool again with it"
            )
        values[name] = value
    key = template.format(**values)
    if not 1 <= len(key) <= MAX_HANDLED_KEY_LEN or "\x00" in key:
        raise ValueError(
            f"the key rendered from {template!r} is {len(key)} characters{' with a NUL' if chr(0) in key else ''}; "
            f"a key is 1-{MAX_HANDLED_KEY_LEN} characters without NUL: shorten the arguments or the template"
        )
    return key


# ---------------------------------------------------------------- the sentences


def _minute(iso_moment: str, *, date: bool = True) -> str:
    """'2026-12-07 14:03 UTC' (or '14:03 UTC') of an ISO moment; another offset is kept as written."""
    moment = datetime.fromisoformat(iso_moment)
    offset = moment.utcoffset()
    zone = "UTC" if offset is None or not offset else f"(UTC{moment.strftime('%z')[:3]}:{moment.strftime('%z')[3:]})"
    return moment.strftime("%Y-%m-%d %H:%M " if date else "%H:%M ") + zone


def _quoted(result: str) -> str:
    text = " ".join(result.split())
    return repr(text if len(text) <= QUOTED_RESULT_CHARS else text[: QUOTED_RESULT_CHARS - 1] + "…")


def handled_message(record: HandledBy) -> str:
    """e.g. "ticket:42 was already handled by triage-2 at 2026-12-07 14:03 UTC (process_item: 'closed as
    duplicate'); do not handle it again." """
    who = f" by {record.by}" if record.by else ""
    what = ""
    if record.tool and record.result:
        what = f" ({record.tool}: {_quoted(record.result)})"
    elif record.tool or record.result:
        what = f" ({record.tool or _quoted(record.result or '')})"
    return f"{record.key} was already handled{who} at {_minute(record.at)}{what}; do not handle it again."


def in_progress_message(key: str, by: str | None, since: str, now: datetime) -> str:
    """e.g. "ticket:42 is being handled right now by triage-2 (since 14:03 UTC); do not handle it again." """
    same_day = datetime.fromisoformat(since).astimezone(UTC).date() == now.astimezone(UTC).date()
    who = f" by {by}" if by else ""
    return f"{key} is being handled right now{who} (since {_minute(since, date=not same_day)}); do not handle it again."


def limit_message(limit: GateLimit, units: int, tool: str) -> str:
    """e.g. "The daily limit 'emails' is used up: 3 of 3 today; it resets at 2026-12-08 00:00 UTC. Do not run
    send_email again before then; tell the user what was not done." """
    resets = _minute(limit.resets_at)
    if limit.remaining <= 0:
        state = f"is used up: {limit.used} of {limit.limit} today"
    else:
        state = f"has {limit.remaining} of {limit.limit} left today and this call needs {units}"
    return (
        f"The daily limit {limit.name!r} {state}; it resets at {resets}. Do not run {tool} again before then; "
        "tell the user what was not done."
    )
