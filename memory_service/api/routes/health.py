"""Liveness, readiness, stats (JSON) and metrics (Prometheus)."""

from __future__ import annotations

import hmac
import shutil
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from ...contract.health import HealthOut, ReadyOut
from ...contract.models import StatsOut
from ...metrics import CONTENT_TYPE
from ...services import ModelHandle, describe
from ..auth import Caller, caller_of_key, identify, open_access, presented_key
from ..deps import ServicesDep
from ..errors import error_responses

router = APIRouter(tags=["health"])

LOW_DISK_BYTES = 1 << 30  # under 1 GiB free, or
LOW_DISK_FRACTION = 0.05  # under 5% of the file system: /ready's disk state is "low"


def _process(request: Request) -> dict[str, Any]:
    """Which build answers and for how long (the app factory stamps both)."""
    state = request.app.state
    return {"version": state.version, "uptime_s": round(time.monotonic() - state.started, 1)}


def disk_state(path: Path) -> dict[str, Any]:
    """Free and total bytes of the file system holding `path`, and whether that is low."""
    usage = shutil.disk_usage(path)
    low = usage.free < LOW_DISK_BYTES or usage.free < LOW_DISK_FRACTION * usage.total
    return {"free_bytes": usage.free, "total_bytes": usage.total, "state": "low" if low else "ok"}


@router.get("/health", response_model=HealthOut)
async def health(request: Request) -> dict:
    """The process is alive and serving HTTP: its version and uptime."""
    return {"status": "ok", **_process(request)}


@router.get(
    "/ready",
    response_model=None,
    responses={
        200: {"model": ReadyOut, "description": "Ready"},
        503: {"model": ReadyOut, "description": "Not ready: the body says why"},
    },
)
async def ready(request: Request, services: ServicesDep) -> JSONResponse:
    """200 when a model server is reachable and thinking is verified off (or absent); 503 with the reason otherwise.
    Also the version, uptime and the data dir's free disk (`disk.state` low: a warning, never a 503).

    `model_server` is the first server that is up; `model_servers` lists each one of the pool. Takes no key
    (a load balancer's probe), and without one says only ready or not and why: the job counts, queue depth
    and measured speed are activity, so they are shown to whom they belong. A team's key sees its own
    team's counts (as /v1/stats does); the operator (the MEMORY_METRICS_TOKEN bearer, or keyless loopback
    mode, one local team) sees every team's.
    """
    await services.probe_models(max_age_s=5)
    model = services.primary_model
    thinking = await model.thinking() if model.ready else None
    ok = model.ready and (thinking is None or thinking.get("verdict") != "FAIL")
    viewer = await services.off_loop(ready_viewer, request)  # reads the key store: off the event loop
    body: dict[str, Any] = {
        "status": "ready" if ok else "unavailable",
        "model_server": _server(model),
        "model_servers": [_server(handle, throughput=viewer is not None) for handle in services.model_handles()],
        "thinking": thinking,
        "extract_budget_s": services.settings.extract_budget_s,
        # where the journal and the vectors live
        "storage": {name: describe(where) for name, where in services.storage_locations().items()},
        **_process(request),
        "disk": disk_state(services.settings.data_dir),
    }
    if viewer is not None:
        team = viewer
        counts = await services.off_loop(
            services.job_counts if team == OPERATOR else lambda: services.status_counts(team)
        )
        body |= {
            "queue_depth": counts["queued"] + counts["extracting"],
            "jobs": counts,
            "throughput": model.throughput.snapshot(),
            "webhooks": await services.off_loop(services.webhooks.status, None if team == OPERATOR else team),
        }
    return JSONResponse(body, status_code=200 if ok else 503)


OPERATOR = ""  # `ready_viewer`'s answer for the operator (no team is named "")


def ready_viewer(request: Request) -> str | None:
    """Whose counts /ready shows: OPERATOR (every team's), a team (a known key's), or None (no key, an
    unknown one: /ready answers it anyway, without counts, rather than a 401 a probe would read as down; or a
    key pinned to an agent: the counts are the team's, which /v1/stats refuses it too)."""
    if _operator(request):
        return OPERATOR
    presented = presented_key(request)
    if presented is None:
        return None
    caller = caller_of_key(request.app.state.services, presented)
    return None if caller is None or caller.agent_id is not None else caller.team


def _server(model: ModelHandle, throughput: bool = False) -> dict[str, Any]:
    """One llama-server as /ready shows it: where, up or not (and why not), what it runs."""
    props = model.props
    out: dict[str, Any] = {
        "url": describe(model.client.base_url),
        "reachable": model.ready,
        "error": model.last_error,
        "n_ctx": props.n_ctx if props else None,
        "slots": props.slots if props else None,
        "build": props.build_info if props else None,
        "model": props.model_path.rsplit("/", 1)[-1] if props else None,
    }
    if throughput:
        out["throughput"] = model.throughput.snapshot()
    return out


def _operator(request: Request) -> bool:
    """Keyless loopback mode, or the MEMORY_METRICS_TOKEN bearer: the operator, who sees every team."""
    services = request.app.state.services
    if open_access(services):
        return True
    token = services.settings.metrics_token
    presented = presented_key(request)
    return bool(token) and presented is not None and hmac.compare_digest(presented.encode(), token.encode())


def _caller_unless_operator(request: Request) -> Caller | None:
    """None for the operator, else the key's caller (401 without a known key): both read the key store, in
    one hop to the pool."""
    return None if _operator(request) else identify(request)


async def stats_reader(request: Request) -> str | None:
    """None for the operator (every team's numbers), else the key's team (401 without a known key). A key
    pinned to an agent gets a 403: the counts are the team's, and it sees only its own agent's activity."""
    caller = await request.app.state.services.off_loop(_caller_unless_operator, request)  # reads the key store
    if caller is None:
        return None
    if caller.agent_id is not None:
        raise HTTPException(
            status_code=403,
            detail=f"this key is pinned to agent_id '{caller.agent_id}'; /v1/stats counts the whole team's jobs "
            "and needs a key not pinned to an agent (GET /v1/team shows this agent's own)",
        )
    return caller.team


@router.get("/v1/stats", response_model=StatsOut, responses=error_responses(401, 403))
async def stats(services: ServicesDep, team: Annotated[str | None, Depends(stats_reader)]) -> dict:
    """Jobs by status, the measured model speed and readiness, as JSON (for people and scripts). With keys,
    a key sees its team's jobs and consolidated items only (one team does not see another's activity); the
    MEMORY_METRICS_TOKEN bearer, like keyless mode, sees every team's and consolidation's runs."""
    counts = await services.off_loop(services.job_counts if team is None else lambda: services.status_counts(team))
    model = services.primary_model
    return {
        "jobs": counts,
        "throughput": model.throughput.snapshot(),
        "model_ready": model.ready,
        "consolidation": await services.off_loop(services.consolidation_status, team),
    }


async def scraper(request: Request) -> str | None:
    """Who may read /metrics, and how much of it: anyone in keyless loopback mode, and with keys the bearer
    MEMORY_METRICS_TOKEN (a Prometheus `authorization` credential), the whole page (None). A team's unpinned
    admin key reads only its own team's labelled series: the rest counts other teams' activity."""
    caller = await request.app.state.services.off_loop(_caller_unless_operator, request)  # 401 without a known key
    if caller is None:
        return None
    if caller.role != "admin" or caller.agent_id is not None:
        raise HTTPException(403, "/metrics needs an unpinned admin key or the MEMORY_METRICS_TOKEN bearer token")
    return caller.team


def team_series(exposition: bytes, team: str) -> bytes:
    """Only the samples labelled with `team` (HELP/TYPE lines kept): what a team's admin may see of /metrics."""
    mine = f'team="{team}"'.encode()
    return b"".join(
        line for line in exposition.splitlines(keepends=True) if line.startswith(b"#") or mine in line.split(b"}")[0]
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format 0.0.4",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(services: ServicesDep, team: Annotated[str | None, Depends(scraper)]) -> Response:
    """Prometheus text exposition, for scraping. Rendered in a thread: the gauges read the journal."""
    body = await services.off_loop(services.render_metrics)
    if team is not None:
        body = team_series(body, team)
    return Response(body, media_type=CONTENT_TYPE)
