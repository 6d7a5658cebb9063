"""Liveness, readiness, stats (JSON) and metrics (Prometheus)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from ...contract.models import HealthOut, ReadyOut, StatsOut
from ...llm.handle import ModelHandle
from ...metrics import CONTENT_TYPE
from ..deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthOut)
async def health() -> dict:
    """The process is alive and serving HTTP."""
    return {"status": "ok"}


@router.get(
    "/ready",
    response_model=None,
    responses={
        200: {"model": ReadyOut, "description": "Ready"},
        503: {"model": ReadyOut, "description": "Not ready: the body says why"},
    },
)
async def ready(services: ServicesDep) -> JSONResponse:
    """200 when a model server is reachable and thinking is verified off (or absent); 503 with the reason otherwise.

    `model_server` is the first server that is up; `model_servers` lists each one of the pool.
    """
    await services.probe_models(max_age_s=5)
    model = services.primary_model
    thinking = await model.thinking() if model.ready else None
    ok = model.ready and (thinking is None or thinking.get("verdict") != "FAIL")
    counts = await asyncio.to_thread(services.job_counts)
    body = {
        "status": "ready" if ok else "unavailable",
        "model_server": _server(model),
        "model_servers": [_server(handle, throughput=True) for handle in services.model_handles()],
        "thinking": thinking,
        "queue_depth": counts["queued"] + counts["extracting"],
        "jobs": counts,
        "throughput": model.throughput.snapshot(),
        "extract_budget_s": services.settings.extract_budget_s,
        # where the journal and the vectors live (the counts above just read the first)
        "storage": services.storage_locations(),
    }
    return JSONResponse(body, status_code=200 if ok else 503)


def _server(model: ModelHandle, throughput: bool = False) -> dict[str, Any]:
    """One llama-server as /ready shows it: where, up or not (and why not), what it runs."""
    props = model.props
    out: dict[str, Any] = {
        "url": model.client.base_url,
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


@router.get("/v1/stats", response_model=StatsOut)
async def stats(services: ServicesDep) -> dict:
    """Jobs by status, the measured model speed and readiness, as JSON (for people and scripts)."""
    counts = await asyncio.to_thread(services.job_counts)
    model = services.primary_model
    return {
        "jobs": counts,
        "throughput": model.throughput.snapshot(),
        "model_ready": model.ready,
        "consolidation": await asyncio.to_thread(services.consolidation_status),
    }


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
async def metrics(services: ServicesDep) -> Response:
    """Prometheus text exposition, for scraping. Rendered in a thread: the gauges read the journal."""
    body = await asyncio.to_thread(services.render_metrics)
    return Response(body, media_type=CONTENT_TYPE)
