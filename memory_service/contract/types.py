"""One annotated type per input concept, used by every router in bodies, query and path parameters.

One definition keeps /docs, validation and the 422 message of a concept the same on every route, and
each 422 says the rule in words (pydantic's own message would only quote a regular expression).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from .boundary import MAX_JSON_DEPTH, NUL_RULE, check_json, check_text
from .ids import ID_PATTERN, ID_RULE, MAX_ID_LEN
from .limit_rules import (
    MAX_HANDLED_KEY_LEN,
    MAX_IDEMPOTENCY_KEY_LEN,
    MAX_NAME_LEN,
    NAME_PATTERN,
    NAME_RULE,
    check_name,
    check_timezone,
)

# A saved text's extraction status: the journal stores these strings and the API shows them.
QUEUED, EXTRACTING, DONE, FAILED = "queued", "extracting", "done", "failed"
REPLAYED = "Idempotent-Replayed"  # response header, `true` when an idempotency key's first answer is replayed
MAX_TAGS = 32
MAX_TAG_LEN = 64
NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f]+$"
NO_NUL = r"^[^\x00]+$"
MAX_METADATA_DEPTH = MAX_JSON_DEPTH
# Every string type below also takes `_UNICODE` (contract/boundary.py: no lone surrogate, no NUL), last, so it
# runs first and its 422 names that rule rather than the type's pattern.
_UNICODE = BeforeValidator(check_text)
# Idempotency keys the service derives itself (Hindsight's document and operation keys, an import's lineage):
# a client's own key may not start with these, so it can never take, or be taken by, a derived one.
RESERVED_KEY_PREFIXES = ("hindsight:", "import:")
# What one imported line may carry: far above what extraction stores for one text (at most
# MEMORY_MAX_FACTS a chunk, 3 spans a fact and chunk), low enough that a line is one short transaction.
MAX_IMPORT_FACTS = 1000
MAX_FACT_SPANS = 64
# Every moment the API takes: a year of margin inside datetime's range (years 1-9999), so neither an
# offset, a zone nor a relative date ("last year") taken from one can step out of it.
MIN_MOMENT = datetime(2, 1, 1, tzinfo=UTC)
MAX_MOMENT = datetime(9998, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
MIN_EPOCH_S, MAX_EPOCH_S = MIN_MOMENT.timestamp(), MAX_MOMENT.timestamp()
MOMENT_RULE = "between 0002-01-01 and 9998-12-31 (UTC)"


class JobStatus(StrEnum):
    """Where a saved text's extraction stands: the journal's statuses (a forgotten text is never shown)."""

    QUEUED = QUEUED
    EXTRACTING = EXTRACTING
    DONE = DONE
    FAILED = FAILED


def _rule(rule: str) -> WrapValidator:
    """Any failure of the inner checks (type, length, pattern) becomes one message: the rule in words."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(f"must be {rule}") from None

    return WrapValidator(validate)


def _tag(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("a tag must not be empty or only whitespace")
    return value


def _tz(value: str) -> str:
    check_timezone(value)
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(NUL_RULE)
    return value


def _moment(value: datetime) -> datetime:
    """In range once converted to UTC (a naive time read as UTC: its real zone is less than a day off)."""
    try:
        utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # the offset pushed it past year 1 or 9999
        utc = None
    if utc is None or not MIN_MOMENT <= utc <= MAX_MOMENT:
        raise ValueError(f"must be a date-time {MOMENT_RULE}")
    return value


def _day(value: str) -> str:
    try:
        day = date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a calendar date (YYYY-MM-DD)") from None
    if not MIN_MOMENT.date() <= day <= MAX_MOMENT.date():
        raise ValueError(f"must be a date {MOMENT_RULE}")
    return value


def whole_float_as_int(value: Any) -> Any:
    """JSON Schema counts 158.0 as an integer: let it through, while the strict int still refuses 1.5, true, "5"."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def check_metadata(value: Any) -> Any:
    """The text boundary's JSON rule (contract/boundary.py) at metadata's depth: keys and strings valid text,
    numbers finite, at most MAX_METADATA_DEPTH levels."""
    return check_json(value, MAX_METADATA_DEPTH)


def _not_reserved(value: str) -> str:
    if value.startswith(RESERVED_KEY_PREFIXES):
        raise ValueError(
            f"keys starting with {' or '.join(map(repr, RESERVED_KEY_PREFIXES))} are reserved for keys the service "
            "derives (Hindsight retains, imports): choose another"
        )
    return value


TAG_RULE = f"1-{MAX_TAG_LEN} characters, no control characters"
LABEL_RULE = "at most 200 characters, no control characters"
IDEMPOTENCY_RULE = f"1-{MAX_IDEMPOTENCY_KEY_LEN} characters, no control characters"
HANDLED_KEY_RULE = f"1-{MAX_HANDLED_KEY_LEN} characters, any text but NUL"

AgentId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ID_LEN, pattern=ID_PATTERN, description=f"The agent: {ID_RULE}"),
    _rule(ID_RULE),
]
RunId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ID_LEN, pattern=ID_PATTERN, description=f"The run: {ID_RULE}"),
    _rule(ID_RULE),
]
Tag = Annotated[
    str,
    Field(min_length=1, max_length=MAX_TAG_LEN, pattern=NO_CONTROL_CHARS, description=f"{TAG_RULE}; trimmed"),
    _rule(TAG_RULE),
    AfterValidator(_tag),
    _UNICODE,
]
Tags = Annotated[
    list[Tag],
    Field(max_length=MAX_TAGS, description=f"At most {MAX_TAGS}; repeats dropped"),
    AfterValidator(lambda tags: list(dict.fromkeys(tags))),
]
IdempotencyKey = Annotated[
    str,
    Field(min_length=1, max_length=MAX_IDEMPOTENCY_KEY_LEN, pattern=NO_CONTROL_CHARS, description=IDEMPOTENCY_RULE),
    _rule(IDEMPOTENCY_RULE),
    _UNICODE,
]
# What a client may send as its own key: any key but one in the derived keys' namespace (a 422 naming it).
ClientIdempotencyKey = Annotated[IdempotencyKey, AfterValidator(_not_reserved)]
LimitName = Annotated[
    str,
    Field(max_length=MAX_NAME_LEN, pattern=NAME_PATTERN, description=f"Limit name: {NAME_RULE}"),
    _rule(NAME_RULE),
    AfterValidator(check_name),
]
Timezone = Annotated[
    str,
    Field(min_length=1, max_length=64, examples=["Europe/Madrid"], description="IANA timezone name"),
    AfterValidator(_tz),
]
HandledKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_HANDLED_KEY_LEN,
        pattern=NO_NUL,
        description=f"Opaque key (URL, message id): {HANDLED_KEY_RULE}",
    ),
    _rule(HANDLED_KEY_RULE),
    _UNICODE,
]

TOOL_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
TOOL_NAME_RULE = "1-128 characters of A-Z a-z 0-9 . _ -"
ToolName = Annotated[
    str,
    Field(min_length=1, max_length=128, pattern=TOOL_NAME_PATTERN, description=f"A tool's name: {TOOL_NAME_RULE}"),
    _rule(TOOL_NAME_RULE),
]

# Free text (a memory, a query, a fact): anything but NUL, which is never meaningful in text and whose
# handling SQLite leaves undefined (its functions may cut a string there). The pattern documents the rule;
# the validator words it.
FreeText = Annotated[str, Field(json_schema_extra={"pattern": "^[^\\x00]*$"}), AfterValidator(_no_nul), _UNICODE]
Label = Annotated[
    str,
    Field(
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]*$",
        description=f"A note for people, e.g. 'mailer on host-3': {LABEL_RULE}",
    ),
    _rule(LABEL_RULE),
    _UNICODE,
]
EXPORT_ID_RULE = "1-256 characters, no control characters"
ExportId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=NO_CONTROL_CHARS,
        description=f"The id in the exporting service: {EXPORT_ID_RULE}",
    ),
    _rule(EXPORT_ID_RULE),
    _UNICODE,
]
# JSON numbers only: no true/false, no "5". An integral float (158.0) is an integer, as JSON Schema says.
# (constraints of an optional one go in its own Annotated, before the validator, or the schema loses them)
JsonInt = Annotated[int, Field(strict=True), BeforeValidator(whole_float_as_int)]
JsonFloat = Annotated[float, Field(strict=True)]
EPOCH_RULE = f"seconds since 1970-01-01 UTC, a finite JSON number {MOMENT_RULE}"
# A moment as the journal stores it and export writes it (NaN, Infinity and 1e20 refused)
EpochSeconds = Annotated[
    float,
    Field(strict=True, allow_inf_nan=False, ge=MIN_EPOCH_S, le=MAX_EPOCH_S, description=EPOCH_RULE),
    _rule(EPOCH_RULE),
]
# A moment the caller gives as ISO-8601 (remember's occurred_at, recall's and list's since/until)
Moment = Annotated[
    datetime,
    AfterValidator(_moment),
    Field(description=f"ISO-8601 date-time {MOMENT_RULE}"),
]
DAY_RULE = f"a calendar date YYYY-MM-DD {MOMENT_RULE}"
Day = Annotated[
    str,
    Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description=DAY_RULE),
    _rule(DAY_RULE),
    AfterValidator(_day),
]
Metadata = Annotated[
    dict[str, Any],
    BeforeValidator(check_metadata),
    Field(
        description=f"Kept with the text, returned as given (≤ 8 KiB as JSON, at most "
        f"{MAX_METADATA_DEPTH} levels deep; keys and strings without NUL or lone surrogates; finite numbers)."
    ),
]
