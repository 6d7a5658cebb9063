"""GET /v1/export and POST /v1/import: a team's memories as JSON Lines, out and back in."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from pydantic.json_schema import models_json_schema

from ...contract.hindsight import retain_derives
from ...contract.models import ExportedMemory, ImportResponse
from ...services import ImportTally, Services
from ..auth import Caller, Team, Writer
from ..deps import ServicesDep
from ..errors import Responses, describe, error_responses
from ..write_rules import Refused, check_write
from .hindsight_store import META as HS_META

router = APIRouter(tags=["transfer"])

IMPORT_MAX_BYTES = 512 * 1024 * 1024
# One exported memory is its text (≤ MEMORY_MAX_TEXT_BYTES, at most 6x that JSON-escaped), ≤ 8 KiB of metadata
# and its facts: 8x the text limit, and never under 4 MiB, is far above any real line and bounds the memory a
# line without a newline can take.
IMPORT_MIN_LINE_BYTES = 4 * 1024 * 1024
IMPORT_BATCH = 64
EXPORT_CHUNK = 100  # lines per body chunk: each chunk is one hop to a worker thread, so not one per line
MAX_REPORTED_ERRORS = 100
LINEAGE = "import:"  # the key import derives for a line: `import:<its id>` (storage/catalog.py)
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


def line_key(record: ExportedMemory) -> str | None:
    """The key a line is imported under. A client's key, or a lineage `import:<id>` (what import itself derives
    for a line of that id, so it can take nothing a line's id could not), is kept. A Hindsight key is the
    retain's alone: one a retain of the line's own bank and document derives (the service's own exported
    line) is dropped, so the line goes in under its lineage and that retain, sent again, stores its item rather
    than finding the copy; any other is kept, and `check_write` refuses the line for it (docs/api.md)."""
    key = record.idempotency_key
    if key is None or not key.startswith("hindsight:"):
        return key
    said = record.metadata.get(HS_META)
    operation = said.get("operation_id") if isinstance(said, dict) else None
    owned = retain_derives(
        key, bank=record.agent_id, document_id=record.run_id, operation_id=operation, text=record.text
    )
    return None if owned else key


def _reason(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(describe(e) for e in exc.errors())
    return str(exc.detail) if isinstance(exc, Refused) else str(exc)


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
            record.idempotency_key = line_key(record)
            check_write(
                request,
                max_text_bytes=settings.max_text_bytes,
                agent_id=record.agent_id,
                text=record.text,
                metadata=record.metadata,
                key=record.idempotency_key,
                key_is_derived=(record.idempotency_key or "").startswith(LINEAGE),
            )
        except (ValidationError, ValueError) as exc:
            failed += 1
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append({"line": number, "detail": _reason(exc)})
            continue
        batch.append(record.model_dump(mode="json"))
        if len(batch) >= IMPORT_BATCH:
            await flush()
    await flush()
    if tally.imported:
        services.saved()  # passages to embed, and jobs to extract when re_extract
    return ImportResponse(imported=tally.imported, skipped=tally.skipped, failed=failed, errors=errors)
