"""mem0's platform shapes, as its PyPI client (`mem0ai` 2.2.1, `MemoryClient` and `AsyncMemoryClient`) sends
them, and the one reading of its `filters` this service serves.

Requests ignore fields this service does not use (mem0's clients add options every release and older ones send
`version`/`output_format`), except those that would change what is stored or matched: the routes refuse those
with a 501 naming what is served. Entity ids (user, agent, app, run) only ever select among the key's team's
memories: the team comes from the key alone. docs/mem0.md gives the mapping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from .boundary import check_json
from .ids import ID_PATTERN
from .types import MAX_MOMENT, MAX_TAG_LEN, MIN_MOMENT, MOMENT_RULE, FreeText, JsonFloat, JsonInt, Metadata

# an entity id becomes a tag `user:<id>` (`app:`, `run:`): the longest prefix leaves this much of a tag's length
MAX_ENTITY_LEN = MAX_TAG_LEN - len("user:")
ENTITY_RULE = f"1-{MAX_ENTITY_LEN} characters of A-Z a-z 0-9 . _ : @ / -, starting with a letter or digit"
ENTITIES = ("user_id", "agent_id", "app_id", "run_id")
TAGGED = {"user_id": "user:", "app_id": "app:", "run_id": "run:"}  # agent_id is the memory's agent instead
ANY = "*"
MAX_MESSAGES = 100
MAX_FILTER_TERMS = 16
MAX_PAGE_SIZE = 500
MAX_TOP_K = 100
_ID = re.compile(ID_PATTERN)

EntityId = Annotated[str, Field(min_length=1, max_length=MAX_ENTITY_LEN, pattern=ID_PATTERN, description=ENTITY_RULE)]
Filters = Annotated[dict[str, Any], BeforeValidator(lambda v: check_json(v, 8))]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("empty or only whitespace; send the text")
    return value


Text = Annotated[FreeText, AfterValidator(_not_blank)]


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Message(Lenient):
    role: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_-]+$")] = "user"
    content: Text = Field(min_length=1)


class AddRequest(Lenient):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    user_id: EntityId | None = None
    agent_id: EntityId | None = None
    app_id: EntityId | None = None
    run_id: EntityId | None = None
    filters: Filters | None = None  # v3 clients may put the entity ids here instead
    metadata: Metadata | None = None
    infer: bool = True
    timestamp: JsonInt | None = Field(default=None, ge=int(MIN_MOMENT.timestamp()), le=int(MAX_MOMENT.timestamp()))
    # not served: each one, when set, is a 501 naming it
    custom_categories: list[Any] | None = None
    custom_instructions: str | None = None
    agent_custom_instructions: str | None = None
    structured_data_schema: dict[str, Any] | None = None
    expiration_date: str | None = None


class SearchRequest(Lenient):
    query: Text = Field(min_length=1, max_length=4096)
    filters: Filters | None = None
    top_k: JsonInt = Field(default=10, ge=1, le=MAX_TOP_K)
    threshold: JsonFloat | None = Field(default=None, ge=0, le=1)
    categories: list[Any] | None = None  # not served


class ListRequest(Lenient):
    filters: Filters | None = None
    start_date: str | None = Field(default=None, max_length=64)
    end_date: str | None = Field(default=None, max_length=64)
    categories: list[Any] | None = None  # not served


class UpdateRequest(Lenient):
    text: Text | None = Field(default=None, min_length=1)
    metadata: Metadata | None = None
    timestamp: JsonInt | JsonFloat | str | None = None  # not served
    expiration_date: str | None = None  # not served


class NotServed(ValueError):
    """A filter this service cannot apply: the route answers 501 with its words."""


@dataclass(frozen=True)
class Scope:
    """What a request's entity ids and dates select, within the key's team. An id may be ANY: as in mem0, the
    memory must have that id, whatever its value (one without it is not selected)."""

    user_id: str | None = None
    agent_id: str | None = None
    app_id: str | None = None
    run_id: str | None = None
    since: float | None = None
    until: float | None = None

    def tags(self) -> list[str]:
        """The tags a memory must carry: one per id given, none for an ANY."""
        return [TAGGED[k] + v for k in TAGGED if (v := getattr(self, k)) not in (None, ANY)]

    def entities(self) -> dict[str, str]:
        return {k: v for k in ENTITIES if (v := getattr(self, k)) is not None}

    def wildcards(self) -> tuple[str, ...]:
        """The ids asked for as ANY: present, any value."""
        return tuple(k for k in ENTITIES if getattr(self, k) == ANY)

    def concrete(self, key: str) -> str | None:
        """The id given for `key`, or None for none or ANY (what a column filter can push down)."""
        value: str | None = getattr(self, key)
        return None if value == ANY else value


def _moment(value: Any, where: str) -> float:
    """An ISO-8601 date or date-time (naive: UTC) within the service's range, as epoch seconds."""
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(f"{where}: an ISO-8601 date or date-time")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{where}: {value[:40]!r} is not an ISO-8601 date or date-time") from None
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    if not MIN_MOMENT <= moment <= MAX_MOMENT:
        raise ValueError(f"{where}: must be {MOMENT_RULE}")
    return moment.timestamp()


def date_param(value: str | None, where: str) -> float | None:
    return None if value is None else _moment(value, where)


def _entity(key: str, value: Any) -> str:
    if value == ANY:
        return ANY
    if isinstance(value, dict):
        raise NotServed(f"filters.{key} with an operator ({', '.join(map(str, value))[:60]}): give one id or '*'")
    if not isinstance(value, str) or len(value) > MAX_ENTITY_LEN or not _ID.fullmatch(value):
        raise ValueError(f"filters.{key}: must be {ENTITY_RULE}, or '*'")
    return value


def scope_of(filters: dict[str, Any] | None, base: Scope | None = None) -> Scope:
    """The entity ids and created_at window of mem0's `filters`: flat keys, `AND` of them, `*` for "has this id,
    any value" (mem0's meaning: a memory without the id is not selected). `OR`, `NOT`, operators on ids,
    metadata and categories raise NotServed; malformed ones ValueError (a 422)."""
    values = {f.name: getattr(base, f.name) for f in fields(Scope)} if base else {}
    terms: list[tuple[str, Any]] = list((filters or {}).items())
    seen = 0
    while terms:
        key, value = terms.pop(0)
        seen += 1
        if seen > MAX_FILTER_TERMS:
            raise ValueError(f"filters: at most {MAX_FILTER_TERMS} terms")
        if key == "AND":
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise ValueError("filters.AND: a list of objects")
            terms.extend(item for part in value for item in part.items())
        elif key in ENTITIES:
            got, had = _entity(key, value), values.get(key)
            if ANY not in (got, had) and had not in (None, got):
                raise ValueError(f"filters.{key}: two different ids ({had!r}, {got!r}) select nothing")
            values[key] = got if had in (None, ANY) else had  # an id given narrows '*' (it has a value)
        elif key == "created_at" and isinstance(value, dict):
            for op, moment in value.items():
                if op not in ("gte", "gt", "lte", "lt"):
                    raise NotServed(f"filters.created_at.{str(op)[:20]}: served are gte, gt, lte, lt")
                values["since" if op in ("gte", "gt") else "until"] = _moment(moment, f"filters.created_at.{op}")
        else:
            raise NotServed(f"filters.{str(key)[:40]}")
    return Scope(**values)
