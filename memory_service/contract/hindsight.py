"""Hindsight's REST shapes, as its PyPI client (`hindsight-client` 1.1.0) sends and parses them.

Requests ignore fields this service does not use (a newer Hindsight client adds some every release, and its
integrations send them all), except the few that would change what is stored or matched: those are refused
by the routes with a 501 naming what is served. Responses carry the fields the client requires.
docs/hindsight.md gives the mapping onto this service's own model.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from .boundary import check_json
from .ids import MAX_ID_LEN
from .types import FreeText, Moment, Tags, check_metadata

# A bank is an agent_id, and a document id becomes a run_id: both keep the AgentId rule, minus `/`, because
# each travels as one path segment (`/banks/{bank_id}/documents/{document_id}`).
SEGMENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
SEGMENT_RULE = f"1-{MAX_ID_LEN} characters of A-Z a-z 0-9 . _ : @ -, starting with a letter or digit"
SegmentId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LEN, pattern=SEGMENT_PATTERN)]
MAX_CONTEXT_CHARS = 2000
MAX_BATCH_ITEMS = 100

HsType = Literal["world", "experience", "observation"]
TagsMatch = Literal["any", "all", "any_strict", "all_strict", "exact"]


# The idempotency keys a retain derives: a hash of the JSON list [kind, bank, id, index], so no two of them can
# be one key whatever `:` the ids hold (`hindsight:{bank}:{doc}:{i}` made bank `support` + document `bot:t1`
# the key of bank `support:bot` + document `t1`). `hindsight:` is reserved: no client key can take one.
DERIVED_KEY_PREFIX = "hindsight:v2:"
KeyKind = Literal["document", "operation", "append"]


def derived_key(bank: str, kind: KeyKind, ident: str, index: int | str) -> str:
    """Item `index` of document (or operation) `ident` in `bank`: the key a retried retain finds again. An
    appended item's `index` is the SHA-256 of its text: the document's next part, whatever came before."""
    payload = json.dumps([kind, bank, ident, index], ensure_ascii=True, separators=(",", ":"))
    return DERIVED_KEY_PREFIX + hashlib.sha256(payload.encode()).hexdigest()


def legacy_document_key(bank: str, document_id: str, index: int) -> str:
    """The key a document item got before `derived_key` (kept for replay: docs/hindsight.md)."""
    return f"hindsight:{bank}:{document_id}:{index}"


def retain_derives(key: str, *, bank: str, document_id: str | None, operation_id: Any, text: str) -> bool:
    """Whether a retain of `bank` derives `key` for a memory of this document (or operation) and text: an
    exported memory may carry its key back in, since only that bank's own retain of that document can meet
    it again. Any other `hindsight:` key on an import line could take a key another retain will derive."""
    if not key.startswith("hindsight:"):
        return False
    keys: set[str] = set()
    if document_id is not None:
        keys.add(derived_key(bank, "append", document_id, hashlib.sha256(text.encode()).hexdigest()))
        for index in range(MAX_BATCH_ITEMS):
            keys |= {derived_key(bank, "document", document_id, index), legacy_document_key(bank, document_id, index)}
    elif isinstance(operation_id, str):
        keys |= {derived_key(bank, "operation", operation_id, n) for n in range(MAX_BATCH_ITEMS)}
    return key in keys


# Content (a string or text blocks) and metadata obey the text boundary (contract/boundary.py) like every
# other string: a lone surrogate or NUL is a 422 naming the rule, not a 500 or a row the export cannot write.
Content = Annotated[str | list[dict[str, Any]], BeforeValidator(check_json)]
HsMetadata = Annotated[dict[str, str], BeforeValidator(check_metadata)]


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class HsItem(Lenient):
    content: Content = Field(description="Plain text, or text blocks ({type: text, text}).")
    timestamp: Moment | Literal["unset"] | None = Field(default=None, description="-> occurred_at")
    context: FreeText | None = Field(default=None, max_length=MAX_CONTEXT_CHARS, description="-> metadata")
    metadata: HsMetadata | None = None
    document_id: SegmentId | None = Field(default=None, description="-> run_id and the idempotency key")
    tags: Tags | None = None
    entities: list[Any] | None = None
    update_mode: Literal["replace", "append"] | None = None

    def text(self) -> str:
        """The text to remember: the string, or the text blocks joined (any other block is refused)."""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for block in self.content:
            if block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise ValueError("only text content blocks are served (no image or file blocks)")
            parts.append(block["text"])
        return "\n".join(parts)


class HsRetainRequest(Lenient):
    items: list[HsItem] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)
    is_async: bool = Field(default=False, alias="async")
    document_tags: Tags | None = None
    operation_id: SegmentId | None = None


class HsRetainResponse(BaseModel):
    model_config = ConfigDict(serialize_by_alias=True)

    success: bool
    bank_id: str
    items_count: int
    is_async: bool = Field(serialization_alias="async")
    operation_id: str | None = None
    operation_ids: list[str] | None = None


# The Hindsight API whose paths and shapes /v1/default serves (tested with hindsight-client 1.1.0), as GET
# /version tells it: integrations gate behaviour on it (Hermes Agent sends update_mode "append" from 0.5.0 on).
HINDSIGHT_API_VERSION = "1.1.0"


class HsFeatures(BaseModel):
    """Hindsight's feature flags, all of which its client requires: only what this service does is true."""

    observations: bool  # consolidated items (MEMORY_CONSOLIDATE)
    worker: bool = True
    store_document_text: bool = True
    mcp: bool = False  # `memory-service mcp` is a process of its own, not a route of the API
    bank_config_api: bool = False
    bank_llm_health: bool = False
    file_upload_api: bool = False
    document_export_api: bool = False
    document_import_api: bool = False
    audit_log: bool = False
    llm_trace: bool = False


class HsVersion(BaseModel):
    api_version: str = HINDSIGHT_API_VERSION
    features: HsFeatures


class HsRecallRequest(Lenient):
    query: FreeText = Field(min_length=1, max_length=4096)
    types: list[HsType] | None = None
    budget: Literal["low", "mid", "high"] | None = "mid"
    max_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    tags: Tags | None = None
    tags_match: TagsMatch = "any"
    tag_groups: list[Any] | None = None

    @field_validator("query")
    @classmethod
    def _query_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query is empty or only whitespace")
        return value


class HsRecallResult(BaseModel):
    id: str
    text: str
    type: HsType
    context: str | None = None
    occurred_start: str | None = None
    occurred_end: str | None = None
    mentioned_at: str | None = None
    document_id: str | None = None
    metadata: dict[str, str] | None = None
    tags: list[str] | None = None


class HsRecallResponse(BaseModel):
    results: list[HsRecallResult]


class HsOperationStatus(BaseModel):
    operation_id: str
    status: Literal["pending", "processing", "completed", "failed"]
    operation_type: str = "retain"
    created_at: str | None = None
    updated_at: str | None = None
    completed_at: str | None = None
    error_message: str | None = None


class HsDocumentListItem(BaseModel):
    id: str
    bank_id: str
    created_at: str
    updated_at: str
    text_length: int
    memory_unit_count: int
    document_metadata: dict[str, Any] | None = None
    tags: list[str] | None = None


class HsDocumentList(BaseModel):
    items: list[HsDocumentListItem]
    total: int
    limit: int
    offset: int
    total_is_estimate: bool = False


class HsDocument(BaseModel):
    id: str
    bank_id: str
    original_text: str | None
    content_hash: str | None
    created_at: str
    updated_at: str
    memory_unit_count: int
    tags: list[str] | None = None
    document_metadata: dict[str, Any] | None = None


class HsDeleteDocument(BaseModel):
    success: bool
    message: str
    document_id: str
    memory_units_deleted: int


class HsDisposition(BaseModel):
    skepticism: int = 3
    literalism: int = 3
    empathy: int = 3


class HsBankProfile(BaseModel):
    bank_id: str
    name: str
    disposition: HsDisposition = Field(default_factory=HsDisposition)
    mission: str = ""
    background: str | None = None


class HsBankListItem(BaseModel):
    bank_id: str
    name: str | None = None
    disposition: HsDisposition = Field(default_factory=HsDisposition)
    fact_count: int = 0
    last_write_at: str | None = None


class HsBankList(BaseModel):
    banks: list[HsBankListItem]
    total: int
    limit: int
    offset: int


class HsCreateBank(Lenient):
    name: FreeText | None = Field(default=None, max_length=256)


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
