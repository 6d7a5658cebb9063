"""Request and response models: the API's edges, strict (unknown fields are refused)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]*$"
MAX_TAGS = 32


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _clean_tags(tags: list[str]) -> list[str]:
    out = []
    for tag in tags:
        tag = tag.strip()
        if not tag:
            raise ValueError("tags must be non-empty strings")
        out.append(tag)
    return list(dict.fromkeys(out))


class RememberRequest(Strict):
    text: str = Field(description="What the agent did, read or was told. Limit: MEMORY_MAX_TEXT_BYTES (64 KiB).")
    agent_id: str = Field(min_length=1, max_length=128, pattern=ID_PATTERN)
    run_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=ID_PATTERN)
    tags: list[str] = Field(default_factory=list, max_length=MAX_TAGS)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Kept with the text, returned as given (≤ 8 KiB as JSON).")
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=256)
    wait_s: float = Field(default=0, ge=0, le=120, description="Wait up to this long for extraction to finish before answering.")

    @field_validator("text")
    @classmethod
    def _text_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text is empty or only whitespace; send the text to remember")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        for tag in value:
            if len(tag) > 64:
                raise ValueError("each tag is at most 64 characters")
        return _clean_tags(value)


class RememberResponse(BaseModel):
    id: str
    status: str
    created: bool = Field(description="False when an earlier save with the same idempotency_key was returned.")
    queue_depth: int
    estimated_extraction_s: float | None = Field(
        description="Seconds until this save's facts are extracted: the work queued ahead of it (and its own) at the "
                    "model's speed. Null when no speed is known yet (see estimate_basis).")
    estimate_basis: str | None = Field(
        default=None, description="What the estimate rests on: 'measured', 'bootstrap smoke test', or 'unknown'.")


class FactOut(BaseModel):
    id: str
    text: str
    spans: list[list[int]]
    superseded_by: str | None = None
    created_at: datetime


class MemoryHead(BaseModel):
    """What every view of a saved text shows first."""

    id: str
    status: Literal["queued", "extracting", "done", "failed"]
    agent_id: str
    run_id: str | None
    text: str
    tags: list[str]


class MemoryOut(MemoryHead):
    metadata: dict[str, Any]
    created_at: datetime
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
        default=None, description="While a long text is part-way: chunks done and characters done of the total.")


class RecallRequest(Strict):
    query: str = Field(min_length=1, max_length=4096)
    agent_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=ID_PATTERN)
    scope: Literal["team", "agent"] = "team"
    k: int = Field(default=10, ge=1, le=100)
    kinds: list[Literal["fact", "passage"]] = Field(default_factory=lambda: ["fact", "passage"], min_length=1)
    tags: list[str] = Field(default_factory=list, max_length=MAX_TAGS, description="Items must carry all of these.")
    since: datetime | None = None
    until: datetime | None = None
    min_score: float | None = Field(default=None, ge=-1, le=1, description="Minimum cosine similarity of an item to the query.")

    @field_validator("query")
    @classmethod
    def _query_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query is empty or only whitespace")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        return _clean_tags(value)


class RecallItem(BaseModel):
    kind: Literal["fact", "passage"]
    text: str
    score: float = Field(description="Rank-fusion score of vector and keyword search; higher is better.")
    similarity: float | None = Field(description="Cosine similarity to the query, when the vector search found it.")
    memory_id: str
    source_memory_ids: list[str]
    fact_id: str | None = None
    agent_id: str
    created_at: datetime
    tags: list[str]


class RecallResponse(BaseModel):
    items: list[RecallItem]


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
                    "handled, import; admin: also forget, define limits, manage keys.")
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


class ExportedFact(BaseModel):
    """A fact as `/v1/export` writes it and `/v1/import` reads it."""

    id: str = Field(min_length=1, max_length=256)
    text: str = Field(min_length=1, max_length=4096)
    spans: list[tuple[int, int]] = Field(default_factory=list)
    created_at: float | None = None
    superseded_by: str | None = None
    superseded_at: float | None = None


class ExportedMemory(BaseModel):
    """One line of `/v1/export`: a memory with its facts. Unknown fields are ignored (newer exports)."""

    id: str = Field(min_length=1, max_length=256)
    text: str
    agent_id: str = Field(min_length=1, max_length=128, pattern=ID_PATTERN)
    run_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=ID_PATTERN)
    tags: list[str] = Field(default_factory=list, max_length=MAX_TAGS)
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: float
    status: str = "queued"
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=256)
    facts: list[ExportedFact] = Field(default_factory=list)

    @field_validator("text")
    @classmethod
    def _text_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text is empty or only whitespace")
        return value


class ImportResponse(BaseModel):
    imported: int = Field(description="Lines stored as new memories.")
    skipped: int = Field(description="Lines already imported before (same original id or idempotency key).")
    failed: int
    errors: list[dict[str, Any]] = Field(description="The first 100 bad lines: {line, detail}.")
