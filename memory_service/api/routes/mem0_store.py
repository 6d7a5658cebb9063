"""How a memory of this service reads as a mem0 memory, and what the mem0 routes read from the journal.
Blocking functions: call them in a thread.

A mem0 memory is one saved text (its id, `mem_...`). What mem0's add said beside the text (its entity ids,
its metadata, the versions an update replaced) is kept in the memory's metadata under `mem0`; the entity ids
are also the memory's agent (agent_id) and tags (`user:`, `app:`, `run:`), which is what filters select on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ...contract.mem0 import TAGGED, Scope
from ...services import ListFilter, Memory
from .hindsight_store import memories_of

if TYPE_CHECKING:
    from ...services import Services

META = "mem0"
DEFAULT_AGENT = "mem0"  # the agent of a memory added without agent_id (by a key not pinned to an agent)
SCAN_CAP = 10_000  # memories a listing reads at most to count and page (past it, count is a lower bound)
MAX_VERSIONS = 10  # earlier versions an update keeps for history
MAX_VERSION_CHARS = 400  # of each earlier version's text


def iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC).isoformat()


def meta_of(memory: Memory) -> dict[str, Any]:
    value = memory.metadata.get(META)
    return value if isinstance(value, dict) else {}


def text_of(messages: list[Any]) -> str:
    """One message is its content, verbatim; several are `role: content` lines (the speaker rule reads them)."""
    if len(messages) == 1:
        return str(messages[0].content)
    return "\n".join(f"{m.role}: {m.content}" for m in messages)


def stored_meta(scope: Scope, metadata: dict[str, Any] | None, previous: list[dict[str, Any]]) -> dict[str, Any]:
    inner: dict[str, Any] = {**scope.entities(), "metadata": metadata or {}}
    if previous:
        inner["previous"] = previous[-MAX_VERSIONS:]
    return {META: inner}


def versions_before(memory: Memory) -> list[dict[str, Any]]:
    """The earlier versions an update of `memory` keeps: its own, after those it replaced."""
    own = {"id": memory.id, "memory": memory.text[:MAX_VERSION_CHARS], "at": memory.created_at}
    kept = [v for v in meta_of(memory).get("previous", []) if isinstance(v, dict)]
    return [*kept, own][-MAX_VERSIONS:]


def shape(memory: Memory) -> dict[str, Any]:
    """The memory as mem0's platform answers one (get, get_all, update), plus this service's status and facts
    count where they help; ids mem0 did not name are null."""
    meta = meta_of(memory)
    from_mem0 = bool(meta)
    previous = meta.get("previous") or []
    updated = memory.created_at if previous else None
    return {
        "id": memory.id,
        "memory": memory.text,
        "user_id": meta.get("user_id"),
        "agent_id": None if from_mem0 and memory.agent_id == DEFAULT_AGENT else memory.agent_id,
        "app_id": meta.get("app_id"),
        "run_id": memory.run_id,
        "session_id": memory.run_id,
        "metadata": meta.get("metadata") if from_mem0 else memory.metadata,
        "categories": [],
        "created_at": iso(min([memory.created_at, *(v.get("at", memory.created_at) for v in previous)])),
        "updated_at": iso(updated if updated is not None else memory.created_at),
        "expiration_date": None,
        "status": memory.status,
    }


def history(memory: Memory) -> list[dict[str, Any]]:
    """ADD for the first version, UPDATE for each later one, oldest first (the kept versions only)."""
    meta = meta_of(memory)
    versions = [*(v for v in meta.get("previous", []) if isinstance(v, dict)), {"memory": memory.text}]
    versions[-1]["at"] = memory.created_at
    now = shape(memory)
    entities = {k: now[k] for k in ("user_id", "agent_id", "app_id", "run_id")}
    out: list[dict[str, Any]] = []
    for n, version in enumerate(versions):
        out.append(
            {
                "id": f"{memory.id}-{n}",
                "memory_id": memory.id,
                "input": [],
                "old_memory": versions[n - 1].get("memory") if n else None,
                "new_memory": version.get("memory"),
                "event": "UPDATE" if n else "ADD",
                **entities,
                "session_id": entities["run_id"],
                "categories": [],
                "metadata": now["metadata"],
                "created_at": iso(version.get("at")),
                "updated_at": iso(version.get("at")),
            }
        )
    return out


def matches(memory: Memory, scope: Scope) -> bool:
    """Whether a memory carries every entity id of `scope` (agent and run in their columns or as given)."""
    if scope.agent_id is not None and memory.agent_id != scope.agent_id:
        return False
    return all(tag in memory.tags for tag in scope.tags() if not tag.startswith(TAGGED["run_id"])) and (
        scope.run_id is None or memory.run_id == scope.run_id or TAGGED["run_id"] + scope.run_id in memory.tags
    )


def listing(services: Services, team: str, scope: Scope, page: int, size: int) -> tuple[list[Memory], int]:
    """The page'th `size` memories of `scope`, newest first, and how many there are (up to SCAN_CAP)."""
    tags = [t for t in scope.tags() if not t.startswith(TAGGED["run_id"])]
    flt = ListFilter(
        agent_id=scope.agent_id,
        run_id=scope.run_id,
        tag=tags[0] if tags else None,
        since=scope.since,
        until=scope.until,
    )
    first = (page - 1) * size
    count = 0
    out: list[Memory] = []
    for listed in memories_of(services, team, flt, SCAN_CAP):
        if not matches(listed.memory, scope):
            continue
        if first <= count < first + size:
            out.append(listed.memory)
        count += 1
    return out, count


def selected(services: Services, team: str, scope: Scope) -> list[str]:
    """The ids of every memory `scope` selects (for delete_all), up to SCAN_CAP."""
    return [m.id for m in listing(services, team, scope, 1, SCAN_CAP)[0]]
