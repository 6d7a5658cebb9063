"""`memory-service eval`: retrieval and extraction quality on LoCoMo- and PersonaExt-format files.

The eval talks to the service only through its public API, so it measures what
an agent gets. Without --url it starts its own service (default model, temp
data dir, one API key per LoCoMo conversation so each is its own team) and
stops it afterwards. The dataset logic lives in locomo (with locomo_baseline, and the
data set's reader and metrics in testbed/) and personaext; this module picks the right one per file and owns
the service's lifecycle. `python -m memory_service.evals` runs the same command.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..testbed import locomo_data
from ..testbed.probes import machine_info
from ..testbed.results import save_plot, write_json
from ..testbed.service_runner import ServiceRunner
from . import locomo, personaext
from .budget import BudgetRun
from .options import eval_parser


def _progress(message: str) -> None:
    print(f"[eval] {message}", file=sys.stderr, flush=True)


def service_settings(pairs: list[str]) -> dict[str, str]:
    """`--set MEMORY_NAME=VALUE` pairs as the self-started service's environment."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("MEMORY_"):
            raise SystemExit(f"--set {pair!r}: expected MEMORY_NAME=VALUE (a MEMORY_* setting of the service)")
        env[name] = value
    return env


Job = tuple[str, Path, Any]  # (kind, data file, its parsed data)
Keys = dict[tuple[str, str], str | None]  # (kind:path, conversation or "all") -> API key


def run_eval(args: argparse.Namespace) -> int:
    """Each --data file through its harness; 2 when a file is of neither format. --agent: the agent eval."""
    if getattr(args, "agent", False):
        from .agent_runner import run_agent_eval

        return run_agent_eval(args, service_settings(getattr(args, "settings", None) or []))
    if not args.data:
        print("memory-service eval: --data is required (or --agent for the agent eval)", file=sys.stderr)
        return 2
    started = time.monotonic()
    settings = service_settings(getattr(args, "settings", None) or [])  # a bad --set fails before any work
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = load_jobs(args.data, args.limit)
    if jobs is None:
        return 2
    keys = job_keys(jobs, args.api_key if args.url else None, own_service=not args.url)
    service = None
    tmp = None
    url = args.url
    try:
        if not url:
            tmp = tempfile.TemporaryDirectory(prefix="memory-eval-")
            service = start_service(args, Path(tmp.name) / "data", keys, settings)
            url = service.url
        ready = _ready(url)
        summary: dict[str, Any] = {}
        for kind, path, data in jobs:
            job_started = time.monotonic()
            budget = _budget(args, ready) if kind == "locomo" else None
            result = run_job(kind, path, data, url=url, keys=keys, external=bool(args.url), budget=budget)
            own = service is not None
            result.update(_job_context(args, path, ready, settings if own else None, own, job_started))
            stem = f"{kind}-{path.stem}"
            write_json(out / f"{stem}.json", result)
            save_plot(locomo.plot if kind == "locomo" else personaext.plot, result, out / f"{stem}.png")
            summary[stem] = _headline(kind, result)
            _progress(f"{stem}: {json.dumps(summary[stem])} ({result['wall_time_s']:.0f}s)")
        summary["total_time_s"] = round(time.monotonic() - started, 1)
        write_json(out / "summary.json", summary)
        print(json.dumps(summary, indent=2))
        return 0
    finally:
        if service is not None:
            service.stop()
        if tmp is not None:
            tmp.cleanup()


def load_jobs(data_files: list[str], limit: int | None) -> list[Job] | None:
    """Each file parsed by the harness its format calls for; None (after saying why) when one fits neither."""
    jobs: list[Job] = []
    for raw in data_files:
        path = Path(raw)
        if locomo_data.is_locomo(path):
            jobs.append(("locomo", path, locomo_data.load(path, limit)))
        elif personaext.is_personaext(path):
            jobs.append(("personaext", path, personaext.load(path, limit or personaext.DEFAULT_LIMIT)))
        else:
            print(
                f"{path}: neither LoCoMo (.json list of conversations) nor PersonaExt (.jsonl triplets)",
                file=sys.stderr,
            )
            return None
    return jobs


def job_keys(jobs: list[Job], given_key: str | None, *, own_service: bool) -> Keys:
    """Own service: a key (= a team) per LoCoMo conversation and one for PersonaExt; else the given key for all."""
    keys: Keys = {}
    for kind, path, data in jobs:
        labels = [c.sample_id for c in data] if kind == "locomo" else ["all"]
        for label in labels:
            keys[(f"{kind}:{path}", label)] = f"eval-{secrets.token_hex(12)}" if own_service else given_key
    return keys


def start_service(args: argparse.Namespace, data_dir: Path, keys: Keys, settings: dict[str, str]) -> ServiceRunner:
    """The eval's own service: one team per key, the --set settings, consolidation when asked."""
    model = getattr(args, "model", None) or "default"
    team_keys = {
        key: f"{scope.split(':', 1)[0]}-{label}-{n}" for n, ((scope, label), key) in enumerate(keys.items()) if key
    }
    _progress(f"starting a service (model {model}) in a temp data dir")
    env = dict(settings)
    if getattr(args, "consolidate", False):
        env["MEMORY_CONSOLIDATE"] = "1"
    service = ServiceRunner(
        data_dir, api_keys=team_keys, llm_url=getattr(args, "llm_url", None), model=model, env=env
    ).start()
    service.wait_model_ready()
    return service


def _budget(args: argparse.Namespace, ready: dict[str, Any]) -> BudgetRun:
    """Budgeted recall (the service's tokenizer) and the reader, from the options (evals/reader.py)."""
    from .reader import setup

    return setup(args, ready, _progress)


def run_job(
    kind: str, path: Path, data: Any, *, url: str, keys: Keys, external: bool, budget: BudgetRun | None = None
) -> dict[str, Any]:
    """One data file through its harness."""
    scope = f"{kind}:{path}"
    if kind == "locomo":
        _progress(
            f"LoCoMo {path.name}: {len(data)} conversation(s), "
            f"{sum(len(c.turns) for c in data)} turns, {sum(len(c.questions) for c in data)} questions"
        )
        return locomo.run(
            data,
            url=url,
            keys={c.sample_id: keys[(scope, c.sample_id)] for c in data},
            isolation="agent" if external else "team",
            budget=budget,
        )
    _progress(f"PersonaExt {path.name}: {len(data)} utterance(s)")
    return personaext.run(data, url=url, key=keys[(scope, "all")])


def _job_context(
    args: argparse.Namespace,
    path: Path,
    ready: dict[str, Any],
    settings: dict[str, str] | None,
    own_service: bool,
    started: float,
) -> dict[str, Any]:
    """What a job's result is read with: the data, the model, the service and the machine."""
    return {
        "data": str(path),
        "limit": args.limit,
        "model": (ready.get("model_server") or {}).get("model"),
        "llama_build": (ready.get("model_server") or {}).get("build"),
        "service": "self-started (temp data dir)" if own_service else "external (--url)",
        "service_settings": settings,
        "wall_time_s": round(time.monotonic() - started, 1),
        "machine": machine_info(),
    }


def _ready(url: str) -> dict[str, Any]:
    import httpx

    try:
        return httpx.get(url + "/ready", timeout=30, trust_env=False).json()
    except Exception:  # the eval still runs; the JSON just lacks the model name
        return {}


def _headline(kind: str, result: dict[str, Any]) -> dict[str, Any]:
    if kind == "locomo":
        shown = ("recall@5", "recall@10", "recall@20", "mrr", "recall@256tok", "recall@512tok", "recall@1024tok")
        answers = {
            mode: (a.get("overall") or {}).get("f1")
            for mode, a in (result.get("answers") or {}).items()
            if isinstance(a, dict)
        }
        return {
            name: {m: r["overall"].get(m) for m in shown if m in r["overall"]} for name, r in result["results"].items()
        } | {"goal": result["goal"], "reader_f1": answers or None}
    return {
        k: result["metrics"].get(k)
        for k in ("tail_found_in_stored_facts", "facts_per_utterance_mean", "stored_over_proposed")
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m memory_service.evals.cli`: the same as `memory-service eval`."""
    return run_eval(eval_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
