"""Benchmark `POST /v1/limits/{name}/consume` over real HTTP.

Creates a fresh, uniquely named per-team limit of count/2 (so both allowed
and denied answers happen), fires `--count` consumes from `--concurrency`
concurrent asyncio clients (httpx, one keep-alive connection each), then
prints JSON: throughput, latency, the over-limit check (must be 0), the CPU
each side spent per request and the machine's load, since on a small shared
machine the client's own CPU use is part of the number.

    python -m memory_service.bench.limits --url http://127.0.0.1:8700 --api-key KEY
    python -m memory_service.bench.limits --self-serve     # own server in a child process
    python -m memory_service.bench.limits --url URL1 --url URL2 --api-key KEY   # clients spread over both

`--self-serve` starts this module with `--serve-only` as a separate process
(minimal app: limit routes + LimitStore in a temp dir, access log off), so
the client does not share the server's interpreter and GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import secrets
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import httpx

from ..client.service import async_service_client, auth_headers
from ..config import ClientEnv

if TYPE_CHECKING:
    from fastapi import FastAPI

GOAL = {"requests_per_s": 800, "over_limit": 0}
JSON_HEADERS = {"Content-Type": "application/json"}
Synchronous = Literal["NORMAL", "FULL"]  # the self-served LimitStore's SQLite mode
T = TypeVar("T")


# ---------------------------------------------------------------- server side


def build_app(data_dir: Path, api_key: str | None, synchronous: Synchronous = "NORMAL") -> FastAPI:
    """The limit routes alone, wired like the service does it."""
    from fastapi import FastAPI

    from ..api.routes import limits as routes_limits
    from ..config import Settings
    from ..services import KEYS_FILE, LimitsAndKeys
    from ..storage.keys import KeyStore
    from ..storage.limits import LimitStore

    settings = Settings.from_env().with_overrides(data_dir=data_dir, api_keys={api_key: "bench"} if api_key else {})

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = LimitStore(data_dir / "limits.sqlite3", synchronous=synchronous)
        keys = KeyStore(data_dir / KEYS_FILE)
        app.state.services = LimitsAndKeys(settings, store, keys)
        yield
        store.close()
        keys.close()

    app = FastAPI(lifespan=lifespan)
    app.include_router(routes_limits.router)
    return app


def serve(port: int, data_dir: Path, api_key: str | None, synchronous: Synchronous) -> None:
    import uvicorn

    app = build_app(data_dir, api_key, synchronous)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def process_cpu_s(pid: int) -> float | None:
    """User+system CPU seconds of a child process (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, headers: dict[str, str], proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"benchmark server exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/limits", headers=headers, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("benchmark server did not start in time")


# ---------------------------------------------------------------- client side


async def run_bench(url: str | list[str], api_key: str | None, concurrency: int, count: int) -> dict[str, object]:
    """`url`: one service, or several processes of one deployment that the clients are spread over."""
    urls = [url] if isinstance(url, str) else list(url)
    name = f"bench-{int(time.time())}-{secrets.token_hex(4)}"
    daily_limit = max(1, count // 2)
    latencies: list[float] = []
    statuses: dict[str, int] = {"allowed": 0, "denied": 0, "errors": 0}
    path = f"/v1/limits/{name}/consume"
    next_index = iter(range(count))
    # One single-connection client per simulated agent: httpcore's shared async pool
    # costs more CPU per request than the server does at this concurrency. They share
    # one SSL context (built eagerly by httpx even for http://) and are opened and
    # warmed up before the clock starts.
    ssl_context = ssl.create_default_context()
    clients = [
        async_service_client(urls[n % len(urls)], api_key, timeout=30.0, verify=ssl_context) for n in range(concurrency)
    ]

    async def agent(client: httpx.AsyncClient, agent_id: str) -> None:
        body = json.dumps({"agent_id": agent_id}).encode()
        for _ in next_index:
            start = time.perf_counter()
            try:
                resp = await client.post(path, content=body, headers=JSON_HEADERS)
            except httpx.HTTPError:
                statuses["errors"] += 1
                continue
            latencies.append(time.perf_counter() - start)
            if resp.status_code == 200 and resp.json()["allowed"]:
                statuses["allowed"] += 1
            elif resp.status_code == 429 and not resp.json()["allowed"]:
                statuses["denied"] += 1
            else:
                statuses["errors"] += 1

    try:
        admin = clients[0]
        spec = {"daily_limit": daily_limit, "timezone": "UTC", "per": "team"}
        (await admin.put(f"/v1/limits/{name}", json=spec)).raise_for_status()
        await asyncio.gather(*(c.get(f"/v1/limits/{name}") for c in clients))  # open the connections
        started, cpu_started = time.perf_counter(), time.process_time()
        await asyncio.gather(*(agent(c, f"agent-{n}") for n, c in enumerate(clients)))
        elapsed, client_cpu = time.perf_counter() - started, time.process_time() - cpu_started
        used = (await admin.get(f"/v1/limits/{name}")).json()["used"]
        await admin.delete(f"/v1/limits/{name}")
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))

    latencies.sort()
    done = len(latencies)
    return {
        "requests_per_s": round(done / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
        "p99_ms": round(latencies[min(done - 1, int(done * 0.99))] * 1000, 2) if latencies else None,
        "allowed": statuses["allowed"],
        "denied": statuses["denied"],
        "used_reported_by_server": used,
        "over_limit": max(0, statuses["allowed"] - daily_limit, used - daily_limit),
        "errors": statuses["errors"],
        "daily_limit": daily_limit,
        "count": count,
        "concurrency": concurrency,
        "processes": len(urls),
        "elapsed_s": round(elapsed, 3),
        "client_cpu_ms_per_request": round(client_cpu * 1000 / max(1, count), 3),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_after": round(os.getloadavg()[0], 2)},
        "goal": GOAL,
    }


def _fail_fast_without_sniffio() -> None:
    """Make a missing sniffio cost nothing per request, so the client measures HTTP.

    httpcore retries `import sniffio` on every lock it creates when sniffio is absent
    (anyio >= 4.11 no longer pulls it in; encode/httpcore#1103), and each failed import
    scans the whole import path. A None entry in sys.modules makes that import fail at once.
    Done by main() (this process is the benchmark client), not at import: importing this
    module must not change how the rest of an importing process resolves sniffio.
    """
    if importlib.util.find_spec("sniffio") is None:
        sys.modules["sniffio"] = None  # type: ignore[assignment]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """uvloop when installed (as uvicorn's fast path also uses it): a cheaper client leaves more CPU to the server."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m memory_service.bench.limits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--url",
        action="append",
        help="the service (default $MEMORY_URL or http://127.0.0.1:8700); repeat it to spread "
        "the clients over several processes of one deployment",
    )
    parser.add_argument("--api-key", default=ClientEnv.from_env().api_key)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--self-serve", action="store_true", help="start a minimal server in a child process")
    parser.add_argument("--serve-only", action="store_true", help="only run the minimal server (used by --self-serve)")
    parser.add_argument("--port", type=int, default=0, help="--serve-only port (0 = any free port)")
    parser.add_argument("--data-dir", type=Path, help="--serve-only data dir (default: a temp dir)")
    parser.add_argument("--synchronous", choices=["NORMAL", "FULL"], default="NORMAL", help="self-served SQLite mode")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.count < 1:
        parser.error("--concurrency and --count must be at least 1")

    if args.serve_only:
        with tempfile.TemporaryDirectory() as tmp:
            serve(args.port or free_port(), args.data_dir or Path(tmp), args.api_key, args.synchronous)
        return 0

    _fail_fast_without_sniffio()
    if args.self_serve:
        result = _self_served(args)
    else:
        urls = args.url or [ClientEnv.from_env().service_url]
        result = _run(run_bench(urls, args.api_key, args.concurrency, args.count))
    print(json.dumps(result, indent=2))
    return 0 if result["over_limit"] == 0 and result["errors"] == 0 else 1


def _self_served(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark against this module's minimal server, started with --serve-only in a child process."""
    port, key = free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "memory_service.bench.limits",
            "--serve-only",
            "--port",
            str(port),
            "--data-dir",
            tmp,
            "--synchronous",
            args.synchronous,
        ]
        proc = subprocess.Popen(cmd, env={**os.environ, "MEMORY_API_KEY": key})  # the key stays out of `ps`
        try:
            wait_ready(url, auth_headers(key), proc)
            cpu_before = process_cpu_s(proc.pid)
            result = _run(run_bench(url, key, args.concurrency, args.count))
            cpu_after = process_cpu_s(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    server: dict[str, object] = {"self_serve": True, "separate_process": True, "synchronous": args.synchronous}
    if cpu_before is not None and cpu_after is not None:  # includes the few set-up requests
        server["cpu_ms_per_request"] = round((cpu_after - cpu_before) * 1000 / args.count, 3)
    result["server"] = server
    return result


if __name__ == "__main__":
    raise SystemExit(main())
