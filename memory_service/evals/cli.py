"""`memory-service eval`: retrieval and extraction quality on LoCoMo- and PersonaExt-format files.

The eval talks to the service only through its public API, so it measures what
an agent gets. Without --url it starts its own service (default model, temp
data dir, one API key per LoCoMo conversation so each is its own team) and
stops it afterwards. The dataset logic lives in .locomo and .personaext (each
runnable alone: `python -m memory_service.evals.locomo`); this module picks the
right one per file and owns the service's lifecycle.
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

from memory_service.bench import common
from memory_service.evals import locomo, personaext
from memory_service.evals.options import eval_parser


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


def run_eval(args: argparse.Namespace) -> int:
    """Each --data file through its harness; 2 when a file is of neither format."""
    started = time.monotonic()
    settings = service_settings(getattr(args, "settings", None) or [])  # a bad --set fails before any work
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = getattr(args, "model", None) or "default"
    llm_url = getattr(args, "llm_url", None)

    jobs: list[tuple[str, Path, Any]] = []
    for raw in args.data:
        path = Path(raw)
        if locomo.is_locomo(path):
            jobs.append(("locomo", path, locomo.load(path, args.limit)))
        elif personaext.is_personaext(path):
            jobs.append(("personaext", path, personaext.load(path, args.limit or personaext.DEFAULT_LIMIT)))
        else:
            print(
                f"{path}: neither LoCoMo (.json list of conversations) nor PersonaExt (.jsonl triplets)",
                file=sys.stderr,
            )
            return 2

    # own service: a key (= a team) per LoCoMo conversation and one for PersonaExt; else the given key for all
    keys: dict[tuple[str, str], str | None] = {}
    for kind, path, data in jobs:
        labels = [c.sample_id for c in data] if kind == "locomo" else ["all"]
        for label in labels:
            keys[(f"{kind}:{path}", label)] = args.api_key if args.url else f"eval-{secrets.token_hex(12)}"

    service = None
    tmp = None
    url = args.url
    try:
        if not url:
            tmp = tempfile.TemporaryDirectory(prefix="memory-eval-")
            team_keys = {
                key: f"{scope.split(':', 1)[0]}-{label}-{n}"
                for n, ((scope, label), key) in enumerate(keys.items())
                if key
            }
            _progress(f"starting a service (model {model}) in a temp data dir")
            env = dict(settings)
            if getattr(args, "consolidate", False):
                env["MEMORY_CONSOLIDATE"] = "1"
            service = common.ServiceRunner(
                Path(tmp.name) / "data", api_keys=team_keys, llm_url=llm_url, model=model, env=env
            ).start()
            service.wait_model_ready()
            url = service.url
        ready = _ready(url)
        summary: dict[str, Any] = {}
        for kind, path, data in jobs:
            job_started = time.monotonic()
            scope = f"{kind}:{path}"
            if kind == "locomo":
                _progress(
                    f"LoCoMo {path.name}: {len(data)} conversation(s), "
                    f"{sum(len(c.turns) for c in data)} turns, {sum(len(c.questions) for c in data)} questions"
                )
                result = locomo.run(
                    data,
                    url=url,
                    keys={c.sample_id: keys[(scope, c.sample_id)] for c in data},
                    isolation="agent" if args.url else "team",
                )
            else:
                _progress(f"PersonaExt {path.name}: {len(data)} utterance(s)")
                result = personaext.run(data, url=url, key=keys[(scope, "all")])
            result.update(
                {
                    "data": str(path),
                    "limit": args.limit,
                    "model": (ready.get("model_server") or {}).get("model"),
                    "llama_build": (ready.get("model_server") or {}).get("build"),
                    "service": "self-started (temp data dir)" if service else "external (--url)",
                    "service_settings": settings if service else None,
                    "wall_time_s": round(time.monotonic() - job_started, 1),
                    "machine": common.machine_info(),
                }
            )
            stem = f"{kind}-{path.stem}"
            common.write_json(out / f"{stem}.json", result)
            common.save_plot(locomo.plot if kind == "locomo" else personaext.plot, result, out / f"{stem}.png")
            summary[stem] = _headline(kind, result)
            _progress(f"{stem}: {json.dumps(summary[stem])} ({result['wall_time_s']:.0f}s)")
        summary["total_time_s"] = round(time.monotonic() - started, 1)
        common.write_json(out / "summary.json", summary)
        print(json.dumps(summary, indent=2))
        return 0
    finally:
        if service is not None:
            service.stop()
        if tmp is not None:
            tmp.cleanup()


def _ready(url: str) -> dict[str, Any]:
    import httpx

    try:
        return httpx.get(url + "/ready", timeout=30, trust_env=False).json()
    except Exception:  # the eval still runs; the JSON just lacks the model name
        return {}


def _headline(kind: str, result: dict[str, Any]) -> dict[str, Any]:
    if kind == "locomo":
        return {
            name: {m: r["overall"].get(m) for m in ("recall@5", "recall@10", "recall@20", "mrr")}
            for name, r in result["results"].items()
        } | {"goal": result["goal"]}
    return {
        k: result["metrics"].get(k)
        for k in ("tail_found_in_stored_facts", "facts_per_utterance_mean", "stored_over_proposed")
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m memory_service.evals.cli`: the same as `memory-service eval`."""
    return run_eval(eval_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
