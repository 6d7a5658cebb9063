"""Shared helpers for the benchmarks (memory_service.bench) and the evals (memory_service.evals).

Everything is measured over real HTTP against `memory-service serve` running as
a separate process, so the client never shares the server's interpreter, GIL or
event loop. A llama-server is started once and shared by services through
MEMORY_LLM_URL, so each benchmark does not pay the model load.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

from memory_service.client.service import service_client
from memory_service.llm.runtime.server import die_with_parent, stop_group, wait_until_healthy

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- statistics


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no data."""
    data = sorted(values)
    if not data:
        return None
    rank = max(1, min(len(data), math.ceil(q / 100.0 * len(data))))
    return data[rank - 1]


def ms(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value * 1000.0, digits)


def latency_summary(seconds: list[float]) -> dict[str, Any]:
    """p50/p95/p99/max in milliseconds."""
    return {
        "n": len(seconds),
        "p50_ms": ms(percentile(seconds, 50)),
        "p95_ms": ms(percentile(seconds, 95)),
        "p99_ms": ms(percentile(seconds, 99)),
        "max_ms": ms(max(seconds) if seconds else None),
        "mean_ms": ms(statistics.fmean(seconds) if seconds else None),
    }


def goal(value: float | None, target: float, *, at_most: bool = True) -> dict[str, Any]:
    """A figure beside its goal, with a verdict: every number in the JSON is judged where it stands."""
    met = None if value is None else (value <= target if at_most else value >= target)
    return {"value": value, "goal": f"{'<=' if at_most else '>='} {target}", "met": met}


# ---------------------------------------------------------------- processes


def rss_mb(pid: int) -> dict[str, float | None]:
    """VmRSS (now) and VmHWM (peak) of a service, from /proc (Linux): its process plus its children other
    than a llama-server (the process serving its embedded Chroma store is part of the service). The peak
    is the sum of each process's peak, an upper bound."""
    out: dict[str, float | None] = {"rss_mb": None, "peak_rss_mb": None}
    for one in (pid, *_service_children(pid)):
        try:
            for line in Path(f"/proc/{one}/status").read_text().splitlines():
                for field, key in (("VmRSS:", "rss_mb"), ("VmHWM:", "peak_rss_mb")):
                    if line.startswith(field):
                        out[key] = round((out[key] or 0.0) + int(line.split()[1]) / 1024.0, 1)
        except OSError:
            pass
    return out


def _service_children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(rest[1]) == pid and "llama" not in name:
            children.append(int(stat.parent.name))
    return children


def scrape(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A /metrics page as sample name -> [(labels, value)], read by prometheus_client's own parser
    (a histogram's samples come as NAME_bucket, NAME_sum and NAME_count)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def machine_info() -> dict[str, Any]:
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loadavg_1_5_15": [round(x, 2) for x in load],
        "python": sys.version.split()[0],
    }
    try:  # which embedder the services started here use: it changes recall latency and RSS a lot
        from memory_service.config import Settings

        info["service_embedder"] = getattr(Settings.from_env(), "embedder", "torch")
    except Exception:
        pass
    return info


def llama_busy(url: str) -> bool:
    """Is this llama-server in the middle of a completion (its /slots say so)? False when it does not answer."""
    try:
        slots = httpx.get(url + "/slots", timeout=2, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(slots, list) and any(slot.get("is_processing") for slot in slots)


def start_llama(
    model: str = "default", log_dir: Path | None = None, threads: int | None = None, extra_args: tuple[str, ...] = ()
):  # type: ignore[no-untyped-def]
    """One llama-server child with the service's own defaults (threads = cores - 1, 4096 ctx, one slot)."""
    from memory_service.config import Settings
    from memory_service.llm.runtime.models import resolve_model
    from memory_service.llm.runtime.server import LlamaServerProcess

    settings = Settings.from_env()
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="bench-llama-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    return LlamaServerProcess.from_settings(
        settings,
        resolve_model(model, settings.cache_dir),
        log_dir / f"llama-{Path(model).stem}.log",
        threads=threads or settings.llama_threads,
        chat_template_file=None,
        extra_args=tuple(extra_args),
    ).start()


class ServiceRunner:
    """`memory-service serve` in its own process group, on a free port, with a given data dir and keys."""

    def __init__(
        self,
        data_dir: Path,
        *,
        api_keys: Mapping[str, str],
        llm_url: str | None = None,
        model: str = "default",
        env: Mapping[str, str] | None = None,
    ) -> None:
        from memory_service.llm.runtime.server import free_port

        self.data_dir = data_dir
        self.port = free_port()
        self.api_keys = dict(api_keys)
        self.log_path = data_dir.parent / f"{data_dir.name}-service.log"
        child_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MEMORY_")
            or k
            in (
                "MEMORY_CACHE_DIR",
                "MEMORY_LLAMA_BIN",
                "MEMORY_LLAMA_THREADS",
                "MEMORY_EMBED_THREADS",
                "MEMORY_EMBEDDER",
            )
        }
        child_env.update(
            {
                "MEMORY_DATA_DIR": str(data_dir),
                "MEMORY_PORT": str(self.port),
                "MEMORY_HOST": "127.0.0.1",
                "MEMORY_MODEL": model,
                "MEMORY_LOG_LEVEL": os.environ.get("MEMORY_BENCH_SERVICE_LOG_LEVEL", "WARNING"),
            }
        )
        if self.api_keys:
            child_env["MEMORY_API_KEYS"] = ",".join(f"{k}:{t}" for k, t in self.api_keys.items())
        if llm_url:
            child_env["MEMORY_LLM_URL"] = llm_url
        child_env.update(env or {})
        self.env = child_env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 300.0) -> ServiceRunner:
        return self.launch().wait_healthy(timeout_s)

    def launch(self) -> ServiceRunner:
        """Start the process, without waiting for it. Call it from a thread that outlives the service (the
        main one): the parent-death signal fires when the thread that started the child ends."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memory_service.cli.main", "serve"],
            env=self.env,
            cwd=str(self.data_dir.parent),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # a killed eval or benchmark must not leave its service extracting: SIGTERM lets it shut down
            # cleanly, and its own children (llama-server, the vector store) go with it
            preexec_fn=functools.partial(die_with_parent, signal.SIGTERM),
        )
        return self

    def wait_healthy(self, timeout_s: float = 300.0) -> ServiceRunner:
        assert self.proc is not None, "launch() first"
        problem = wait_until_healthy(self.url, self.proc, timeout_s)
        if problem is None:
            return self
        self.stop()
        raise RuntimeError(f"service {problem}:\n{self.log_tail()}")

    def wait_model_ready(self, timeout_s: float = 300.0) -> dict[str, Any]:
        """Until /ready says the model server is reachable (extraction can run)."""
        deadline = time.monotonic() + timeout_s
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                response = httpx.get(self.url + "/ready", timeout=10.0, trust_env=False)
                body = response.json()
                if response.status_code == 200:
                    return body
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"service not ready within {timeout_s:.0f}s: {body}")

    def client(self, key: str | None, timeout: float = 60.0) -> httpx.Client:
        return service_client(self.url, key, timeout=timeout)

    def rss(self) -> dict[str, float | None]:
        return rss_mb(self.pid)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 30.0) -> None:
        stop_group(self.proc, grace_s)


def wait_queue_empty(url: str, timeout_s: float, *, progress: str = "", total: int | None = None) -> dict[str, Any]:
    """Poll /ready until no job is queued or extracting; prints a progress line to stderr every ~10 s."""
    started = time.monotonic()
    last_print = 0.0
    body: dict[str, Any] = {}
    while True:
        try:
            body = httpx.get(url + "/ready", timeout=30.0, trust_env=False).json()
        except (httpx.HTTPError, ValueError):
            body = {}
        depth = body.get("queue_depth")
        elapsed = time.monotonic() - started
        if depth == 0:
            return body
        if elapsed - last_print >= 10 or last_print == 0.0:
            last_print = elapsed or 0.001
            jobs = body.get("jobs") or {}
            done = f" done {jobs.get('done')} failed {jobs.get('failed')}" if jobs else ""
            of = f"/{total}" if total else ""
            print(f"[{progress}] queue {depth}{of}{done}, {elapsed:.0f}s", file=sys.stderr, flush=True)
        if elapsed > timeout_s:
            raise TimeoutError(f"queue still has {depth} job(s) after {timeout_s:.0f}s")
        time.sleep(1.0)


# ---------------------------------------------------------------- output


def main_with_llama(
    argv: list[str] | None,
    *,
    doc: str | None,
    name: str,
    run,
    plot,  # type: ignore[no-untyped-def]
    own_llama: bool = False,
) -> int:
    """The command line every model-backed benchmark shares: --quick, --llm-url or --model, --out.

    `own_llama`: the benchmark starts its llama-server itself (with flags of its own) when no --llm-url.
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}.{name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--llm-url", help="a running llama-server (default: start one with the default model)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--out", type=Path, help="also write JSON and PNG here")
    args = parser.parse_args(argv)
    if own_llama:
        return report(run(llm_url=args.llm_url, quick=args.quick, model=args.model), name, plot, args.out)
    llama = None if args.llm_url else start_llama(args.model)
    try:
        result = run(llm_url=args.llm_url or llama.url, quick=args.quick)
    finally:
        if llama is not None:
            llama.stop()
    return report(result, name, plot, args.out)


def report(result: Any, name: str, plot, out: Path | None, *, failed: bool = False) -> int:  # type: ignore[no-untyped-def]
    """Print the JSON, write it and its plot under `out`; exit status 1 when a check `failed`."""
    print(json.dumps(result, indent=2))
    if out:
        write_json(out / f"{name}.json", result)
        save_plot(plot, result, out / f"{name}.png")
    return 1 if failed else 0


def main_without_llama(
    argv: list[str] | None,
    *,
    doc: str | None,
    name: str,
    run,
    plot,  # type: ignore[no-untyped-def]
    quick: str,
    failed=lambda result: False,
) -> int:
    """The command line of a benchmark that needs no model: --quick (what it means: `quick`), --out."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}.{name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out", type=Path, help="also write JSON and PNG here")
    args = parser.parse_args(argv)
    result = run(quick=args.quick)
    return report(result, name, plot, args.out, failed=failed(result))


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


@functools.cache
def plots_available() -> bool:
    """Whether matplotlib (the optional `bench` extra) can be imported.

    The figures are all in the JSON; the PNGs are a convenience, so a plain install still
    benchmarks and evaluates. Cached, so the reason is logged once per process, not per plot.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        log.warning(
            "PNG plots skipped: matplotlib is not installed (%s); the JSON results are complete. "
            "Install the extra for plots: pip install 'memory-service[bench]'",
            exc,
        )
        return False
    return True


def save_plot(plot: Callable[[Any, Path], None], result: Any, path: Path) -> bool:
    """Draw `result` into `path` with `plot` when matplotlib is there; False when plots are skipped."""
    if not plots_available():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    plot(result, path)
    return True


def pyplot():  # type: ignore[no-untyped-def]
    """matplotlib with the Agg backend: no display on a server. Callers go through save_plot()."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_figure(fig: Any, path: Path) -> None:
    """Lay out, write as a 100-dpi PNG, and free the figure (pyplot keeps every open one)."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


# ---------------------------------------------------------------- realistic agent texts

AGENT_TEXTS: tuple[str, ...] = (
    "Deployed build 4.12.3 of the billing service to staging at 14:05 UTC. Migration 0087 ran in 41 seconds. "
    "Dana asked to keep the new invoice PDF feature flag off until the finance review on Friday.",
    "Read the customer email from Acme Corp: they want to move their renewal from March 1 to April 15 and "
    "reduce seats from 120 to 95. Contact is Priya Natarajan, priya.natarajan@acme.example.",
    "Ran the nightly test suite: 1,482 passed, 3 failed (test_refund_rounding, test_webhook_retry, "
    "test_locale_dates). The webhook failure is flaky; the other two started after commit 9f3c2e1.",
    "User said they prefer short answers in bullet points and work in the Europe/Berlin timezone. "
    "They are the team lead for the data platform group.",
    "Checked the Hacker News story about SQLite WAL mode performance (item 40123456). Already summarised "
    "it yesterday for the #eng-reading channel, so skipped it.",
    "Booked the offsite venue: Lakeside Hall in Zurich, 12-14 June, capacity 40 people, deposit of 2,500 CHF "
    "paid by card ending 4417. Catering confirmed with vegetarian option.",
    "The on-call rotation changes next week: Marco covers Monday to Wednesday, Aiko Thursday to Sunday. "
    "Pager escalation goes to Sam Oduya after 15 minutes without acknowledgement.",
    "Investigated the latency spike on the search API: p99 went from 180 ms to 1.9 s at 03:10 because the "
    "Redis cache node redis-2 restarted. Added an alert on cache hit rate below 80%.",
    "Summarised the quarterly planning doc: priorities are SSO for enterprise customers, cutting cloud costs "
    "by 15%, and launching the mobile app beta in Brazil before September.",
    "Sent the weekly digest to 312 subscribers. Open rate last week was 47%. Two people unsubscribed and "
    "one replied asking for a Spanish edition.",
    "Tried to reproduce issue #2291 (export to CSV drops unicode characters) on macOS and Windows. It only "
    "happens on Windows with Excel 2016; the file itself is valid UTF-8.",
    "Hi, thanks for the update! Talk soon.",
    "Meeting notes: the vendor Northwind quoted 18,000 EUR per year for the analytics plan. Legal needs "
    "two weeks to review the data processing agreement. Decision postponed to the 23rd.",
    "The user's daughter Emma starts school on 2 September; they asked me to block mornings that week "
    "and not schedule calls before 10:00.",
    "Rotated the API keys for the payments provider. Old key revoked at 09:30. Updated the secret in the "
    "vault under payments/prod/api-key and restarted the three checkout pods.",
    "Scraped 58 new job postings for senior Rust engineers in Lisbon; median advertised salary is 72,000 EUR. "
    "Saved the list to the hiring spreadsheet, tab 'Lisbon Q3'.",
    "The customer from Globex reported that password reset emails arrive after 20 minutes. Mail logs show "
    "the provider throttles us at 100 messages per minute since Tuesday.",
    "Agent note: completed step 3 of 7 in the data migration runbook. Copied 2.4 million rows from "
    "orders_2019 to the archive cluster; checksum matches.",
    "Remember that the CFO, Laura Jensen, wants all budget numbers in thousands of euros and rounded "
    "to one decimal place in every report.",
    "Translated the onboarding guide into Portuguese for the Brazil team. Felipe will review it by Thursday. "
    "Terminology for 'workspace' is 'espaco de trabalho'.",
    "Compared three vector databases for the prototype: Chroma was easiest to embed, Qdrant had the best "
    "filtering speed, and pgvector fits our existing Postgres 15 setup.",
    "Cancelled the duplicate AWS reservation for m6i.large in eu-west-1 (reservation r-0a1b2c). This saves "
    "about 1,100 USD per month starting next billing cycle.",
    "Daily standup: Ravi is blocked on the design review, Mei finished the login page redesign, "
    "and the release train moves from Tuesday to Wednesday this week.",
    "The user is allergic to peanuts and prefers aisle seats on flights. Their frequent flyer number "
    "with Lufthansa is 992 0041 7733.",
)


def agent_text(i: int) -> str:
    """A realistic text, varied per request (the journal sees no two identical saves)."""
    return f"{AGENT_TEXTS[i % len(AGENT_TEXTS)]} (ref {i})"
