"""Hindsight's document and bank routes, on this service's memories: a bank is an agent of the caller's team, a
document is a run of that agent (see hindsight_store.py and docs/hindsight.md)."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request

from ...contract.hindsight import (
    HsBankList,
    HsBankListItem,
    HsBankProfile,
    HsCreateBank,
    HsDeleteDocument,
    HsDocument,
    HsDocumentList,
    HsDocumentListItem,
)
from ...contract.types import Tag
from ..auth import Admin, Team, Writer, agent_scope, check_agent
from ..deps import ServicesDep
from . import hindsight_store as store
from .hindsight_store import PREFIX, BankId, DocumentId

router = APIRouter(tags=["hindsight"], include_in_schema=False)


def _list_item(bank: str, doc: store.Document) -> HsDocumentListItem:
    memories = doc.memories
    return HsDocumentListItem(
        id=doc.id,
        bank_id=bank,
        created_at=store.iso_of(memories[0].created_at) or "",
        updated_at=store.iso_of(memories[-1].created_at) or "",
        text_length=len(doc.text),
        memory_unit_count=doc.facts,
        document_metadata=doc.metadata() or None,
        tags=doc.tags,
    )


def _tags_match(have: list[str], want: list[str], how: str) -> bool:
    """Hindsight's tags_match: any/all also take untagged items, the _strict forms do not, exact is equality."""
    if not want:
        return how != "exact" or not have
    has, wanted = set(have), set(want)
    if how == "exact":
        return has == wanted
    if not has and how in ("any", "all"):
        return True
    return bool(has & wanted) if how.startswith("any") else wanted <= has


@router.get(PREFIX + "/banks/{bank_id}/documents", response_model=HsDocumentList)
async def list_documents(
    bank_id: BankId,
    request: Request,
    team: Team,
    services: ServicesDep,
    q: Annotated[str | None, Query(max_length=256)] = None,
    tags: Annotated[list[Tag] | None, Query(max_length=32)] = None,
    tags_match: Annotated[str, Query(pattern="^(any|all|any_strict|all_strict|exact)$")] = "any",
    limit: Annotated[int, Query(ge=0, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> HsDocumentList:
    """The bank's documents, the most recently written first."""
    agent_scope(request, bank_id)
    docs, capped = await services.off_loop(store.documents, services, team, bank_id)
    needle = (q or "").lower()
    chosen = [
        d
        for d in docs
        if (not needle or needle in d.id.lower() or needle in d.text.lower())
        and (tags is None or _tags_match(d.tags, tags, tags_match))
    ]
    page = [_list_item(bank_id, d) for d in chosen[offset : offset + limit]]
    return HsDocumentList(items=page, total=len(chosen), limit=limit, offset=offset, total_is_estimate=capped)


async def _document(services: ServicesDep, request: Request, team: str, bank: str, doc_id: str) -> store.Document:
    agent_scope(request, bank)
    doc = await services.off_loop(store.document, services, team, bank, doc_id)
    if doc is None:
        raise HTTPException(404, f"no document {doc_id!r} in bank {bank!r}")
    return doc


@router.get(PREFIX + "/banks/{bank_id}/documents/{document_id}", response_model=HsDocument)
async def get_document(
    bank_id: BankId, document_id: DocumentId, request: Request, team: Team, services: ServicesDep
) -> HsDocument:
    """A document: its texts joined in the order they were retained."""
    doc = await _document(services, request, team, bank_id, document_id)
    item = _list_item(bank_id, doc)
    return HsDocument(
        id=doc.id,
        bank_id=bank_id,
        original_text=doc.text,
        content_hash=hashlib.sha256(doc.text.encode("utf-8")).hexdigest(),
        created_at=item.created_at,
        updated_at=item.updated_at,
        memory_unit_count=item.memory_unit_count,
        tags=item.tags,
        document_metadata=item.document_metadata,
    )


@router.delete(PREFIX + "/banks/{bank_id}/documents/{document_id}", response_model=HsDeleteDocument)
async def delete_document(
    bank_id: BankId, document_id: DocumentId, request: Request, team: Admin, services: ServicesDep
) -> HsDeleteDocument:
    """Forget every memory of the document (as DELETE /v1/memories/{id} does each: an admin key's act)."""
    doc = await _document(services, request, team, bank_id, document_id)
    ids = [m.id for m in doc.memories]
    deleted = await services.off_loop(services.forget, team, memory_ids=ids)
    return HsDeleteDocument(
        success=True,
        message=f"forgot {len(deleted)} memories of document {document_id!r}",
        document_id=document_id,
        memory_units_deleted=len(deleted),
    )


@router.get(PREFIX + "/banks", response_model=HsBankList)
async def list_banks(
    request: Request,
    team: Team,
    services: ServicesDep,
    q: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=0, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> HsBankList:
    """The team's agents that hold memories (a pinned key: its own agent only), busiest first."""
    agent_id = agent_scope(request, None)
    facets = await services.off_loop(services.facets, team, 1000, agent_id)
    banks = [HsBankListItem(bank_id=a, name=a, fact_count=n) for a, n in facets.agents]
    if q:
        banks = [b for b in banks if q.lower() in b.bank_id.lower()]
    return HsBankList(banks=banks[offset : offset + limit], total=len(banks), limit=limit, offset=offset)


@router.put(PREFIX + "/banks/{bank_id}", response_model=HsBankProfile)
async def create_bank(bank_id: BankId, body: HsCreateBank, request: Request, team: Writer) -> HsBankProfile:
    """A bank needs no creation here (it is an agent id): the id is checked and the profile answered; the bank
    is listed once it holds a memory. Profile settings (mission, disposition...) are not kept."""
    check_agent(request, bank_id)
    return HsBankProfile(bank_id=bank_id, name=body.name or bank_id)


@router.get(PREFIX + "/banks/{bank_id}/profile", response_model=HsBankProfile)
async def bank_profile(bank_id: BankId, request: Request, team: Team) -> HsBankProfile:
    agent_scope(request, bank_id)
    return HsBankProfile(bank_id=bank_id, name=bank_id)
