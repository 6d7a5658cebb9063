"""Hindsight's REST API (the part agents use), so `hindsight-client` and the integrations built on it work
against this service by changing their base URL and key. The mapping is in docs/hindsight.md: a bank is an
agent_id of the key's team, document_id a run_id (and the idempotency key), timestamp occurred_at, context and
metadata kept in the memory's metadata, tags tags. Anything else under /v1/default answers 501."""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import datetime
from typing import Any, NamedTuple, cast

from fastapi import APIRouter, HTTPException, Request

from ...contract.hindsight import (
    SEGMENT_PATTERN,
    SEGMENT_RULE,
    HsFeatures,
    HsItem,
    HsOperationStatus,
    HsRecallRequest,
    HsRecallResponse,
    HsRecallResult,
    HsRetainRequest,
    HsRetainResponse,
    HsType,
    HsVersion,
    derived_key,
    legacy_document_key,
)
from ...contract.types import MAX_TAGS
from ...services import DONE, FAILED, Hit, Memory, RecallQuery
from ..auth import Team, Writer, agent_scope, check_agent
from ..deps import ServicesDep
from ..write_rules import check_write
from . import hindsight_docs
from . import hindsight_store as store
from .hindsight_store import PREFIX, BankId

router = APIRouter(tags=["hindsight"], include_in_schema=False)

KINDS: dict[str, str] = {"world": "fact", "experience": "passage", "observation": "consolidated"}
TYPES: dict[str, HsType] = {"fact": "world", "passage": "experience", "consolidated": "observation"}
K_OF_BUDGET = {"low": 10, "mid": 30, "high": 100}
SERVED = (
    "served: POST /v1/default/banks/{bank_id}/memories (retain, batch, async), POST .../memories/recall, "
    "GET .../operations/{operation_id}, GET/DELETE .../documents[/{document_id}], GET /v1/default/banks, "
    "PUT /v1/default/banks/{bank_id}, GET .../profile (see docs/hindsight.md)"
)
_SEGMENT = re.compile(SEGMENT_PATTERN)


def _not_served(what: str) -> HTTPException:
    return HTTPException(501, f"{what} is not served by memory-service's Hindsight API; {SERVED}")


class Prepared(NamedTuple):
    fields: dict[str, Any]  # remember's arguments
    legacy_key: str | None  # the key this item had before derived keys (a document item's), for replay


def _prepared(
    request: Request, bank: str, body: HsRetainRequest, services: ServicesDep, operation_id: str | None
) -> list[Prepared]:
    """Every item as remember's fields, all checked before any is stored (a refused batch stores nothing)."""
    per_document: dict[str, int] = {}
    out = []
    for n, item in enumerate(body.items):
        out.append(_fields(request, bank, n, item, body, services, operation_id, per_document))
    return out


def _fields(
    request: Request,
    bank: str,
    n: int,
    item: HsItem,
    body: HsRetainRequest,
    services: ServicesDep,
    operation_id: str | None,
    per_document: dict[str, int],
) -> Prepared:
    try:
        text = item.text()
    except ValueError as exc:
        raise HTTPException(422, f"items.{n}.content: {exc}") from None
    if not text.strip() or "\x00" in text:
        raise HTTPException(422, f"items.{n}.content: empty, only whitespace, or holds a NUL character")
    tags = list(dict.fromkeys([*(item.tags or []), *(body.document_tags or [])]))
    if len(tags) > MAX_TAGS:
        raise HTTPException(422, f"items.{n}: {len(tags)} tags with document_tags; at most {MAX_TAGS}")
    key = legacy = None
    if item.document_id is not None and item.update_mode == "append":
        # one more part of the document (Hermes Agent sends each new chat turn so): keyed by its text, so a
        # retried append stores nothing twice and a new part is never taken for an earlier one
        key = derived_key(bank, "append", item.document_id, hashlib.sha256(text.encode()).hexdigest())
    elif item.document_id is not None:
        index = per_document.get(item.document_id, 0)
        per_document[item.document_id] = index + 1
        key = derived_key(bank, "document", item.document_id, index)
        legacy = legacy_document_key(bank, item.document_id, index)
    elif operation_id is not None:
        key = derived_key(bank, "operation", operation_id, n)
    meta = {
        k: v
        for k, v in {
            "context": item.context,
            "metadata": item.metadata,
            "document_id": item.document_id,
            "operation_id": operation_id,
        }.items()
        if v is not None
    }
    stored = {store.META: meta} if meta else {}
    check_write(
        request,
        max_text_bytes=services.settings.max_text_bytes,
        agent_id=bank,
        text=text,
        metadata=stored,
        key=key,
        key_is_derived=True,  # derived just above, from this bank's document or operation
        what=f"items.{n}.content",
        metadata_what=f"items.{n}: context and metadata",
    )
    moment = item.timestamp if isinstance(item.timestamp, datetime) else None
    fields = {
        "agent_id": bank,
        "text": text,
        "run_id": item.document_id,
        "tags": tags,
        "metadata": stored,
        "idempotency_key": key,
        "said": moment,
    }
    return Prepared(fields, legacy)


@router.post(PREFIX + "/banks/{bank_id}/memories", response_model=HsRetainResponse)
async def retain(
    bank_id: BankId, body: HsRetainRequest, request: Request, team: Writer, services: ServicesDep
) -> HsRetainResponse:
    """Each item is a remember: committed to the journal before this answers, recallable by its words at once,
    its facts extracted in the background. `async` changes only the answer (an operation id to poll)."""
    check_agent(request, bank_id)
    operation_id = (body.operation_id or str(uuid.uuid4())) if body.is_async else None
    fields = _prepared(request, bank_id, body, services, operation_id)
    olds = {p.legacy_key: p.fields["run_id"] for p in fields if p.legacy_key is not None}
    replays = await services.off_loop(store.legacy_replays, services, team, bank_id, olds) if olds else set()
    created_any = False
    pinned = request.state.caller.agent_id is not None  # as /v1/remember: facts decide among its agent's only
    for one, legacy in fields:
        if legacy in replays:  # this very item, stored before derived keys: a replay, as its new key would be
            continue
        memory, created, _ = await services.off_loop(services.remember, team=team, pinned=pinned, **one)
        if not created and memory.agent_id != bank_id:
            raise HTTPException(409, "idempotency key already used in this team by another agent")
        created_any = created_any or created
    if created_any:
        services.saved()
    return HsRetainResponse(
        success=True,
        bank_id=bank_id,
        items_count=len(fields),
        is_async=body.is_async,
        operation_id=operation_id,
        operation_ids=[operation_id] if operation_id else None,
    )


def _results(hits: list[Hit], memories: dict[str, Memory | None]) -> list[HsRecallResult]:
    out = []
    for hit in hits:
        memory = memories.get(hit.memory_id)
        meta = store.hs_meta(memory) if memory is not None else {}
        out.append(
            HsRecallResult(
                id=hit.fact_id or hit.memory_id,
                text=hit.text,
                type=TYPES.get(hit.kind, "world"),
                context=meta.get("context"),
                occurred_start=store.iso_of(memory.occurred_at) if memory is not None else None,
                mentioned_at=store.iso_of(hit.created_at),
                document_id=store.document_id_of(memory) if memory is not None else None,
                metadata=meta.get("metadata"),
                tags=hit.tags,
            )
        )
    return out


@router.post(PREFIX + "/banks/{bank_id}/memories/recall", response_model=HsRecallResponse)
async def recall(
    bank_id: BankId, body: HsRecallRequest, request: Request, team: Team, services: ServicesDep
) -> HsRecallResponse:
    """A /v1/recall within the bank: types pick the kinds, tags_match filters, max_tokens bounds the texts."""
    agent_scope(request, bank_id)
    if body.tag_groups:
        raise _not_served("tag_groups (use tags with tags_match)")
    types = body.types or ["world", "experience"]
    if not services.settings.consolidate:  # no consolidated items: observations are the facts, deduplicated
        types = ["world" if t == "observation" else t for t in types]  # at extraction (Hermes asks for them)
    kinds = tuple(dict.fromkeys(KINDS[t] for t in types))
    k = K_OF_BUDGET[body.budget or "mid"]
    wanted = body.tags or []
    exact_pushdown = body.tags_match in ("all_strict", "exact")
    query = RecallQuery(
        team=team,
        query=body.query,
        k=k if body.tags_match == "all_strict" or not wanted else 100,
        kinds=kinds,
        agent_id=bank_id,
        tags=tuple(wanted) if exact_pushdown else (),
    )

    def narrow(hits: list[Hit]) -> list[Hit]:
        if wanted:
            hits = [h for h in hits if hindsight_docs._tags_match(h.tags, wanted, body.tags_match)]
        elif body.tags_match == "exact":
            hits = [h for h in hits if not h.tags]
        return hits[:k]

    hits = (await services.recall(query, body.max_tokens, narrow)).hits
    ids = list(dict.fromkeys(h.memory_id for h in hits))
    memories = await services.off_loop(lambda: {i: services.memory(team, i) for i in ids})
    return HsRecallResponse(results=_results(hits, memories))


@router.get(PREFIX + "/banks/{bank_id}/operations/{operation_id}", response_model=HsOperationStatus)
async def operation_status(
    bank_id: BankId, operation_id: str, request: Request, team: Team, services: ServicesDep
) -> HsOperationStatus:
    """completed once every item's extraction is done, failed if one failed, else pending or processing."""
    agent_scope(request, bank_id)
    if len(operation_id) > 128 or not _SEGMENT.fullmatch(operation_id):
        raise HTTPException(422, f"path.operation_id: {SEGMENT_RULE}")
    memories = await services.off_loop(store.operation, services, team, bank_id, operation_id)
    if not memories:
        raise HTTPException(404, f"no operation {operation_id!r} among bank {bank_id!r}'s recent retains")
    states = {m.status for m in memories}
    status = "failed" if FAILED in states else "completed" if states == {DONE} else "pending"
    if status == "pending" and "extracting" in states:
        status = "processing"
    failed = next((m.last_error for m in memories if m.status == FAILED), None)
    done_at = max((m.finished_at or 0 for m in memories), default=0) if status == "completed" else None
    return HsOperationStatus(
        operation_id=operation_id,
        status=cast(Any, status),
        created_at=store.iso_of(min(m.created_at for m in memories)),
        completed_at=store.iso_of(done_at) if done_at else None,
        error_message=failed,
    )


@router.get("/version", response_model=HsVersion)
async def version(team: Team, services: ServicesDep) -> HsVersion:
    """Hindsight's capability probe: the API version served and which of its features are on."""
    return HsVersion(features=HsFeatures(observations=services.settings.consolidate))


router.include_router(hindsight_docs.router)

_SUBRESOURCES = frozenset({"chunks", "history", "reprocess"})


@router.api_route(PREFIX + "/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def not_served(rest: str, team: Team) -> None:
    """The rest of Hindsight (reflect, mental models, entities, directives...): 501 naming what is served. An
    id that could never be one (`..`, a `/` inside a document id, too long) is a 422 first."""
    parts = rest.split("/")
    if parts[0] == "banks" and len(parts) > 1:
        bank = parts[1]
        if len(bank) > 128 or not _SEGMENT.fullmatch(bank):
            raise HTTPException(422, f"path.bank_id: {SEGMENT_RULE}")
        if len(parts) > 3 and parts[2] == "documents":
            doc = parts[3:]
            if len(doc) > 2 or (len(doc) == 2 and doc[1] not in _SUBRESOURCES) or not _SEGMENT.fullmatch(doc[0]):
                raise HTTPException(422, f"path.document_id: {SEGMENT_RULE}")
    if any(p in ("", ".", "..") for p in parts):
        raise HTTPException(422, "the path holds an empty, '.' or '..' segment")
    raise _not_served(f"/v1/default/{rest[:200]}")
