"""One annotated type per input concept, used by every router in bodies, query and path parameters.

One definition keeps /docs, validation and the 422 message of a concept the same on every route, and
each 422 says the rule in words (pydantic's own message would only quote a regular expression).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator

from ..ids import ID_PATTERN, ID_RULE, MAX_ID_LEN
from ..storage.journal import DONE, EXTRACTING, FAILED, QUEUED
from ..storage.limits import (MAX_HANDLED_KEY_LEN, MAX_IDEMPOTENCY_KEY_LEN, MAX_NAME_LEN, NAME_PATTERN, NAME_RULE,
                              check_name, check_timezone)

REPLAYED = "Idempotent-Replayed"  # response header, `true` when an idempotency key's first answer is replayed
MAX_TAGS = 32
MAX_TAG_LEN = 64
NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f]+$"
NO_NUL = r"^[^\x00]+$"


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


TAG_RULE = f"1-{MAX_TAG_LEN} characters"
IDEMPOTENCY_RULE = f"1-{MAX_IDEMPOTENCY_KEY_LEN} characters, no control characters"
HANDLED_KEY_RULE = f"1-{MAX_HANDLED_KEY_LEN} characters, any text but NUL"

AgentId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LEN, pattern=ID_PATTERN,
                               description=f"The agent: {ID_RULE}"), _rule(ID_RULE)]
RunId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LEN, pattern=ID_PATTERN,
                             description=f"The run: {ID_RULE}"), _rule(ID_RULE)]
Tag = Annotated[str, Field(min_length=1, max_length=MAX_TAG_LEN, description=f"{TAG_RULE}; trimmed"),
                _rule(TAG_RULE), AfterValidator(_tag)]
Tags = Annotated[list[Tag], Field(max_length=MAX_TAGS, description=f"At most {MAX_TAGS}; repeats dropped"),
                 AfterValidator(lambda tags: list(dict.fromkeys(tags)))]
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=MAX_IDEMPOTENCY_KEY_LEN, pattern=NO_CONTROL_CHARS,
                                      description=IDEMPOTENCY_RULE), _rule(IDEMPOTENCY_RULE)]
LimitName = Annotated[str, Field(max_length=MAX_NAME_LEN, pattern=NAME_PATTERN, description=f"Limit name: {NAME_RULE}"),
                      _rule(NAME_RULE), AfterValidator(check_name)]
Timezone = Annotated[str, Field(min_length=1, max_length=64, examples=["Europe/Madrid"],
                                description="IANA timezone name"), AfterValidator(_tz)]
HandledKey = Annotated[str, Field(min_length=1, max_length=MAX_HANDLED_KEY_LEN, pattern=NO_NUL,
                                  description=f"Opaque key (URL, message id): {HANDLED_KEY_RULE}"),
                       _rule(HANDLED_KEY_RULE)]
