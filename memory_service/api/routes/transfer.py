"""GET /v1/export and POST /v1/import: a team's memories as JSON Lines, out and back in."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from pydantic.json_schema import models_json_schema

from ...contract.models import ExportedMemory, ImportResponse
from ...services import ImportTally, Services
from ..auth import Caller, Team, Writer
from ..deps import ServicesDep
from ..errors import Responses, describe, error_responses
from .memories import MAX_METADATA_BYTES

router = APIRouter(tags=["transfer"])

IMPORT_MAX_BYTES = 512 * 1024 * 1024
# One exported memory is its text (≤ MEMORY_MAX_TEXT_BYTES, at most 6x that JSON-escaped), ≤ 8 KiB of metadata
# and its facts: 8x the text limit, and never under 4 MiB, is far above any real line and bounds the memory a
# line without a newline can take.
IMPORT_MIN_LINE_BYTES = 4 * 1024 * 1024
IMPORT_BATCH = 64
EXPORT_CHUNK = 100  # lines per body chunk: each chunk is one hop to a worker thread, so not one per line
MAX_REPORTED_ERRORS = 100
NDJSON = "application/x-ndjson"
COMPONENTS = "#/components/schemas/"
# JSON Lines: each line, not the body, is an ExportedMemory (`itemSchema`, as FastAPI documents JSON Lines)
LINES = {NDJSON: {"itemSchema": {"$ref": COMPONENTS + ExportedMemory.__name__}}}


def document_lines(app: FastAPI) -> None:
    """Put ExportedMemory (and the models it uses) in the app's OpenAPI components.

    The export and import bodies are streamed, so no route declares it as a model and FastAPI would leave
    it out; the routes' `itemSchema` points at it.
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schemas = generate().setdefault("components", {}).setdefault("schemas", {})
            _, defs = models_json_schema([(ExportedMemory, "validation")], ref_template=COMPONENTS + "{model}")
            schemas.update(defs["$defs"])
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


_EXPORTED: Responses = {200: {"description": "One ExportedMemory a line, oldest first", "content": LINES}}


@router.get("/v1/export", response_class=StreamingResponse, responses=_EXPORTED | error_responses(401))
async def export_route(request: Request, team: Team, services: ServicesDep) -> StreamingResponse:
    """Every memory of the team, oldest first, one JSON object a line, with facts, spans and history.
    A key pinned to an agent exports that agent's memories only."""
    caller: Caller = request.state.caller
    chunks = export_chunks(services.export(team, caller.agent_id))
    return StreamingResponse(_read_in_pool(services, chunks), media_type=NDJSON)


async def _read_in_pool(services: Services, chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Each chunk read in the services' pool: a sync iterator would be read in AnyIO's threadpool instead,
    one the service neither sizes nor joins."""
    while (chunk := await services.off_loop(next, chunks, None)) is not None:
        yield chunk


def export_chunks(records: Iterable[dict], size: int = EXPORT_CHUNK) -> Iterator[bytes]:
    """JSON Lines, `size` lines per chunk: streamed (memory stays flat) without a thread hop per line."""
    lines: list[str] = []
    for record in records:
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
        if len(lines) >= size:
            yield "".join(lines).encode()
            lines = []
    if lines:
        yield "".join(lines).encode()


async def _lines(request: Request, max_line: int) -> AsyncIterator[tuple[int, bytes | None]]:
    """The body's lines, numbered; None for a line longer than `max_line`, whose bytes are dropped as they
    arrive. Each chunk is split once, so a long line costs linear time, not a rescan per chunk."""
    parts: list[bytes] = []
    size, number, total, too_long = 0, 0, 0, False
    async for chunk in request.stream():
        total += len(chunk)
        if total > IMPORT_MAX_BYTES:
            raise HTTPException(413, f"import body is larger than {IMPORT_MAX_BYTES} bytes: split the file")
        *complete, rest = chunk.split(b"\n")
        for piece in complete:
            number += 1
            yield number, None if too_long or size + len(piece) > max_line else b"".join(parts) + piece
            parts, size, too_long = [], 0, False
        if too_long or size + len(rest) > max_line:
            parts, size, too_long = [], 0, True
        elif rest:
            parts.append(rest)
            size += len(rest)
    if parts or too_long:
        yield number + 1, None if too_long else b"".join(parts)


@router.post(
    "/v1/import",
    response_model=ImportResponse,
    responses=error_responses(401, 403, 413, 422),
    openapi_extra={"requestBody": {"required": False, "content": LINES}},
)
async def import_route(
    request: Request, team: Writer, services: ServicesDep, re_extract: bool = False
) -> ImportResponse:
    """JSON Lines as `/v1/export` writes them. Facts are kept as they are, or with `re_extract=true`
    dropped and extracted again. Idempotent per line: a line imported before is skipped. An empty body imports
    nothing."""
    caller: Caller = request.state.caller
    if caller.agent_id is not None:
        raise HTTPException(
            403,
            f"this key is pinned to agent_id '{caller.agent_id}'; importing writes as any "
            "agent, so it needs a key that is not pinned",
        )
    settings = services.settings
    tally, failed = ImportTally(), 0
    errors: list[dict[str, Any]] = []
    batch: list[dict] = []

    async def flush() -> None:
        if batch:
            done = await services.off_loop(services.import_records, list(batch), team, re_extract=re_extract)
            tally.imported += done.imported
            tally.skipped += done.skipped
            batch.clear()

    max_line = max(IMPORT_MIN_LINE_BYTES, 8 * settings.max_text_bytes)
    async for number, raw in _lines(request, max_line):
        if raw is not None and not raw.strip():
            continue
        try:
            if raw is None:
                raise ValueError(f"line is longer than {max_line} bytes, far more than an exported memory takes")
            record = ExportedMemory.model_validate_json(raw)
            if len(record.text.encode()) > settings.max_text_bytes:
                raise ValueError(f"text is larger than {settings.max_text_bytes} bytes (MEMORY_MAX_TEXT_BYTES)")
            if len(json.dumps(record.metadata)) > MAX_METADATA_BYTES:
                raise ValueError(f"metadata is larger than {MAX_METADATA_BYTES} bytes as JSON")
        except (ValidationError, ValueError) as exc:
            failed += 1
            if len(errors) < MAX_REPORTED_ERRORS:
                detail = "; ".join(describe(e) for e in exc.errors()) if isinstance(exc, ValidationError) else str(exc)
                errors.append({"line": number, "detail": detail})
            continue
        batch.append(record.model_dump(mode="json"))
        if len(batch) >= IMPORT_BATCH:
            await flush()
    await flush()
    if tally.imported:
        services.saved()  # passages to embed, and jobs to extract when re_extract
    return ImportResponse(imported=tally.imported, skipped=tally.skipped, failed=failed, errors=errors)
