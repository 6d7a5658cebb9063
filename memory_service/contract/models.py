"""Request and response models: the API's edges, strict (unknown fields are refused)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from .health import JobCounts, ThroughputOut
from .types import (
    MAX_FACT_SPANS,
    MAX_IMPORT_FACTS,
    AgentId,
    ClientIdempotencyKey,
    Day,
    EpochSeconds,
    ExportId,
    FreeText,
    IdempotencyKey,
    JobStatus,
    JsonFloat,
    JsonInt,
    Metadata,
    Moment,
    RunId,
    Tags,
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FieldError(BaseModel):
    field: str = Field(description="Where: a body field (`tags.0`), or `query.<name>` / `path.<name>`.")
    message: str


class ErrorOut(BaseModel):
    """Every error body, whatever the route: a code for programs, a message for people."""

    error: str = Field(
        description="bad_request, unauthorized, forbidden (cross_site: a browser's write from another site), "
        "not_found, method_not_allowed, conflict, request_timeout, too_large, unsupported_media_type, "
        "untrusted_host (421), invalid_request, limit_reached, unavailable, not_implemented or internal.",
        examples=["invalid_request"],
    )
    detail: str = Field(description="What was wrong and what is allowed.")
    errors: list[FieldError] | None = Field(
        default=None, description="On a refused request body or parameter: each field and its problem."
    )
    request_id: str | None = Field(
        default=None, description="On a 500: the request's id (as in X-Request-ID), to quote when reporting it."
    )


class RememberRequest(Strict):
    text: FreeText = Field(
        min_length=1,
        description="What the agent did, read or was told, as given. Limit: MEMORY_MAX_TEXT_BYTES (64 KiB).",
    )
    agent_id: AgentId
    run_id: RunId | None = None
    tags: Tags = Field(default_factory=list)
    metadata: Metadata = Field(default_factory=dict)
    idempotency_key: ClientIdempotencyKey | None = Field(
        default=None,
        description="A repeat with the same key (per team) returns the first save, with header "
        "`Idempotent-Replayed: true`. Keys starting with `hindsight:` or `import:` are the service's own.",
    )
    occurred_at: Moment | None = Field(
        default=None,
        description="When what the text tells happened (ISO-8601, 0002-01-01 to 9998-12-31; with an offset it "
        "counts in that offset, without one in MEMORY_TIMEZONE). Relative dates in its facts ('yesterday') "
        "count from that day. Default: the save time.",
    )
    wait_s: JsonFloat = Field(
        default=0, ge=0, le=120, description="Wait up to this long for extraction to finish before answering."
    )

    @field_validator("text")
    @classmethod
    def _text_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text is empty or only whitespace; send the text to remember")
        return value


class RememberResponse(BaseModel):
    id: str
    status: JobStatus
    created: bool = Field(description="False when an earlier save with the same idempotency_key was returned.")
    queue_depth: int
    estimated_extraction_s: float | None = Field(
        description="Seconds until this save's facts are extracted: the work queued ahead of it (and its own) at the "
        "model's speed. Null when no speed is known yet (see estimate_basis)."
    )
    estimate_basis: str | None = Field(
        default=None, description="What the estimate rests on: 'measured', 'bootstrap smoke test', or 'unknown'."
    )


class FactOut(BaseModel):
    id: str
    text: str
    spans: list[list[int]]
    superseded_by: str | None = None
    created_at: datetime


class MemoryHead(BaseModel):
    """What every view of a saved text shows first."""

    id: str
    status: JobStatus
    agent_id: str
    run_id: str | None
    text: str
    tags: list[str]


class MemoryOut(MemoryHead):
    metadata: dict[str, Any]
    created_at: datetime
    occurred_at: datetime | None = Field(default=None, description="As given to remember; null when not given.")
    occurred_day: str | None = Field(default=None, description="The day relative dates in its facts count from.")
    attempts: int
    deferrals: int
    next_attempt_at: datetime | None
    last_error: str | None
    facts: list[FactOut]
    rejected_facts: list[dict[str, str]]
    timings: dict[str, Any] | None
    extraction: dict[str, Any] | None
    raw_reply: str | None = Field(description="The model's raw reply, kept when parsing failed.")
    progress: dict[str, int] | None = Field(
        default=None, description="While a long text is part-way: chunks done and characters done of the total."
    )


ItemKind = Literal["fact", "passage", "consolidated"]


def _default_kinds() -> list[ItemKind]:
    return ["fact", "passage"]


# the bounds of a recall's `max_tokens`: a line's date and agent take ~14 tokens; 32768 is a large model's context
MIN_RECALL_TOKENS = 32
MAX_RECALL_TOKENS = 32768


class RecallRequest(Strict):
    query: FreeText = Field(min_length=1, max_length=4096)
    agent_id: AgentId | None = None
    scope: Literal["team", "agent"] = "team"
    k: JsonInt = Field(default=10, ge=1, le=100)
    kinds: list[ItemKind] = Field(
        default_factory=_default_kinds,
        min_length=1,
        description="consolidated (asked for explicitly): one line per subject summing up its facts "
        "(MEMORY_CONSOLIDATE), with all their sources.",
    )
    tags: Tags = Field(default_factory=list, description="Items must carry all of these.")
    since: Moment | None = None
    until: Moment | None = None
    time_field: Literal["created_at", "occurred_at"] = Field(
        default="created_at",
        description="What since/until compare: when saved, or when what it tells happened (occurred_at, else saved).",
    )
    as_of: Moment | None = Field(default=None, description="When asked: the query's 'last week' counts from it; now.")
    min_score: JsonFloat | None = Field(
        default=None,
        ge=-1,
        le=1,
        description="Minimum cosine similarity of an item to the query (items without one are left out). Unset: "
        "the service's relevance floor (MEMORY_RECALL_FLOOR, 0.25) applies, so an unrelated question gets few or "
        "no items and a `note`; -1: no cut at all.",
    )
    max_tokens: JsonInt | None = Field(
        default=None,
        ge=MIN_RECALL_TOKENS,
        le=MAX_RECALL_TOKENS,
        description=f"Token budget ({MIN_RECALL_TOKENS}-{MAX_RECALL_TOKENS}) of `context`: the best of the k items, "
        "in rank order, whose lines fit (a line too long is skipped, shorter ones after it still tried); `items` "
        "are then exactly those. Counted by the extraction model's tokenizer, else an estimate (`token_counter`).",
    )

    @field_validator("query")
    @classmethod
    def _query_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query is empty or only whitespace")
        return value


class RecallItem(BaseModel):
    kind: Literal["fact", "passage", "consolidated"]
    text: str
    score: float = Field(description="Rank-fusion score of vector and keyword search; higher is better.")
    similarity: float | None = Field(description="Cosine similarity to the query, when the vector search found it.")
    memory_id: str
    source_memory_ids: list[str]
    fact_id: str | None = Field(default=None, description="The fact's id; for a consolidated item, its id (c:...).")
    agent_id: str
    created_at: datetime
    tags: list[str]


class RecallResponse(BaseModel):
    items: list[RecallItem]
    context: str = Field(
        default="",
        description="Ready to paste into a prompt: one line per saved text, `[YYYY-MM-DD agent] text` (the date "
        "the text tells it happened, `occurred_at`, else its save date, UTC; its facts joined on one line), a "
        "source said once and a passage left out for its facts when they hold every query word it holds (see "
        "docs/recall.md). Within `max_tokens` when given; then `items` follow the context's order.",
    )
    tokens: int | None = Field(default=None, description="Tokens of `context` by `token_counter`; with max_tokens.")
    token_counter: Literal["model", "estimate"] | None = Field(
        default=None,
        description="model: the extraction model's /tokenize; estimate: the documented over-counting rule "
        "(the model did not answer in time). With max_tokens.",
    )
    note: str | None = Field(
        default=None,
        description="Set when the relevance floor left out hits that would have filled k: how many, and the "
        "min_score that shows them.",
    )


class AgentCount(BaseModel):
    agent_id: str
    memories: int


class TagCount(BaseModel):
    tag: str
    memories: int


class TeamOut(BaseModel):
    team: str
    role: Literal["read", "write", "admin"] = Field(
        description="What this key may do. read: recall, get, list, check; write: also remember, consume, mark "
        "handled, import; admin: also forget, define limits, manage keys."
    )
    memories: int = Field(description="Saved texts in the team's memory (forgotten ones excluded).")
    agents: list[AgentCount] = Field(description="The agent ids with most memories, busiest first (max 50).")
    tags: list[TagCount] = Field(description="The most used tags, most used first (max 50).")


class MemorySummary(MemoryHead):
    created_at: datetime
    facts: int = Field(description="How many facts this text produced or confirmed.")


class MemoryPage(BaseModel):
    items: list[MemorySummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class ForgetResponse(BaseModel):
    deleted: int


Span = tuple[JsonInt, JsonInt]


class ExportedFact(BaseModel):
    """A fact as `/v1/export` writes it and `/v1/import` reads it."""

    id: ExportId
    text: FreeText = Field(min_length=1, max_length=4096)
    spans: list[Span] = Field(
        default_factory=list,
        max_length=MAX_FACT_SPANS,
        description=f"[start, end) character offsets in the memory's text, 0 <= start < end <= its length; "
        f"[0, 0]: supported without a span. At most {MAX_FACT_SPANS}.",
    )
    created_at: EpochSeconds | None = None
    superseded_by: ExportId | None = None
    superseded_at: EpochSeconds | None = None


class ExportedMemory(BaseModel):
    """One line of `/v1/export`: a memory with its facts. Unknown fields are ignored (newer exports)."""

    id: ExportId
    text: FreeText
    agent_id: AgentId
    run_id: RunId | None = None
    tags: Tags = Field(default_factory=list)
    metadata: Metadata = Field(default_factory=dict)
    created_at: EpochSeconds
    status: JobStatus = JobStatus.QUEUED
    idempotency_key: IdempotencyKey | None = None
    occurred_at: EpochSeconds | None = None
    occurred_day: Day | None = None
    facts: list[ExportedFact] = Field(
        default_factory=list, max_length=MAX_IMPORT_FACTS, description=f"At most {MAX_IMPORT_FACTS}."
    )

    @field_validator("text")
    @classmethod
    def _text_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text is empty or only whitespace")
        return value

    @field_validator("facts")
    @classmethod
    def _spans_inside_text(cls, facts: list[ExportedFact], info: ValidationInfo) -> list[ExportedFact]:
        """A span past the text would point a fact's source view at nothing (or at another text's words)."""
        if "text" not in info.data:  # the text was refused: that error is reported
            return facts
        length = len(info.data["text"])
        for i, fact in enumerate(facts):
            for start, end in fact.spans:
                if (start, end) != (0, 0) and not 0 <= start < end <= length:
                    raise ValueError(
                        f"fact {i}: span [{start}, {end}] is not inside the text: 0 <= start < end <= {length} "
                        "(the text's length in characters)"
                    )
        return facts


class ImportResponse(BaseModel):
    imported: int = Field(description="Lines stored as new memories.")
    skipped: int = Field(description="Lines already imported before (same original id or idempotency key).")
    failed: int
    errors: list[dict[str, Any]] = Field(description="The first 100 bad lines: {line, detail}.")


class ConsolidationOut(BaseModel):
    enabled: bool
    running: bool = Field(description="A consolidation model call or write is in progress now.")
    items: int = Field(description="Consolidated items stored (all teams).")
    runs: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The latest passes, newest first: "
        "started_at, ended_at, outcome (running, done, yielded, interrupted, "
        "failed), groups_due, written, removed.",
    )
    last_error: str | None = None


class StatsOut(BaseModel):
    jobs: JobCounts
    throughput: ThroughputOut
    model_ready: bool
    consolidation: ConsolidationOut
