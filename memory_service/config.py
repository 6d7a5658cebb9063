"""Every MEMORY_* environment variable is read here, and only here (and CLI flags override them).

The service's: `Settings`, one frozen object built once at start-up and passed down explicitly.
pydantic-settings does the reading and the bounds; `from_env` turns its errors into one line per
variable that says what was wrong and what is allowed. The command line's and the MCP server's way to
a running service: `ClientEnv`. What entry points need before (or without) the settings: `early_log_level`,
`llama_build_variant` (the bootstrap's build) and `worker_speed_prior` (`serve`'s handoff to its workers).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class ConfigError(ValueError):
    """A MEMORY_* variable has a value the service cannot use."""


def _default_threads() -> int:
    # ggml workers spin-wait: leave one core to the API, the embedder and the OS.
    return max(1, (os.cpu_count() or 2) - 1)


def _default_blocking_threads() -> int:
    # what asyncio's default executor took before the service sized its own: the same behaviour by default
    return min(32, (os.cpu_count() or 1) + 4)


DEFAULT_CACHE_DIR = Path.home() / ".cache" / "memory-service"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MEMORY_", frozen=True, extra="ignore", env_ignore_empty=True, populate_by_name=True
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8700, ge=1, le=65535)
    data_dir: Path = Path("./memory-data")
    cache_dir: Path = DEFAULT_CACHE_DIR
    # Already running llama-server(s), comma-separated: a pool, one extraction worker per slot per server.
    # When unset, serve starts its own.
    llm_url: str | None = None
    model: str = "default"
    llama_bin: str | None = None
    llama_threads: int = Field(default_factory=_default_threads, ge=1, le=256)
    # the started llama-server's OS niceness, added to the service's: its work can wait, a save's ack and a
    # recall cannot, so on a small machine they take the CPU first (see llm_runtime/server.py). 0: same priority
    llama_nice: int = Field(default=10, ge=0, le=19)
    llama_ctx: int = Field(default=4096, ge=512, le=1 << 20)
    llama_chat_template_file: str | None = Field(
        default=None, validation_alias=AliasChoices("MEMORY_CHAT_TEMPLATE_FILE", "llama_chat_template_file")
    )
    api_keys: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)  # key -> team
    # host names a keyless service answers to besides 127.0.0.1, localhost and [::1] (a reverse proxy's name):
    # any other Host is refused, so a web page cannot reach the service through DNS rebinding
    trusted_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    # a bearer token that may read /metrics (a Prometheus scrape) when keys are configured; admin keys may too
    metrics_token: str | None = None
    extract_budget_s: float = Field(default=20.0, ge=0.5, le=3600)
    max_output_tokens: int = Field(default=384, ge=16, le=8192)
    max_attempts: int = Field(default=4, ge=1, le=100)
    retry_base_s: float = Field(default=2.0, ge=0.0, le=3600)
    # a machine busy with something else can leave even the smallest piece of a text unable to finish within
    # the budget: the job then waits (no attempt spent) this long, doubling each time up to the max, and
    # resumes sooner once a call fits its window again; slower than the budget for `slow_give_up_s` is no
    # busy moment but a model too slow for it: its timeouts spend attempts again (0: never wait)
    slow_pause_s: float = Field(default=60.0, ge=0.05, le=86400)
    slow_pause_max_s: float = Field(default=4 * 3600.0, ge=0.05, le=7 * 86400)
    slow_give_up_s: float = Field(default=86400.0, ge=0, le=30 * 86400)
    max_text_bytes: int = Field(default=64 * 1024, ge=1, le=16 * 1024 * 1024)
    # a client must finish its request headers this long after starting them, and may not stall a body longer
    # than this between bytes: a slow or stuck client cannot hold a connection for ever (slowloris)
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    body_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    # a response whose waiting bytes the client reads none of for this long is dropped with its memory, and at
    # most this many connections are open (in all; from one address, 0: no such cap): a slow reader pins little
    write_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    max_connections: int = Field(default=512, ge=1, le=65536)
    max_connections_per_client: int = Field(default=0, ge=0, le=65536)
    # the extraction schema's bounds (maxItems, maxLength), which llama-server's grammar enforces per reply: the
    # model cannot run on past them, and a text split into pieces gets max_facts per piece
    max_facts: int = 12
    max_fact_chars: int = 300
    dedup_threshold: float = Field(default=0.92, ge=0.5, le=1.0)
    embed_threads: int = Field(default=1, ge=1, le=64)
    embedder: Literal["onnx-q8", "onnx", "torch"] = "onnx-q8"
    # the embedding model (embedding/models.py); unset: the one the data dir's vectors were made with, and
    # for a new data dir the default (minilm), so a changed default never mixes an old dir's vectors
    embedder_model: Literal["minilm", "paraphrase-minilm-l3"] | None = None
    chroma_url: str | None = None
    # the embedded store runs in a child process: its calls hold Python's lock for their whole length, and
    # in the API process every request waited behind them (see storage/chroma_process.py). 0 runs it in-process
    chroma_process: bool = True
    # how long a call to that child may take (plus an allowance per row) before the child counts as hung and is
    # replaced: chromadb hung after the disk filled up, and every vector call queued behind it
    # (a Chroma server's calls: the total deadline of each, plus an allowance for the bytes it uploads)
    vector_call_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # the most bytes a Chroma server's answer may hold: past it the call fails, so a broken server cannot fill memory
    chroma_max_reply_bytes: int = Field(default=256 << 20, ge=1 << 20, le=1 << 34)
    # recall's relevance floor: items less similar to the query than this (cosine) are left out, so an unrelated
    # question is not answered with k items of noise (recall/floor.py; a request's min_score replaces it). -1: off
    recall_floor: float = Field(default=0.25, ge=-1, le=1)
    # the most bytes one llama-server reply may hold (a streamed one: at least 2 KiB per output token; a tokenize
    # of the largest text always fits): beyond it the reply is refused, so a broken server cannot fill memory
    llm_max_reply_bytes: int = Field(default=8 << 20, ge=64 << 10, le=1 << 30)
    # how long a recall with max_tokens waits for llama-server's /tokenize before counting by the estimate
    recall_tokenize_timeout_s: float = Field(default=0.2, gt=0, le=10)
    # threads for the requests' blocking store work (SQLite, PostgreSQL, Chroma calls): one pool, Services'
    blocking_threads: int = Field(default_factory=_default_blocking_threads, ge=1, le=256)
    # threads for recall's keyword leg, which runs beside the query's embedding (one per recall in flight)
    recall_threads: int = Field(default=4, ge=1, le=256)
    # postgresql://user@host/db: the journal, jobs, limits, handled ledger and keys live there instead of
    # the data dir's SQLite files, so several API processes can share them (see "Outgrowing one machine")
    database_url: str | None = None
    # the longest one statement may run there (lock waits included): PostgreSQL ends it, and a server too stuck to
    # do so is cut off 10 s later by the service, so a stuck database holds a thread for a bounded time. 0: none
    database_statement_timeout_s: float = Field(default=300.0, ge=0, le=86400)
    # how long a worker holds a job without renewing (it renews every third of this while the job runs): a job
    # held by a process that died goes to another worker after at most this long
    job_lease_s: float = Field(default=60.0, ge=1.0, le=3600)
    # webhooks (docs/webhooks.md): a subscription's URL may point at a loopback, private, link-local or reserved
    # address only when this is on; each POST's timeout; the retries' back-off (doubling from base up to max,
    # with jitter); and the age after which an undelivered event is marked failed
    webhook_allow_private: bool = False
    webhook_timeout_s: float = Field(default=5.0, gt=0, le=60)
    webhook_retry_base_s: float = Field(default=5.0, ge=0.01, le=3600)
    webhook_retry_max_s: float = Field(default=600.0, ge=0.01, le=86400)
    webhook_max_age_s: float = Field(default=86400.0, ge=1, le=30 * 86400)
    skip_small_talk: bool = True
    # while no save waits, group each team's recent facts by subject and write one consolidated item per
    # group (recall kind "consolidated"); yields to any save at once
    consolidate: bool = False
    # after grounding, what a small model leaves out is put back in code: a chat line's "I" and "my" in its
    # facts become the speaker's name, each statement of the text that no fact covers becomes a fact, and a
    # reply to the question the save before it ended on becomes a fact with that question
    # (extraction/coverage.py); 0 keeps only what the model wrote
    extract_complete: bool = True
    # earlier saves of the same run (or agent) shown to the model as past turns, so "it", "that" and
    # "yes" resolve: 1 to `saves` of them, each cut to its last `chars` characters. Off (0) by default:
    # with the default 0.5B model it made facts worse on the dev conversations (see the README)
    extract_context_saves: int = Field(default=0, ge=0, le=16)
    extract_context_chars: int = Field(default=320, ge=0, le=4000)
    extract_context_window_s: float = Field(default=1800.0, ge=0)
    # `serve`'s log lines: text for a terminal, json (one object a line, with the request id) for a pipeline
    log_format: Literal["text", "json"] = "text"
    # one log line per HTTP request (method, path, status, duration, request id); off keeps hot paths lean
    access_log: bool = False
    # the lowest level logged: DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)
    log_level: str = "INFO"
    # the calendar of saves that give no `occurred_at` offset: "yesterday" counts back from this zone's day
    timezone: str = "UTC"

    LOCAL_TEAM: ClassVar[str] = "local"

    @field_validator("api_keys", mode="before")
    @classmethod
    def _parse_api_keys(cls, value: Any) -> Any:
        return parse_api_keys(value) if isinstance(value, str) else value

    @field_validator("trusted_hosts", mode="before")
    @classmethod
    def _parse_trusted_hosts(cls, value: Any) -> Any:
        return parse_trusted_hosts(value) if isinstance(value, str) else value

    @field_validator("llm_url")
    @classmethod
    def _check_llm_urls(cls, value: str | None) -> str | None:
        return None if value is None else ",".join(parse_llm_urls(value))

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}: use an IANA name such as UTC or Europe/Madrid") from None
        return value

    @field_validator("chroma_url")
    @classmethod
    def _chroma_server_url(cls, value: str | None) -> str | None:
        from urllib.parse import urlparse

        if value is None:
            return None
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/"):
            raise ValueError("must be a Chroma server's base URL such as http://127.0.0.1:8000")
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if not isinstance(logging.getLevelName(value.upper()), int):
            raise ValueError("must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return value.upper()

    @field_validator("data_dir", "cache_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @property
    def llm_urls(self) -> list[str]:
        """The llama-servers to extract with, in the order given (empty: `serve` starts its own)."""
        return self.llm_url.split(",") if self.llm_url else []

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)

    def with_overrides(self, **changes: object) -> Settings:
        """A copy with the given values (None means "not given"), validated like the environment."""
        given = {k: v for k, v in changes.items() if v is not None}
        try:
            return type(self).model_validate({**self.model_dump(), **given})
        except ValidationError as exc:
            raise ConfigError(_explain(exc)) from None

    @classmethod
    def from_env(cls) -> Settings:
        try:
            return cls()
        except ValidationError as exc:
            raise ConfigError(_explain(exc)) from None


DEFAULT_URL = "http://127.0.0.1:8700"


@dataclass(frozen=True)
class ClientEnv:
    """How the command line and the MCP server reach a running service, from the environment (flags
    override it): MEMORY_URL, MEMORY_API_KEY, MEMORY_AGENT_ID, MEMORY_MCP_READ_ONLY, MEMORY_MCP_TOOLS, and who
    may use the MCP server over HTTP: MEMORY_MCP_TOKEN, MEMORY_TRUSTED_HOSTS."""

    url: str | None = None  # as given; `service_url` falls back to the local default
    api_key: str | None = None
    agent_id: str = "agent"
    mcp_read_only: bool = False
    mcp_tools: str = "core"  # the MCP server's profile, checked by `memory-service mcp` (core or full)
    mcp_token: str | None = None  # the bearer the MCP server over HTTP wants (MEMORY_MCP_TOKEN)
    trusted_hosts: str = ""  # MEMORY_TRUSTED_HOSTS as given: checked by `mcp_trusted_hosts`, when it is used

    @classmethod
    def from_env(cls) -> ClientEnv:
        return cls(
            url=os.environ.get("MEMORY_URL"),
            api_key=os.environ.get("MEMORY_API_KEY"),
            agent_id=os.environ.get("MEMORY_AGENT_ID", "agent"),
            mcp_read_only=os.environ.get("MEMORY_MCP_READ_ONLY", "").lower() in ("1", "true", "yes"),
            mcp_tools=os.environ.get("MEMORY_MCP_TOOLS", "core"),
            mcp_token=os.environ.get("MEMORY_MCP_TOKEN") or None,
            trusted_hosts=os.environ.get("MEMORY_TRUSTED_HOSTS", ""),
        )

    @property
    def mcp_trusted_hosts(self) -> tuple[str, ...]:
        """The Host names the MCP server over HTTP without a token answers besides loopback's."""
        try:
            return parse_trusted_hosts(self.trusted_hosts)
        except ValueError as exc:
            raise ConfigError(f"MEMORY_TRUSTED_HOSTS: {exc}") from None

    @property
    def service_url(self) -> str:
        return self.url or DEFAULT_URL


def early_log_level() -> str:
    """MEMORY_LOG_LEVEL for the command line's first log set-up, before the settings are built (a bad
    variable elsewhere must not stop `--help`); `Settings.log_level` is the checked value."""
    return os.environ.get("MEMORY_LOG_LEVEL", "INFO")


def llama_build_variant() -> str:
    """MEMORY_LLAMA_BUILD: which llama-server build the bootstrap proves (auto: the best this CPU runs)."""
    return os.environ.get("MEMORY_LLAMA_BUILD", "auto")


# not a setting: how `serve --workers N` hands the model's measured speed down to its worker processes
WORKER_SPEED_PRIOR = "MEMORY_WORKER_SPEED_PRIOR"


def worker_speed_prior() -> tuple[float, float] | None:
    """The (prompt, generation) tokens/s `serve` measured, in a worker process (None if not handed down)."""
    raw = os.environ.get(WORKER_SPEED_PRIOR)
    if not raw:
        return None
    prompt, generation = json.loads(raw)
    return float(prompt), float(generation)


def speed_prior_variable(speed_prior: tuple[float, float]) -> dict[str, str]:
    """The variable `worker_speed_prior` reads, for a worker's environment."""
    return {WORKER_SPEED_PRIOR: json.dumps(list(speed_prior))}


_SECRET_FIELDS = frozenset({"api_keys", "metrics_token"})  # never echoed: the value holds keys


def _explain(exc: ValidationError) -> str:
    """One line per bad variable: its name, the value given, and what is allowed."""
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else "?"
        name = "MEMORY_CHAT_TEMPLATE_FILE" if field == "llama_chat_template_file" else f"MEMORY_{field.upper()}"
        message = error["msg"].removeprefix("Value error, ")
        shown = "<hidden>" if field in _SECRET_FIELDS else repr(error.get("input"))
        lines.append(f"{name}={shown}: {message}")
    return "; ".join(lines)


def parse_api_keys(raw: str) -> dict[str, str]:
    """`key:team,key:team` -> {key: team}. An error names the entry by its number, never its text: the
    message reaches logs and terminals, and the entry (or its neighbours) may be a valid key."""
    keys: dict[str, str] = {}
    for number, entry in enumerate(filter(None, (part.strip() for part in raw.split(","))), 1):
        key, sep, team = entry.partition(":")
        if not sep:
            raise ValueError(f"entry {number} has no ':' (each entry must look like 'key:team')")
        if not key.strip() or not team.strip():
            raise ValueError(f"entry {number} has an empty {'key' if not key.strip() else 'team'} (want 'key:team')")
        if key.strip() in keys:
            raise ValueError(f"entry {number} repeats the key of an earlier entry")
        keys[key.strip()] = team.strip()
    return keys


def parse_trusted_hosts(raw: str) -> tuple[str, ...]:
    """`proxy.example,memory.lan` -> host names (lower case, no port) a keyless service answers to."""
    hosts: list[str] = []
    for number, entry in enumerate(filter(None, (part.strip().lower() for part in raw.split(","))), 1):
        if not re.fullmatch(r"\[[0-9a-f:.]+\]|[a-z0-9_-]+(\.[a-z0-9_-]+)*", entry):
            raise ValueError(f"entry {number} must be a bare host name such as proxy.example (no scheme, port or path)")
        hosts.append(entry)
    return tuple(hosts)


def parse_llm_urls(raw: str) -> list[str]:
    """`http://a:8080,http://b:8080` -> each URL checked and without its trailing slash.

    Checked here, at start-up, so a typo is a clear configuration error instead of a server
    that is never reachable.
    """
    urls: list[str] = []
    for entry in filter(None, (part.strip() for part in raw.split(","))):
        parts = urlsplit(entry)
        try:
            port_ok = parts.port is None or parts.port > 0
        except ValueError:
            port_ok = False
        if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or parts.query or parts.fragment:
            raise ValueError(f"entry {entry!r} must look like http://host:port (or https://)")
        url = entry.rstrip("/")
        if url in urls:
            raise ValueError(f"{url!r} is listed twice")
        urls.append(url)
    if not urls:
        raise ValueError("no URL given: list one or more llama-servers, comma-separated")
    return urls


def is_loopback(host: str) -> bool:
    return host in {"localhost", "::1"} or host.startswith("127.")
