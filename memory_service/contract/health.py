"""The health and readiness answers (`/health`, `/ready`) and the counts `/v1/stats` shares with them:
what a load balancer or an operator reads, apart from the memory API's models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class HealthOut(BaseModel):
    status: Literal["ok"]
    version: str = Field(description="The memory-service package version this process runs.")
    uptime_s: float = Field(description="Seconds since this process's app was built.")


class JobCounts(BaseModel):
    queued: int
    extracting: int
    done: int
    failed: int
    deferred: int | None = Field(
        default=None, description="Queued jobs waiting out a model too slow for the budget (every team's only)."
    )


class ThroughputOut(BaseModel):
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    seconds_per_job: float | None
    source: str = Field(description="Where the speeds come from: measured, a prior, or unmeasured.")
    slower_than_budget_since: float | None = Field(
        default=None, description="Epoch seconds since even the smallest piece misses the budget; null: it fits."
    )
    paused_until: float | None = Field(default=None, description="While too slow: no job is tried before this.")


class ModelServerOut(BaseModel):
    url: str
    reachable: bool
    error: str | None
    n_ctx: int | None
    slots: int | None
    build: str | None
    model: str | None = Field(description="The model file's name.")
    throughput: ThroughputOut | None = Field(None, description="This server's measured speed.")


class StorageOut(BaseModel):
    database: str = Field(description="`sqlite` (the data dir's files) or the PostgreSQL URL, password hidden.")
    vectors: str = Field(description="`embedded` (the data dir's Chroma) or the Chroma server's URL.")


class DiskOut(BaseModel):
    """The file system of the data dir (not named: /ready takes no key): a warning state, never a reason for 503 (a balancer that pulls a service
    for a full disk only moves the saves elsewhere less durably; the operator must act)."""

    free_bytes: int
    total_bytes: int
    state: Literal["ok", "low"] = Field(
        description="low: under 1 GiB or under 5% free. Saves fsync the journal, SQLite needs room to "
        "checkpoint its WAL, and a reindex or backup writes a copy of the vectors."
    )


class FailingSubscriptionOut(BaseModel):
    """A subscription whose last attempt failed: its receiver answered an error, too late, or not at all."""

    id: str
    last_error: str | None = Field(description="Why the last attempt failed, e.g. `HTTP 503` or the deadline.")
    last_failure_at: float | None
    pending: int = Field(description="Its events still waiting to be delivered or retried.")


class WebhooksOut(BaseModel):
    """The webhook outbox as /ready shows it (docs/webhooks.md)."""

    subscriptions: int
    pending: int = Field(description="Events waiting to be delivered or retried.")
    delivered: int
    failed: int = Field(description="Events given up on after MEMORY_WEBHOOK_MAX_AGE_S.")
    last_delivery_at: float | None = Field(description="Unix time of the last delivery a receiver acknowledged.")
    last_failure_at: float | None
    failing: list[FailingSubscriptionOut] = Field(
        default_factory=list,
        description="Subscriptions whose last attempt failed (no later delivery), newest failure first, at most "
        "50: the URL and the rest are in GET /v1/webhooks and the console's jobs page.",
    )


class ReadyOut(BaseModel):
    """`/ready`'s body, the same on 200 and 503: the reason is in it."""

    status: Literal["ready", "unavailable"]
    model_server: ModelServerOut = Field(description="The first server that is up (or the first listed).")
    model_servers: list[ModelServerOut] = Field(description="Every server of MEMORY_LLM_URL, in its order.")
    thinking: dict[str, Any] | None = Field(description="Whether the chat template turns thinking off.")
    queue_depth: int | None = Field(
        None,
        description="Jobs queued or extracting: the key's team's, every team's for the metrics token; "
        "absent without a key when keys are configured.",
    )
    jobs: JobCounts | None = Field(None, description="Jobs by status, seen as queue_depth is.")
    throughput: ThroughputOut | None = Field(None, description="The measured model speed; absent without a key.")
    webhooks: WebhooksOut | None = Field(None, description="Webhook deliveries, seen as queue_depth is.")
    extract_budget_s: float
    storage: StorageOut
    version: str = Field(description="The memory-service package version this process runs.")
    uptime_s: float = Field(description="Seconds since this process's app was built.")
    disk: DiskOut
