"""`memory-service eval`: retrieval and extraction quality on LoCoMo- and PersonaExt-format files.

The eval talks to the service only through its public API, so it measures what
an agent gets. Without --url it starts its own service (default model, temp
data dir, one API key per LoCoMo conversation so each is its own team) and
stops it afterwards. The dataset logic lives in scripts/eval_locomo.py and
scripts/eval_personaext.py (each runnable alone); this module picks the right
one per file and owns the service's lifecycle.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def _scripts():  # type: ignore[no-untyped-def]
    """The eval modules from the source tree's scripts/ (they are not part of the installed package)."""
    if not (REPO_ROOT / "scripts" / "eval_locomo.py").exists():
        raise SystemExit("memory-service eval needs the source tree (scripts/eval_*.py): run it from a checkout")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from scripts import bench_common, eval_locomo, eval_personaext

    return bench_common, eval_locomo, eval_personaext


def eval_parser(description: str = "memory-service eval") -> argparse.ArgumentParser:
    """The same options as `memory-service eval`, for the standalone scripts."""
    return add_eval_arguments(argparse.ArgumentParser(description=description))


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--data", required=True, action="append", help="a LoCoMo .json or PersonaExt .jsonl file")
    parser.add_argument("--out", default="eval-results")
    parser.add_argument("--url", default=os.environ.get("MEMORY_URL"), help="evaluate a running service")
    parser.add_argument("--api-key", default=os.environ.get("MEMORY_API_KEY"))
    parser.add_argument("--limit", type=int, default=None, help="only the first N conversations / utterances")
    parser.add_argument("--model", default="default", help="model of the self-started service")
    parser.add_argument("--llm-url", default=None, help="self-started service: reuse this llama-server")
    return parser


def _progress(message: str) -> None:
    print(f"[eval] {message}", file=sys.stderr, flush=True)


def run_eval(args: argparse.Namespace) -> int:
    bench_common, eval_locomo, eval_personaext = _scripts()
    started = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = getattr(args, "model", None) or "default"
    llm_url = getattr(args, "llm_url", None)

    jobs: list[tuple[str, Path, Any]] = []
    for raw in args.data:
        path = Path(raw)
        if eval_locomo.is_locomo(path):
            jobs.append(("locomo", path, eval_locomo.load(path, args.limit)))
        elif eval_personaext.is_personaext(path):
            jobs.append(("personaext", path, eval_personaext.load(path, args.limit or eval_personaext.DEFAULT_LIMIT)))
        else:
            print(f"{path}: neither LoCoMo (.json list of conversations) nor PersonaExt (.jsonl triplets)",
                  file=sys.stderr)
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
            team_keys = {key: f"{scope.split(':', 1)[0]}-{label}-{n}"
                         for n, ((scope, label), key) in enumerate(keys.items()) if key}
            _progress(f"starting a service (model {model}) in a temp data dir")
            service = bench_common.ServiceRunner(Path(tmp.name) / "data", api_keys=team_keys, llm_url=llm_url,
                                                 model=model).start()
            service.wait_model_ready()
            url = service.url
        ready = _ready(url)
        summary: dict[str, Any] = {}
        for kind, path, data in jobs:
            job_started = time.monotonic()
            scope = f"{kind}:{path}"
            if kind == "locomo":
                _progress(f"LoCoMo {path.name}: {len(data)} conversation(s), "
                          f"{sum(len(c.turns) for c in data)} turns, {sum(len(c.questions) for c in data)} questions")
                result = eval_locomo.run(data, url=url, keys={c.sample_id: keys[(scope, c.sample_id)] for c in data},
                                         isolation="agent" if args.url else "team")
            else:
                _progress(f"PersonaExt {path.name}: {len(data)} utterance(s)")
                result = eval_personaext.run(data, url=url, key=keys[(scope, "all")])
            result.update({
                "data": str(path),
                "limit": args.limit,
                "model": (ready.get("model_server") or {}).get("model"),
                "llama_build": (ready.get("model_server") or {}).get("build"),
                "service": "self-started (temp data dir)" if service else "external (--url)",
                "wall_time_s": round(time.monotonic() - job_started, 1),
                "machine": bench_common.machine_info(),
            })
            stem = f"{kind}-{path.stem}"
            bench_common.write_json(out / f"{stem}.json", result)
            (eval_locomo.plot if kind == "locomo" else eval_personaext.plot)(result, out / f"{stem}.png")
            summary[stem] = _headline(kind, result)
            _progress(f"{stem}: {json.dumps(summary[stem])} ({result['wall_time_s']:.0f}s)")
        summary["total_time_s"] = round(time.monotonic() - started, 1)
        bench_common.write_json(out / "summary.json", summary)
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
        return {name: {m: r["overall"].get(m) for m in ("recall@5", "recall@10", "recall@20", "mrr")}
                for name, r in result["results"].items()} | {"goal": result["goal"]}
    return {k: result["metrics"].get(k) for k in ("tail_found_in_stored_facts", "facts_per_utterance_mean",
                                                  "stored_over_proposed")}
