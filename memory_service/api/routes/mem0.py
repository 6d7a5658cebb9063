"""mem0's platform API (the part `mem0ai`'s `MemoryClient` and `AsyncMemoryClient` call), under /mem0, so code
on mem0's hosted client works against this service with `host="http://<service>/mem0"` and a key of ours.

A mem0 memory is one saved text; user, app and run ids become tags and agent_id the memory's agent
(docs/mem0.md). The team comes from the key alone (mem0's `Authorization: Token <key>` or our Bearer):
no id, filter or metadata field can reach another team. Anything else mem0 serves answers 501 naming what is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request

from ...config import Settings
from ...contract.ids import MAX_MEMORY_ID_LEN, MEMORY_ID_PATTERN, MEMORY_ID_RULE
from ...contract.mem0 import (
    ANY,
    MAX_PAGE_SIZE,
    MAX_TOP_K,
    AddRequest,
    ListRequest,
    NotServed,
    Scope,
    SearchRequest,
    UpdateRequest,
    date_param,
    scope_of,
)
from ...contract.roles import Role
from ...services import DONE, FAILED, Memory, RecallQuery
from ..auth import BEARER_OR_TOKEN, Caller, agent_scope, hidden_from, open_access, requires
from ..deps import ServicesDep
from ..write_rules import check_write
from . import mem0_store as store

router = APIRouter(tags=["mem0"], include_in_schema=False)

PREFIX = "/mem0"
ORG = "memory-service"  # what ping names as the organization: mem0's clients need one


def _role(role: Role) -> Callable[[Request], Awaitable[str]]:
    """Our roles, with mem0's `Token` scheme too. Keyless (no key anywhere, loopback) any key is the local team's:
    mem0's clients refuse to start without one, and keyless mode trusts every local process anyway."""
    keyed = cast(Callable[[Request], Awaitable[str]], requires(role, BEARER_OR_TOKEN))

    async def dependency(request: Request) -> str:
        services = request.app.state.services
        if await services.off_loop(open_access, services):  # reads the key store: off the event loop
            request.state.caller = Caller(Settings.LOCAL_TEAM, "admin")
            return Settings.LOCAL_TEAM
        return await keyed(request)

    return dependency


Team = Annotated[str, Depends(_role("read"))]
Writer = Annotated[str, Depends(_role("write"))]
Admin = Annotated[str, Depends(_role("admin"))]
MemoryId = Annotated[
    str, Path(min_length=1, max_length=MAX_MEMORY_ID_LEN, pattern=MEMORY_ID_PATTERN, description=MEMORY_ID_RULE)
]
SERVED = (
    "served under /mem0: GET /v1/ping/, POST /v3/memories/add/ (and /v1/memories/), POST /v3/memories/search/ "
    "(and /v2/), POST /v3/memories/ (get_all, and /v2/), GET/PUT/DELETE /v1/memories/{id}/, DELETE /v1/memories/ "
    "(delete_all), GET /v1/memories/{id}/history/, GET /v1/event/{id}/ (see docs/mem0.md)"
)
INSTEAD = {
    "entities": "get_all(filters={'user_id': ...}) lists a user's memories; delete_all(user_id=...) forgets them",
    "batch": "update() and delete() one memory at a time",
    "exports": "this service's GET /v1/export (JSON Lines of the team's memories)",
    "summary": "search() or get_all()",
    "profiles": "search() or get_all()",
    "feedback": "nothing: feedback is not kept",
    "orgs": "`memory-service keys` (a key's team is its project; docs/security.md)",
    "webhooks": "this service's own API (docs/api.md)",
}
_STATUS = {"queued": "PENDING", "extracting": "RUNNING", DONE: "SUCCEEDED", FAILED: "FAILED"}


def _not_served(what: str, instead: str = "docs/mem0.md") -> HTTPException:
    return HTTPException(501, f"{what} is not served by memory-service's mem0 API; use {instead}. {SERVED}")


def _scope(filters: dict[str, Any] | None, base: Scope | None = None) -> Scope:
    try:
        return scope_of(filters, base)
    except NotServed as exc:
        raise _not_served(str(exc), "user_id, agent_id, app_id, run_id ('*' for any), AND, created_at") from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None


def _narrowed(request: Request, scope: Scope) -> Scope:
    """The scope a read or bulk change runs on: a pinned key's own agent (its agent has an id, so `*` is it
    too), else the agent as asked."""
    pinned = request.state.caller.agent_id
    agent = pinned if scope.agent_id == ANY and pinned is not None else scope.agent_id
    if agent != ANY:
        agent = agent_scope(request, agent)
    return replace(scope, agent_id=agent)


def _refuse_set(body: Any, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(body, name) not in (None, []):
            raise _not_served(name)


async def _visible(request: Request, services: ServicesDep, team: str, memory_id: str) -> Memory:
    """The team's memory (a pinned key's own agent's only), or a 404 as for an unknown id."""
    memory = await services.off_loop(services.memory, team, memory_id)
    if memory is None or hidden_from(request, memory.agent_id):
        raise HTTPException(404, f"no memory with id {memory_id!r} in this team")
    return memory


def _check(request: Request, services: ServicesDep, agent: str, text: str, stored: dict[str, Any]) -> None:
    """/v1/remember's rule (write_rules): sizes of the text and of the metadata as stored, the pinned agent."""
    check_write(
        request,
        max_text_bytes=services.settings.max_text_bytes,
        agent_id=agent,
        text=text,
        metadata=stored,
        what="the messages as one text",
        metadata_what="metadata (with the entity ids kept beside it)",
    )


@router.get(PREFIX + "/v1/ping/")
async def ping(team: Team) -> dict[str, Any]:
    """What the clients' constructors call to check the key. They refuse to start without an org and a project:
    the project is the key's team (its own name, which GET /v1/team shows it too)."""
    return {"status": "ok", "org_id": ORG, "project_id": team, "user_email": None}


@router.post(PREFIX + "/v3/memories/add/")
@router.post(PREFIX + "/v1/memories/")
async def add(body: AddRequest, request: Request, team: Writer, services: ServicesDep) -> dict[str, Any]:
    """The messages as one text, committed before this answers (infer or not: the text is the memory, its facts
    are extracted in the background); the entity ids become the memory's agent and tags."""
    _refuse_set(body, ("custom_categories", "custom_instructions", "agent_custom_instructions"))
    _refuse_set(body, ("structured_data_schema", "expiration_date"))
    given = Scope(user_id=body.user_id, agent_id=body.agent_id, app_id=body.app_id, run_id=body.run_id)
    scope = _scope(body.filters, given)
    if scope.since is not None or scope.until is not None:
        raise HTTPException(422, "filters on add name entity ids only, not created_at")
    if scope.wildcards():
        raise HTTPException(
            422, f"filters on add: '*' selects memories; name one id for {', '.join(scope.wildcards())}"
        )
    agent = scope.agent_id or request.state.caller.agent_id or store.DEFAULT_AGENT
    text = store.text_of(body.messages)
    stored = store.stored_meta(scope, body.metadata)
    _check(request, services, agent, text, stored)
    when = None if body.timestamp is None else datetime.fromtimestamp(body.timestamp, tz=UTC)
    memory, _, _ = await services.off_loop(
        services.remember,
        team=team,
        agent_id=agent,
        text=text,
        run_id=scope.run_id,
        tags=scope.tags(),
        metadata=stored,
        idempotency_key=None,
        said=when,
        pinned=request.state.caller.agent_id is not None,
    )
    services.saved()
    return {
        "results": [{"id": memory.id, "memory": text, "event": "ADD", "status": memory.status}],
        "event_id": memory.id,
        "status": "PENDING",
        "message": "committed; facts are extracted in the background (GET /v1/event/{event_id}/ shows when)",
    }


@router.post(PREFIX + "/v3/memories/search/")
@router.post(PREFIX + "/v2/memories/search/")
async def search(body: SearchRequest, request: Request, team: Team, services: ServicesDep) -> dict[str, Any]:
    """A recall within the filters' entities: facts and passages, each named by the memory it came from."""
    _refuse_set(body, ("categories",))
    scope = _narrowed(request, _scope(body.filters))
    query = RecallQuery(
        team=team,
        query=body.query,
        k=MAX_TOP_K if scope.wildcards() else body.top_k,  # '*' is checked on the hits: room for those it drops
        kinds=("fact", "passage"),
        agent_id=scope.concrete("agent_id"),
        tags=tuple(scope.tags()),
        since=scope.since,
        until=scope.until,
        min_score=body.threshold,
    )
    hits = await services.recall_hits(query)
    ids = list(dict.fromkeys(h.memory_id for h in hits))
    memories = await services.off_loop(lambda: {i: services.memory(team, i) for i in ids})
    results = []
    for hit in hits:
        memory = memories.get(hit.memory_id)
        if memory is None or not store.matches(memory, scope):  # forgotten since the search, or lacks a '*' id
            continue
        score = hit.similarity if hit.similarity is not None else hit.score
        one = store.shape(memory) | {"memory": hit.text, "score": round(score, 6), "type": hit.kind}
        results.append(one | {"fact_id": hit.fact_id})
    return {"results": results[: body.top_k]}


@router.post(PREFIX + "/v3/memories/")
@router.post(PREFIX + "/v2/memories/")
async def get_all(
    body: ListRequest,
    request: Request,
    team: Team,
    services: ServicesDep,
    page: Annotated[int, Query(ge=1, le=store.SCAN_CAP)] = 1,
    page_size: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 100,
) -> dict[str, Any]:
    """The filters' memories, newest first, a page at a time: mem0's envelope (count, next, previous)."""
    _refuse_set(body, ("categories",))
    if page * page_size > store.SCAN_CAP:
        raise HTTPException(422, f"page * page_size is past the {store.SCAN_CAP} memories a listing reads")
    try:
        since, until = date_param(body.start_date, "start_date"), date_param(body.end_date, "end_date")
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    scope = _scope(body.filters, Scope(since=since, until=until))
    if scope.since is not None and scope.until is not None and scope.since > scope.until:
        raise HTTPException(422, "the created_at window is empty (its start is after its end)")
    scope = _narrowed(request, scope)
    items, count = await services.off_loop(store.listing, services, team, scope, page, page_size)
    url = request.url
    more = page * page_size < count
    return {
        "count": count,
        "next": str(url.include_query_params(page=page + 1, page_size=page_size)) if more else None,
        "previous": str(url.include_query_params(page=page - 1, page_size=page_size)) if page > 1 else None,
        "results": [store.shape(m) for m in items],
    }


@router.get(PREFIX + "/v1/memories/{memory_id}/")
async def get(memory_id: MemoryId, request: Request, team: Team, services: ServicesDep) -> dict[str, Any]:
    return store.shape(await _visible(request, services, team, memory_id))


@router.get(PREFIX + "/v1/memories/{memory_id}/history/")
async def history(memory_id: MemoryId, request: Request, team: Team, services: ServicesDep) -> list[dict[str, Any]]:
    """ADD, then an UPDATE per update: a saved text never changes, so an update is a new version (see update)."""
    memory = await _visible(request, services, team, memory_id)
    return store.history(memory, await services.off_loop(services.versions, team, memory.id))


@router.put(PREFIX + "/v1/memories/{memory_id}/")
async def update(
    memory_id: MemoryId, body: UpdateRequest, request: Request, team: Admin, services: ServicesDep
) -> dict[str, Any]:
    """A saved text is never rewritten in place: the new text (or metadata) is saved as a new memory of the same
    agent, run and tags, the earlier versions are carried to it for history (rows of the journal, not its
    metadata), and the old one is forgotten. The answer is the new memory: its `id` is the one to use from now
    on."""
    _refuse_set(body, ("timestamp", "expiration_date"))
    if body.text is None and body.metadata is None:
        raise HTTPException(422, "update needs text or metadata")
    old = await _visible(request, services, team, memory_id)
    text = body.text if body.text is not None else old.text
    meta = store.meta_of(old)
    kept = meta.get("metadata") if meta else old.metadata  # a memory saved by /v1/remember keeps its own
    metadata = body.metadata if body.metadata is not None else kept
    scope = Scope(**{k: meta.get(k) for k in ("user_id", "agent_id", "app_id", "run_id")})
    stored = store.stored_meta(scope, metadata, store.first_at(old))
    _check(request, services, old.agent_id, text, stored)
    new, _, _ = await services.off_loop(
        services.remember,
        team=team,
        agent_id=old.agent_id,
        text=text,
        run_id=old.run_id,
        tags=old.tags,
        metadata=stored,
        idempotency_key=None,
        occurred_at=old.occurred_at,
        occurred_day=old.occurred_day,
        pinned=request.state.caller.agent_id is not None,
    )
    services.saved()
    earlier = store.earlier_in_metadata(old)
    keep, chars = store.MAX_VERSIONS, store.MAX_VERSION_CHARS
    await services.off_loop(
        lambda: services.carry_versions(team, store.version_of(old), earlier, new.id, keep=keep, chars=chars)
    )
    await services.off_loop(services.forget, team, memory_ids=[old.id])
    return store.shape(new) | {"replaces": old.id}


@router.delete(PREFIX + "/v1/memories/{memory_id}/")
async def delete(memory_id: MemoryId, request: Request, team: Admin, services: ServicesDep) -> dict[str, Any]:
    await _visible(request, services, team, memory_id)
    if not await services.off_loop(services.forget, team, memory_ids=[memory_id]):
        raise HTTPException(404, f"no memory with id {memory_id!r} in this team")
    return {"message": "Memory deleted successfully!"}


Entity = Annotated[str | None, Query(max_length=64)]


@router.delete(PREFIX + "/v1/memories/")
async def delete_all(
    request: Request,
    team: Admin,
    services: ServicesDep,
    user_id: Entity = None,
    agent_id: Entity = None,
    app_id: Entity = None,
    run_id: Entity = None,
) -> dict[str, Any]:
    """Forget the memories of the given entities ('*': those that have the id, whatever its value, as in mem0).
    At least one is needed."""
    given = {k: v for k, v in {"user_id": user_id, "agent_id": agent_id, "app_id": app_id, "run_id": run_id}.items()}
    if all(v is None for v in given.values()):
        raise HTTPException(
            400, "delete_all needs user_id, agent_id, app_id or run_id ('*': every memory with that id)"
        )
    scope = _narrowed(request, _scope({k: v for k, v in given.items() if v is not None}))
    if scope.user_id is None and scope.app_id is None and not scope.wildcards() and (scope.agent_id or scope.run_id):
        deleted = await services.off_loop(services.forget, team, agent_id=scope.agent_id, run_id=scope.run_id)
    else:
        ids = await services.off_loop(store.selected, services, team, scope)
        deleted = await services.off_loop(services.forget, team, memory_ids=ids) if ids else []
    return {"message": "Memories deleted successfully!", "deleted": len(deleted)}


@router.get(PREFIX + "/v1/event/{event_id}/")
async def event(event_id: MemoryId, request: Request, team: Team, services: ServicesDep) -> dict[str, Any]:
    """An add's event is its memory: PENDING while queued, RUNNING while extracted, then SUCCEEDED or FAILED."""
    memory = await _visible(request, services, team, event_id)
    return {
        "id": memory.id,
        "event_type": "ADD",
        "status": _STATUS.get(memory.status, "PENDING"),
        "results": [{"id": memory.id, "memory": memory.text, "event": "ADD"}],
        "created_at": store.iso(memory.created_at),
        "completed_at": store.iso(memory.finished_at) if memory.status in (DONE, FAILED) else None,
    }


@router.api_route(PREFIX + "/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def not_served(rest: str, team: Team) -> None:
    """The rest of mem0's platform (entities, batches, exports, projects, webhooks...): 501 naming what is."""
    parts = [p for p in rest.split("/") if p]
    instead = next((INSTEAD[p] for p in parts if p in INSTEAD), "docs/mem0.md")
    raise _not_served(f"/mem0/{rest[:200]}", instead)
