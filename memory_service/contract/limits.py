"""The daily-limit and handled-ledger routes' bodies and answers, as the wire shows them.

The server validates requests with these models and documents its answers with them; the client reads
answers with them. Nothing here imports the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from .limit_rules import MAX_DAILY_LIMIT, MAX_TTL_DAYS
from .types import AgentId, HandledKey, IdempotencyKey, JsonInt, Timezone, whole_float_as_int

TtlDays = Annotated[int, Field(strict=True, ge=1, le=MAX_TTL_DAYS), BeforeValidator(whole_float_as_int)]

# A recall query's distinct content words that steer its keyword search and weigh its hits: the most
# informative (ids and numbers first, then the longest). Each costs an index look-up; a 1,000-word query
# cost ~35x a short one before this bound.
MAX_QUERY_WORDS = 32


class LimitSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    daily_limit: JsonInt = Field(
        ge=0, le=MAX_DAILY_LIMIT, description=f"Units allowed per local day, 0-{MAX_DAILY_LIMIT}"
    )
    timezone: Timezone = Field(description="IANA timezone whose calendar day the limit counts (DST aware)")
    per: Literal["team", "agent"] = Field(
        default="team", description="'team': one counter for the team; 'agent': one counter per agent_id"
    )


class ConsumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: AgentId
    amount: JsonInt = Field(default=1, ge=1, le=MAX_DAILY_LIMIT, description=f"1-{MAX_DAILY_LIMIT}")
    idempotency_key: IdempotencyKey | None = Field(
        default=None, description="Repeats on the same local day replay the first allowed answer"
    )


class HandledRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: HandledKey
    agent_id: AgentId | None = Field(default=None, description="Per-agent ledger; omit for the team-wide one")
    ttl_days: TtlDays | None = Field(
        default=None,
        description=f"Forget the key this many days after it was first seen (1-{MAX_TTL_DAYS}); omit = forever",
    )


class ConsumeAnswer(BaseModel):
    allowed: bool
    used: int = Field(description="Units used today in this counter, after this request")
    limit: int
    remaining: int
    resets_at: str = Field(description="Next local midnight, ISO-8601 with offset")


class LimitOut(BaseModel):
    name: str
    daily_limit: int
    timezone: str
    per: Literal["team", "agent"]
    created_at: str
    updated_at: str
    day: str = Field(description="Today's local date (YYYY-MM-DD)")
    resets_at: str
    agent_id: str | None = Field(description="Whose counter `used` is; null = team counter or all agents")
    used: int = Field(description="per=agent without agent_id: the sum over all agents")
    remaining: int | None = Field(description="null when `used` sums several agents")
    agents: list[dict[str, object]] | None = Field(
        default=None, description="per=agent without agent_id: today's counters, busiest first (max 1000)"
    )
    history: list[dict[str, object]] | None = Field(default=None, description="With ?days=N: oldest first, today last")


# The ledger's own record is the response: one definition of its fields, used by the store too. A lookup
# (GET) is never a first time, so it answers first_time=false. `by`, `tool` and `result` are the gate's (who
# finished it, with which tool, its short result); null for a key marked through POST /v1/handled.
@dataclass(frozen=True)
class HandledRecord:
    key: str
    agent_id: str | None
    first_time: bool
    first_seen_at: str
    last_seen_at: str
    seen_count: int
    expires_at: str | None
    by: str | None = None
    tool: str | None = None
    result: str | None = None


HandledOut = HandledRecord
