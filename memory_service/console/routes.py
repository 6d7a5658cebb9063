"""The console's pages: memories (list, search, one memory), jobs, limits and handled keys.

Each page resolves its team exactly as the API does (same keys, constant-time compare) and reads
through the same stores; every POST checks its origin and CSRF token first.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader

from ..api import cursor as cursors
from ..api import errors
from ..api.auth import caller_of_key, open_access
from ..api.routes.memories import memory_out
from ..contract.boundary import text_problem
from ..contract.limit_rules import InvalidInput, LimitNotFound
from ..contract.models import MemoryOut
from ..contract.roles import role_allows
from ..services import SESSION_TTL_S, ListFilter, RecallQuery
from . import charts, pages
from .session import (
    COOKIE,
    COOKIE_PATH,
    CsrfRejected,
    LoginRequired,
    Session,
    checked_form,
    cookie_secure,
    login_token,
    new_secret,
    read_form,
    require_session,
    resolve,
    safe_next,
    same_origin,
    token_matches,
)

if TYPE_CHECKING:
    from ..services import LimitsAndKeys, Services

HERE = Path(__file__).parent
PAGE_SIZE = 50
JOBS_SHOWN = 100
SEARCH_K = 20
REFRESH_S = 2
# the pages load only what the service itself serves, and nothing may frame them
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True)
_env.filters.update(when=pages.when, local_time=pages.local_time)
# the pictures: inline SVG, escaped
_env.globals.update(bar=charts.bar, columns=charts.columns, progress=pages.progress, score_bar=pages.score_bar)
templates = Jinja2Templates(env=_env)

router = APIRouter(prefix="/ui", include_in_schema=False)
SessionDep = Annotated[Session, Depends(require_session)]


def render(
    request: Request, name: str, session: Session | None, status_code: int = 200, **context: Any
) -> HTMLResponse:
    return templates.TemplateResponse(
        request, name, {"session": session, **context}, status_code=status_code, headers=HEADERS
    )


def services_of(request: Request) -> Services:
    return request.app.state.services


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


# ---------------------------------------------------------------- login


@router.get("")
async def root() -> RedirectResponse:
    return see_other("/ui/memories")


@router.get("/login")
async def login_form(request: Request, next: str = "") -> Response:
    if await services_of(request).off_loop(resolve, request) is not None:  # the key store, off the loop
        return see_other(safe_next(next))
    return render(request, "login.html", None, next=safe_next(next), csrf=login_token(request))


@router.post("/login")
async def login(request: Request) -> Response:
    form = await read_form(request)
    target = safe_next(form.get("next"))
    if not same_origin(request) or not token_matches(form.get("csrf", ""), login_token(request)):
        raise CsrfRejected("login form from elsewhere")
    services = services_of(request)
    if await services.off_loop(open_access, services):  # the key store is read off the event loop
        return see_other(target)
    key = form.get("key", "").strip()
    caller = await services.off_loop(caller_of_key, services, key) if key else None
    if caller is None or caller.agent_id is not None:  # the console shows the whole team: not a pinned key's
        error = "Unknown API key." if caller is None else "This key is pinned to an agent: use a team key."
        return render(request, "login.html", None, 401, next=target, csrf=login_token(request), error=error)
    planted = request.cookies.get(COOKIE)
    if planted:  # whatever the browser held before is ended, never carried on: a fresh session id each login
        await services.off_loop(services.end_console_session, planted)
    session = await services.off_loop(services.open_console_session, key)
    response = see_other(target)
    response.set_cookie(
        COOKIE,
        session,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=cookie_secure(request),
        max_age=int(SESSION_TTL_S),
    )
    return response


@router.post("/logout")
async def logout(request: Request, session: SessionDep) -> Response:
    await checked_form(request, session)
    services = services_of(request)
    if not session.keyless:  # ended server-side: the cookie's value opens nothing any more
        await services.off_loop(services.end_console_session, request.cookies.get(COOKIE, ""))
    response = see_other("/ui/login")
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict", secure=cookie_secure(request))
    return response


# ---------------------------------------------------------------- memories


@router.get("/memories")
async def memories(
    request: Request,
    session: SessionDep,
    agent_id: str = "",
    status: str = "",
    tag: str = "",
    since: str = "",
    until: str = "",
    q: str = "",
    cursor: str = "",
) -> Response:
    """The list, newest first with filters; with `q`, recall's ranked hits and their scores instead."""
    services = services_of(request)
    filters = {"agent_id": agent_id.strip(), "status": status, "tag": tag.strip(), "since": since, "until": until}
    context: dict[str, Any] = {"filters": filters, "q": q, "statuses": pages.STATUSES}
    try:
        if status and status not in pages.STATUSES:
            raise pages.BadFilter(f"status: one of {', '.join(pages.STATUSES)}")
        if len(filters["agent_id"]) > 128 or len(filters["tag"]) > 64 or len(q) > 4096:
            raise pages.BadFilter("a filter or the search is too long")
        if problem := next(filter(None, map(text_problem, (q, filters["agent_id"], filters["tag"]))), None):
            raise pages.BadFilter(f"a filter or the search {problem}")  # the API's text boundary
        lo, hi = pages.parse_time(since, "since"), pages.parse_time(until, "until")
        if lo is not None and hi is not None and lo > hi:
            raise pages.BadFilter("since is after until: the time window is empty")
        after = cursors.decode(cursor) if cursor else None
    except (pages.BadFilter, ValueError, HTTPException) as exc:
        message = exc.detail if isinstance(exc, HTTPException) else str(exc)
        return render(request, "memories.html", session, 422, error=message, items=[], hits=None, **context)
    team = session.team
    context["facets"] = await services.off_loop(services.facets, team, 50)
    if q.strip():
        query = RecallQuery(
            team=team,
            query=q,
            k=SEARCH_K,
            agent_id=filters["agent_id"] or None,
            tags=(filters["tag"],) if filters["tag"] else (),
            since=lo,
            until=hi,
        )
        hits = await services.recall_hits(query)
        return render(request, "memories.html", session, items=[], hits=hits, **context)
    flt = ListFilter(
        agent_id=filters["agent_id"] or None, status=status or None, tag=filters["tag"] or None, since=lo, until=hi
    )
    items, nxt = await services.off_loop(services.list_memories, team, flt, limit=PAGE_SIZE, after=after)
    kept = {k: v for k, v in filters.items() if v}
    next_url = f"/ui/memories?{urlencode({**kept, 'cursor': cursors.encode(nxt)})}" if nxt else None
    pending = any(i.memory.status in pages.PENDING for i in items)
    return render(
        request,
        "memories.html",
        session,
        items=items,
        hits=None,
        next_url=next_url,
        refresh=REFRESH_S if pending else None,
        **context,
    )


@router.get("/memories/{memory_id}")
async def memory(request: Request, memory_id: str, session: SessionDep) -> Response:
    services = services_of(request)
    out = await memory_out(services, session.team, memory_id) if len(memory_id) <= 128 else None
    if out is None:
        return render(request, "missing.html", session, 404, what=f"No memory with id {memory_id!r} in this team.")
    replaced_ids = [f.superseded_by for f in out.facts if f.superseded_by]
    replaced = await services.off_loop(services.facts_by_ids, session.team, replaced_ids)
    # the marks and the page are built in a thread: a memory with many spans must not hold the event loop
    return await services.off_loop(_memory_page, request, session, out, {i: f.text for i, f in replaced.items()})


def _memory_page(request: Request, session: Session, out: MemoryOut, replaced: dict[str, str]) -> Response:
    page = pages.memory_page(out, replaced)
    return render(
        request, "memory.html", session, page=page, m=out, refresh=REFRESH_S if out.status in pages.PENDING else None
    )


@router.post("/memories/{memory_id}/retry")
async def retry(request: Request, memory_id: str, session: SessionDep) -> Response:
    """Queue a failed job again, due now; only the team's own failed jobs can be retried."""
    form = await checked_form(request, session)
    if not role_allows(session.role, "write"):
        return render(
            request,
            "missing.html",
            session,
            403,
            what=f"This key has role '{session.role}'; retrying a job needs role 'write' or above.",
        )
    services = services_of(request)
    queued = await services.off_loop(services.retry, session.team, memory_id)
    if not queued:
        return render(request, "missing.html", session, 404, what=f"No failed job {memory_id!r} in this team.")
    services.saved()
    return see_other(safe_next(form.get("next") or f"/ui/memories/{memory_id}"))


# ---------------------------------------------------------------- jobs, limits, handled keys


@router.get("/jobs")
async def jobs(request: Request, session: SessionDep) -> Response:
    services = services_of(request)
    team, model = session.team, services.primary_model
    counts = await services.off_loop(services.status_counts, team)
    backlog = await services.off_loop(services.backlog, team)  # the team's own: no other team's queue
    lists = {}
    for status in ("extracting", "queued", "failed"):
        lists[status], _ = await services.off_loop(
            services.list_memories, team, ListFilter(status=status), limit=JOBS_SHOWN
        )
    estimate, basis = services.estimate(*backlog)
    pending = counts["queued"] + counts["extracting"]
    # the team's own hour (the ring keeps each team apart), its last column today's count
    depth, finished = pages.hour_of_jobs(services.metrics.history.buckets(team, pending))
    speed = pages.speed(model.throughput.snapshot(), services.settings)
    # the team's webhook deliveries (docs/webhooks.md); the URLs are an admin's business, as in the API
    webhooks = await services.off_loop(services.webhooks.subscriptions, team) if session.role == "admin" else None
    return render(
        request,
        "jobs.html",
        session,
        webhooks=webhooks,
        counts=counts,
        backlog=backlog,
        lists=lists,
        estimate=estimate,
        basis=basis,
        speed=speed,
        depth=depth,
        finished=finished,
        sample_s=services.metrics.history.sample_s,
        model_ready=model.ready,
        refresh=REFRESH_S if pending else None,
    )


@router.get("/limits")
async def limits(request: Request, session: SessionDep) -> Response:
    services = services_of(request)
    views = await services.off_loop(_limit_views, services, session.team)  # errors: `error_page`
    return render(
        request, "limits.html", session, views=views, week_days=pages.WEEK_DAYS, agent_weeks=pages.AGENT_WEEKS
    )


def _limit_views(services: LimitsAndKeys, team: str) -> list[pages.LimitPicture]:
    """Every limit with today's usage and its last week; per-agent limits with each agent's counter (the list
    leaves them out) and the busiest agents' weeks."""
    out = []
    for listed in services.list_limits(team):
        try:
            agent_view = partial(services.limit_view, team, listed.name, days=pages.WEEK_DAYS)
            out.append(pages.limit_picture(agent_view(None), agent_view))
        except LimitNotFound:  # deleted meanwhile
            continue
    return out


@router.get("/handled")
async def handled(request: Request, session: SessionDep, key: str = "", agent_id: str = "") -> Response:
    """Look a key up in the team's ledger (or an agent's), the way an agent would before acting."""
    context: dict[str, Any] = {"key": key, "agent_id": agent_id, "record": None, "looked": bool(key)}
    if not key:
        return render(request, "handled.html", session, **context)
    try:  # the store checks the key and the agent id by the API's own rules
        services = services_of(request)
        context["record"] = await services.off_loop(services.handled_record, session.team, key, agent_id or None)
    except InvalidInput as exc:  # shown beside the form, with the API's status and words
        problem = errors.classify(exc)
        return render(request, "handled.html", session, problem.status, error=problem.detail, **context)
    return render(request, "handled.html", session, **context)


# ---------------------------------------------------------------- mounting


def error_page(request: Request, problem: errors.Problem, request_id: str | None) -> Response:
    """An error of a console page, classified as the API classifies it, as a page: a bug is a 500 page
    with the request id to quote, busy storage a 503 page that says to retry."""
    headers = {**HEADERS, **problem.headers}
    context = {"session": None, "problem": problem, "request_id": request_id if problem.status >= 500 else None}
    return templates.TemplateResponse(request, "error.html", context, status_code=problem.status, headers=headers)


def mount(app: FastAPI) -> None:
    """Add the console to the app: its routes, its static files, its session secret and error pages."""
    app.state.console_secret = new_secret()
    errors.render_pages_under(app, router.prefix, error_page)
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="console-static")

    async def to_login(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LoginRequired)
        return see_other("/ui/login?" + urlencode({"next": safe_next(exc.next_path)}))

    async def refused(request: Request, exc: Exception) -> Response:
        return render(
            request,
            "missing.html",
            None,
            403,
            what="Refused: the form did not come from this console (missing or stale CSRF token). "
            "Reload the page and try again.",
        )

    app.add_exception_handler(LoginRequired, to_login)
    app.add_exception_handler(CsrfRejected, refused)
