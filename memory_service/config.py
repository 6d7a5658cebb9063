"""Settings from MEMORY_* environment variables (and CLI flags that override them).

One frozen object built once at start-up and passed down explicitly; nothing
reads the environment after that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping


class ConfigError(ValueError):
    """A MEMORY_* variable has a value the service cannot use."""


def _default_threads() -> int:
    # ggml workers spin-wait: leave one core to the API, the embedder and the OS.
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8700
    data_dir: Path = Path("./memory-data")
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "memory-service")
    # An already running llama-server; when unset, serve starts its own.
    llm_url: str | None = None
    model: str = "default"
    llama_bin: str | None = None
    llama_threads: int = field(default_factory=_default_threads)
    llama_ctx: int = 4096
    llama_chat_template_file: str | None = None
    api_keys: Mapping[str, str] = field(default_factory=dict)  # key -> team
    extract_budget_s: float = 20.0
    max_output_tokens: int = 384
    max_attempts: int = 4
    retry_base_s: float = 2.0
    max_text_bytes: int = 64 * 1024
    max_facts: int = 12
    max_fact_chars: int = 300
    dedup_threshold: float = 0.92
    embed_threads: int = 1
    embedder: str = "onnx"
    chroma_url: str | None = None
    skip_small_talk: bool = True
    # (prompt, generation) tokens/s measured by the bootstrap's smoke test of the llama-server that `serve`
    # started: the first estimates before any extraction is measured. Never from the environment.
    llm_speed_prior: tuple[float, float] | None = None

    LOCAL_TEAM = "local"

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)

    def with_overrides(self, **changes: object) -> "Settings":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        base = cls()
        values: dict[str, object] = {}

        def text(name: str, attr: str) -> None:
            if env.get(name):
                values[attr] = env[name]

        def number(name: str, attr: str, kind: type, low: float, high: float) -> None:
            raw = env.get(name)
            if not raw:
                return
            try:
                value = kind(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a {kind.__name__}") from None
            if not low <= value <= high:
                raise ConfigError(f"{name}={raw!r} must be between {low} and {high}")
            values[attr] = value

        text("MEMORY_HOST", "host")
        number("MEMORY_PORT", "port", int, 1, 65535)
        if env.get("MEMORY_DATA_DIR"):
            values["data_dir"] = Path(env["MEMORY_DATA_DIR"]).expanduser()
        if env.get("MEMORY_CACHE_DIR"):
            values["cache_dir"] = Path(env["MEMORY_CACHE_DIR"]).expanduser()
        text("MEMORY_LLM_URL", "llm_url")
        text("MEMORY_MODEL", "model")
        text("MEMORY_LLAMA_BIN", "llama_bin")
        text("MEMORY_CHAT_TEMPLATE_FILE", "llama_chat_template_file")
        number("MEMORY_LLAMA_THREADS", "llama_threads", int, 1, 256)
        number("MEMORY_LLAMA_CTX", "llama_ctx", int, 512, 1 << 20)
        number("MEMORY_EXTRACT_BUDGET_S", "extract_budget_s", float, 0.5, 3600)
        number("MEMORY_MAX_OUTPUT_TOKENS", "max_output_tokens", int, 16, 8192)
        number("MEMORY_MAX_ATTEMPTS", "max_attempts", int, 1, 100)
        number("MEMORY_RETRY_BASE_S", "retry_base_s", float, 0.0, 3600)
        number("MEMORY_MAX_TEXT_BYTES", "max_text_bytes", int, 1, 16 * 1024 * 1024)
        number("MEMORY_DEDUP_THRESHOLD", "dedup_threshold", float, 0.5, 1.0)
        number("MEMORY_EMBED_THREADS", "embed_threads", int, 1, 64)
        text("MEMORY_CHROMA_URL", "chroma_url")
        if env.get("MEMORY_EMBEDDER"):
            if env["MEMORY_EMBEDDER"] not in ("onnx", "torch"):
                raise ConfigError(f"MEMORY_EMBEDDER={env['MEMORY_EMBEDDER']!r} must be 'onnx' or 'torch'")
            values["embedder"] = env["MEMORY_EMBEDDER"]
        if env.get("MEMORY_SKIP_SMALL_TALK"):
            flag = env["MEMORY_SKIP_SMALL_TALK"].strip().lower()
            if flag not in ("0", "1", "true", "false", "yes", "no"):
                raise ConfigError(f"MEMORY_SKIP_SMALL_TALK={env['MEMORY_SKIP_SMALL_TALK']!r} must be 1 or 0")
            values["skip_small_talk"] = flag in ("1", "true", "yes")
        if env.get("MEMORY_API_KEYS"):
            values["api_keys"] = parse_api_keys(env["MEMORY_API_KEYS"])
        return replace(base, **values)


def parse_api_keys(raw: str) -> dict[str, str]:
    """`key:team,key:team` -> {key: team}."""
    keys: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, team = entry.partition(":")
        if not sep or not key.strip() or not team.strip():
            raise ConfigError(f"MEMORY_API_KEYS entry {entry!r} must look like 'key:team'")
        if key.strip() in keys:
            raise ConfigError(f"MEMORY_API_KEYS lists the key for team {team!r} twice")
        keys[key.strip()] = team.strip()
    return keys


def is_loopback(host: str) -> bool:
    return host in {"localhost", "::1"} or host.startswith("127.")
