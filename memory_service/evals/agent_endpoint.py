"""The agent's model endpoint: --agent-url as given, or a llama-server of its own with the right chat template.

A model file's chat template can teach a tool-call format no parser reads. Qwen2.5-Coder-1.5B-Instruct's GGUF
template shows the call as `{{"name": …, "arguments": …}}`: the braces are doubled inside a Jinja string
literal, where they are no escape, so the model is told to write doubled braces (a known Qwen2.5 GGUF template
bug; the 0.5B's file has single braces). The harness must not grade a model on its file's typo, so a template
known to be broken is replaced by a corrected copy shipped in `templates/` (derived from the model's own, the
one defect fixed), keyed by the sha256 of the broken text: any other template, even a near copy, is used as is.
Which template ran is logged and kept in the result JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

TEMPLATES_DIR = Path(__file__).parent / "templates"
# sha256 of a model file's template known to be broken -> the corrected file in TEMPLATES_DIR
CORRECTED_TEMPLATES: dict[str, str] = {
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (`large`): `{{\"name\": …}}` in the tool instructions
    "4e9918361c284a93880606d182d64da6a9fe97cdc1f5c5a78c1c8840444246fc": "qwen2.5-tool-call-single-braces.jinja",
}
AGENT_CTX = 8192


def _progress(message: str) -> None:
    print(f"[eval --agent] {message}", file=sys.stderr, flush=True)


def template_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def corrected_template(text: str) -> Path | None:
    """The shipped corrected template for this exact template text, or None (the model's own is fine)."""
    name = CORRECTED_TEMPLATES.get(template_sha256(text))
    return TEMPLATES_DIR / name if name else None


def served_template(url: str) -> str | None:
    """The chat template a llama-server applies (GET /props); None from an endpoint that does not say."""
    try:
        response = httpx.get(url.rstrip("/") + "/props", timeout=30, trust_env=False)
        template = response.json().get("chat_template") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return template if isinstance(template, str) and template else None


@dataclass
class AgentEndpoint:
    """Where the agent model answers, and what the result JSON says about it."""

    url: str
    template: dict[str, Any]  # used, sha256 of the model's own, the corrected file if any
    threads: int | None  # the agent llama-server's threads (None: an endpoint we did not start)


def template_record(own: str | None, corrected: Path | None, started_here: bool) -> dict[str, Any]:
    sha = template_sha256(own) if own else None
    if corrected is not None and started_here:
        used = corrected.name
    elif own is None:
        used = "unknown (the endpoint has no /props)"
    else:
        used = "model's own" if started_here else "endpoint's own"
    record: dict[str, Any] = {"used": used, "model_template_sha256": sha}
    if corrected is not None:
        record["known_broken"] = True
        record["corrected_file"] = str(corrected)
    return record


@contextlib.contextmanager
def agent_endpoint(args: argparse.Namespace) -> Iterator[AgentEndpoint]:
    """--agent-url (its template only read and reported), else a llama-server of --agent-model on
    --agent-threads (default: every core) with --jinja, restarted on the corrected template when its own is
    known broken."""
    if args.agent_url:
        own = served_template(args.agent_url)
        fix = corrected_template(own) if own else None
        if fix is not None:
            _progress(f"the endpoint's chat template is known broken: start it with --chat-template-file {fix}")
        yield AgentEndpoint(args.agent_url, template_record(own, fix, started_here=False), None)
        return
    from ..config import Settings
    from ..llm.runtime.gguf import resolve_model
    from ..llm.runtime.server import LlamaServerProcess

    settings = Settings.from_env()
    threads = args.agent_threads or os.cpu_count() or 1
    log_dir = Path(tempfile.mkdtemp(prefix="agent-eval-llama-"))
    model = resolve_model(args.agent_model, settings.cache_dir)

    def start(template: Path | None) -> LlamaServerProcess:
        return LlamaServerProcess.from_settings(
            settings,
            model,
            log_dir / "agent-llama.log",
            threads=threads,
            ctx=AGENT_CTX,
            chat_template_file=str(template) if template else None,
            nice=0,  # the agent is what is measured; the service's extraction model keeps its MEMORY_LLAMA_NICE
        ).start(wait_s=300)

    _progress(f"starting llama-server for the agent model {args.agent_model!r} on {threads} thread(s) ({log_dir})")
    llama = start(None)
    try:
        own = served_template(llama.url)
        fix = corrected_template(own) if own else None
        if fix is not None:
            llama.stop()
            llama = start(fix)
        record = template_record(own, fix, started_here=True)
        _progress(
            f"agent chat template: {record['used']} (model's own sha256 {str(record['model_template_sha256'])[:12]})"
        )
        yield AgentEndpoint(llama.url, record, threads)
    finally:
        llama.stop()
