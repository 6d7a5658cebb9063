"""Scale-out: the multi-process deployment (PostgreSQL + a Chroma server) beside the embedded one, same run.

Three comparisons, each against its baseline measured minutes apart on the same machine:

- consume: requests/s and p99 with 32 clients (the limits benchmark's load generator, in a process of
  its own): SQLite with 1 API process | PostgreSQL with 1 | PostgreSQL with 3, the clients spread
  over the 3. On a 2-core machine the 3 processes share the same cores, so this measures what a
  shared database costs and whether more processes help there, not what more hosts would give.
- remember: ack p50/p99 with the model busy (the remember benchmark, unchanged), journal in SQLite
  against PostgreSQL.
- recall: p50/p95 at 100k facts (10k with --quick) with the vectors on a Chroma server against the
  embedded store (the recall benchmark's loader; the journal is SQLite in both, so only the vector
  store differs). A process on a server cannot keep the in-process filter cache (other processes
  write there), so filtered recall takes Chroma's `where`: the filtered variants show that cost.

PostgreSQL (initdb + pg_ctl, throwaway) and `chroma run` are started here and stopped at the end.

    python -m memory_service.bench.scale [--quick] [--llm-url URL] [--model NAME] [--out DIR]
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ..testbed.chroma_server import ChromaServer
from ..testbed.group import ServiceGroup, shared_env
from ..testbed.postgres import PostgresCluster
from ..testbed.probes import machine_info
from ..testbed.results import pyplot, write_figure
from ..testbed.service_runner import ServiceRunner, start_llama
from ..testbed.stats import goal
from . import remember
from .limits import GOAL as CONSUME_GOAL
from .limits import process_cpu_s
from .recall import GOALS_100K
from .recall_data import TEAM as RECALL_TEAM
from .recall_data import fact_text, queries
from .recall_loader import Loader
from .recall_measure import (
    DEAD_LLM_URL,
    indexes_for,
    measure_http,
    service_embedder,
    variants_at,
)
from .report import main_with_llama

LIMITS_MODULE = "memory_service.bench.limits"
CONSUME_CLIENTS = 32
RECALL_VARIANTS = ("unfiltered", "agent 2% (scope=agent)", "tag (1 tag, 10% of rows)")


def _log(message: str) -> None:
    print(f"[scale] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- consume


def consume(root: Path, pg: PostgresCluster, chroma: ChromaServer, llm_url: str, quick: bool) -> dict[str, Any]:
    """The same closed-loop load on three set-ups; the client runs in a child interpreter of its own."""
    count = 1000 if quick else 5000
    key = secrets.token_urlsafe(12)
    setups = {
        "sqlite_1_process": (1, {}),
        "postgresql_1_process": (1, shared_env(pg.create_database(), chroma.url)),
        "postgresql_3_processes": (3, shared_env(pg.create_database(), chroma.url)),
    }
    out: dict[str, Any] = {}
    for name, (processes, env) in setups.items():
        _log(f"consume: {name}")
        with ServiceGroup(
            root / f"consume-{name}", processes, api_keys={key: "bench-scale"}, llm_url=llm_url, env=env
        ) as group:
            cpu_before = [process_cpu_s(r.pid) for r in group.runners]
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    LIMITS_MODULE,
                    *(f"--url={u}" for u in group.urls()),
                    f"--api-key={key}",
                    "--count",
                    str(count),
                    "--concurrency",
                    str(CONSUME_CLIENTS),
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            cpu_after = [process_cpu_s(r.pid) for r in group.runners]
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            result = {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-2000:]}
        spent = _cpu_spent(cpu_before, cpu_after)
        if spent is not None:
            result["servers_cpu_ms_per_request"] = round(spent * 1000 / count, 3)
        result.pop("goal", None)
        result.pop("machine", None)
        out[name] = result
    rps = {name: (r.get("requests_per_s") or 0) for name, r in out.items()}
    out["comparison"] = {
        "postgresql_1_over_sqlite_1_requests_per_s": _ratio(rps["postgresql_1_process"], rps["sqlite_1_process"]),
        "postgresql_3_over_postgresql_1_requests_per_s": _ratio(
            rps["postgresql_3_processes"], rps["postgresql_1_process"]
        ),
        "p99_ms": {name: r.get("p99_ms") for name, r in out.items() if isinstance(r, dict) and "p99_ms" in r},
    }
    return out


def _cpu_spent(before: list[float | None], after: list[float | None]) -> float | None:
    """CPU seconds the servers spent between two readings; None when a reading is missing (not Linux)."""
    total = 0.0
    for started, ended in zip(before, after):
        if started is None or ended is None:
            return None
        total += ended - started
    return total


# ---------------------------------------------------------------- remember


def remember_ack(root: Path, pg: PostgresCluster, llm_url: str, quick: bool) -> dict[str, Any]:
    """bench.remember twice, the journal in SQLite then in PostgreSQL; the figures side by side."""
    out: dict[str, Any] = {}
    for name, env in (("sqlite", {}), ("postgresql", shared_env(pg.create_database(), None))):
        _log(f"remember: {name}")
        full = remember.run(llm_url=llm_url, quick=quick, workdir=root, env=env, name=f"remember-{name}")
        out[name] = {
            "ack_latency_paced": full["ack_latency"],
            "errors": full["errors"],
            "health_baseline_paced": full["baseline_same_run"]["latency"],
            "saturation_saves_per_s": full["saturation"]["saves_per_s"],
            "saturation_ack_latency": full["saturation"]["ack_latency"],
            "model_busy": {k: full["model_busy"][k] for k in ("extracting_before", "queue_before", "queue_after")},
        }
    sqlite, postgres = out["sqlite"], out["postgresql"]
    out["load"] = f"{remember.CLIENTS} clients, exponential think time (mean {remember.INTERVAL_S}s), model busy"
    out["comparison"] = {
        "postgresql_over_sqlite_p50": _ratio(
            postgres["ack_latency_paced"]["p50_ms"], sqlite["ack_latency_paced"]["p50_ms"]
        ),
        "postgresql_over_sqlite_p99": _ratio(
            postgres["ack_latency_paced"]["p99_ms"], sqlite["ack_latency_paced"]["p99_ms"]
        ),
        "postgresql_over_sqlite_saturation_saves_per_s": _ratio(
            postgres["saturation_saves_per_s"], sqlite["saturation_saves_per_s"]
        ),
    }
    return out


# ---------------------------------------------------------------- recall


def recall_stores(root: Path, chroma: ChromaServer, quick: bool) -> dict[str, Any]:
    """The recall benchmark's data in both vector stores; both measured at each level, one after the other."""
    levels = [10_000] if quick else [10_000, 100_000]
    pool_size = 2_000 if quick else 5_000
    texts = queries(100 if quick else 200)
    key = secrets.token_urlsafe(12)
    embedder, backend = service_embedder()
    pool = embedder.embed([fact_text(i, pool_size)[0] for i in range(pool_size)])
    del embedder
    loaders = {
        "embedded": Loader(root / "recall-embedded" / "data", pool),
        "chroma_server": Loader(root / "recall-server" / "data", pool, chroma_url=chroma.url),
    }
    levels_out: dict[str, Any] = {}
    for level in levels:
        per_store: dict[str, Any] = {}
        for store, loader in loaders.items():
            loader.data_dir.mkdir(parents=True, exist_ok=True)
            _log(f"recall: loading {level} facts into the {store} store")
            started = time.monotonic()
            loader.load_to(level)
            load_s = time.monotonic() - started
            variants = variants_at(level, loader.epoch)
            env = {"MEMORY_CHROMA_URL": chroma.url} if loader.chroma_url else {}
            service = ServiceRunner(loader.data_dir, api_keys={key: RECALL_TEAM}, llm_url=DEAD_LLM_URL, env=env).start()
            try:
                measured = measure_http(
                    service,
                    key,
                    texts,
                    {v: variants[v] for v in RECALL_VARIANTS},
                    0 if loader.chroma_url else indexes_for(level),
                )
            finally:
                service.stop()
            per_store[store] = {
                "facts": loader.facts_in_journal,
                "vectors": loader.rows_in_collection,
                "load_s": round(load_s, 1),
                "http": measured,
            }
        levels_out[str(level)] = per_store
        per_store["server_over_embedded_p50"] = {
            v: _ratio(per_store["chroma_server"]["http"][v]["p50_ms"], per_store["embedded"]["http"][v]["p50_ms"])
            for v in RECALL_VARIANTS
        }
    return {
        "levels": levels_out,
        "queries": len(texts),
        "k": 10,
        "embedder_backend": backend,
        "data": f"bench.recall's loader: {pool_size} real embeddings, the rest pool vectors + noise; "
        "journal in SQLite for both stores, so only the vector store differs",
        "note": None if not quick else "--quick: 10k facts only; the 100k figures need a full run",
    }


# ---------------------------------------------------------------- the run


def run(
    *, llm_url: str | None, quick: bool = False, model: str = "default", workdir: Path | None = None
) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory(prefix="bench-scale-") if workdir is None else None
    if tmp:
        root = Path(tmp.name)
    else:
        assert workdir is not None
        root = workdir / "scale"
    root.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"benchmark": "scale", "quick": quick}
    with ExitStack() as stack:
        if tmp:
            stack.callback(tmp.cleanup)
        pg = PostgresCluster(root / "postgres").start()
        stack.callback(pg.remove)
        chroma = ChromaServer(root / "chroma-server", root / "chroma-server.log").start()
        stack.callback(chroma.stop)
        if llm_url is None:
            llama = start_llama(model, root / "llama")
            stack.callback(llama.stop)
            llm_url = llama.url
        for name, measure in (
            ("consume", lambda: consume(root, pg, chroma, llm_url, quick)),
            ("remember", lambda: remember_ack(root, pg, llm_url, quick)),
            ("recall", lambda: recall_stores(root, chroma, quick)),
        ):
            started = time.monotonic()
            try:
                result[name] = measure()
            except Exception as exc:  # one broken part must not hide the others' figures
                result[name] = {"error": f"{type(exc).__name__}: {exc}"}
            result[name]["wall_time_s"] = round(time.monotonic() - started, 1)
    result["goals"] = goals(result, quick)
    result["failed_checks"] = [
        f"consume {name}: over_limit {r.get('over_limit')}, errors {r.get('errors')}"
        for name, r in (result.get("consume") or {}).items()
        if isinstance(r, dict) and "over_limit" in r and (r["over_limit"] or r["errors"])
    ]
    result["machine"] = machine_info()
    return result


def goals(result: dict[str, Any], quick: bool) -> dict[str, Any]:
    """The existing goals (consume, remember ack, recall at 100k) applied to the multi-process set-up."""
    out: dict[str, Any] = {}
    for name, r in (result.get("consume") or {}).items():
        if isinstance(r, dict) and "requests_per_s" in r:
            out[f"consume {name} requests_per_s"] = goal(
                r["requests_per_s"], CONSUME_GOAL["requests_per_s"], at_most=False
            )
            out[f"consume {name} over_limit"] = goal(r["over_limit"], 0)
    ack = ((result.get("remember") or {}).get("postgresql") or {}).get("ack_latency_paced") or {}
    for stat, target in remember.GOALS.items():
        out[f"remember postgresql ack {stat}"] = goal(ack.get(stat), target)
    levels = (result.get("recall") or {}).get("levels") or {}
    if levels:
        top = max(levels, key=int)
        http = levels[top]["chroma_server"]["http"]["unfiltered"]
        suffix = " (goal is for 100k)" if quick else ""
        for stat, target in GOALS_100K.items():
            out[f"recall chroma_server {int(top) // 1000}k unfiltered {stat}{suffix}"] = goal(http[stat], target)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 4))
    cons = {k: v for k, v in (result.get("consume") or {}).items() if isinstance(v, dict) and "requests_per_s" in v}
    left.bar(list(cons), [v["requests_per_s"] for v in cons.values()])
    left.set_title("consume requests/s (32 clients)")
    left.tick_params(axis="x", labelsize=7)
    rem = {k: v for k, v in (result.get("remember") or {}).items() if k in ("sqlite", "postgresql")}
    xs = range(len(rem))
    middle.bar([x - 0.2 for x in xs], [v["ack_latency_paced"]["p50_ms"] or 0 for v in rem.values()], 0.4, label="p50")
    middle.bar([x + 0.2 for x in xs], [v["ack_latency_paced"]["p99_ms"] or 0 for v in rem.values()], 0.4, label="p99")
    middle.set_xticks(list(xs), list(rem))
    middle.set_ylabel("ms")
    middle.set_title("remember ack, model busy")
    middle.legend(fontsize=8)
    levels = (result.get("recall") or {}).get("levels") or {}
    if levels:
        top = levels[max(levels, key=int)]
        xs = range(len(RECALL_VARIANTS))
        for offset, store in ((-0.2, "embedded"), (0.2, "chroma_server")):
            right.bar(
                [x + offset for x in xs],
                [top[store]["http"][v]["p50_ms"] for v in RECALL_VARIANTS],
                0.4,
                label=f"{store} p50",
            )
        right.set_xticks(list(xs), ["unfiltered", "agent 2%", "tag 10%"])
        right.set_yscale("log")
        right.set_ylabel("ms")
        right.set_title(f"recall at {int(max(levels, key=int)):,} facts")
        right.legend(fontsize=8)
    write_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    return main_with_llama(argv, doc=__doc__, name="scale", run=run, plot=plot, own_llama=True)


if __name__ == "__main__":
    raise SystemExit(main())
