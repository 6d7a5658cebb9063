"""How a memory of this service reads as a mem0 memory, and what the mem0 routes read from the journal.
Blocking functions: call them in a thread.

A mem0 memory is one saved text (its id, `mem_...`). What mem0's add said beside the text (its entity ids,
its metadata, and after an update when the first version was saved) is kept in the memory's metadata under
`mem0`; the entity ids are also the memory's agent (agent_id) and tags (`user:`, `app:`, `run:`), which is what
filters select on. The versions an update replaced are rows of the journal (storage/versions.py), not
metadata: metadata has an 8 KiB bound, which a few updates of a long note used to pass (issue 53).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ...contract.mem0 import TAGGED, Scope
from ...services import ListFilter, Memory, Version
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


def stored_meta(scope: Scope, metadata: dict[str, Any] | None, first_at: float | None = None) -> dict[str, Any]:
    """What a mem0 memory keeps in its metadata; `first_at`: an update's, when its first version was saved."""
    inner: dict[str, Any] = {**scope.entities(), "metadata": metadata or {}}
    if first_at is not None:
        inner["first_at"] = first_at
    return {META: inner}


def earlier_in_metadata(memory: Memory) -> list[Version]:
    """The versions a memory updated before issue 53 kept in its metadata (`previous`), oldest first."""
    out = []
    for v in meta_of(memory).get("previous", []):
        if isinstance(v, dict) and isinstance(v.get("memory"), str) and isinstance(v.get("at"), int | float):
            out.append(Version(str(v.get("id", "")), v["memory"], float(v["at"])))
    return out


def version_of(memory: Memory) -> Version:
    return Version(memory.id, memory.text[:MAX_VERSION_CHARS], memory.created_at)


def first_at(memory: Memory) -> float:
    """When the memory's first version was saved: its own save, unless an update replaced earlier ones."""
    meta = meta_of(memory)
    kept = meta.get("first_at")
    if isinstance(kept, int | float):
        return float(kept)
    return min([memory.created_at, *(v.at for v in earlier_in_metadata(memory))])


def shape(memory: Memory) -> dict[str, Any]:
    """The memory as mem0's platform answers one (get, get_all, update), plus this service's status and facts
    count where they help; ids mem0 did not name are null."""
    meta = meta_of(memory)
    from_mem0 = bool(meta)
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
        "created_at": iso(first_at(memory)),
        "updated_at": iso(memory.created_at),  # an update is a new memory: its save is the last change
        "expiration_date": None,
        "status": memory.status,
    }


def history(memory: Memory, earlier: list[Version]) -> list[dict[str, Any]]:
    """ADD for the first version, UPDATE for each later one, oldest first (the kept versions only): `earlier`
    are the memory's stored versions (or, for one updated before they were rows, those in its metadata)."""
    kept = earlier or earlier_in_metadata(memory)
    versions = [*((v.text, v.at) for v in kept), (memory.text, memory.created_at)]
    now = shape(memory)
    entities = {k: now[k] for k in ("user_id", "agent_id", "app_id", "run_id")}
    out: list[dict[str, Any]] = []
    for n, (text, at) in enumerate(versions):
        out.append(
            {
                "id": f"{memory.id}-{n}",
                "memory_id": memory.id,
                "input": [],
                "old_memory": versions[n - 1][0] if n else None,
                "new_memory": text,
                "event": "UPDATE" if n else "ADD",
                **entities,
                "session_id": entities["run_id"],
                "categories": [],
                "metadata": now["metadata"],
                "created_at": iso(at),
                "updated_at": iso(at),
            }
        )
    return out


def has_entity(memory: Memory, key: str) -> bool:
    """Whether the memory has id `key` at all, as `shape` shows it (what mem0's `*` asks for): an agent other
    than the stand-in for none, a run, or a `user:`/`app:`/`run:` tag."""
    if key == "agent_id":
        return shape(memory)["agent_id"] is not None
    if key == "run_id" and memory.run_id is not None:
        return True
    return any(tag.startswith(TAGGED[key]) for tag in memory.tags)


def matches(memory: Memory, scope: Scope) -> bool:
    """Whether a memory carries every entity id of `scope` (agent and run in their columns or as given), and
    has every id `scope` asks for as `*`."""
    agent, run = scope.concrete("agent_id"), scope.concrete("run_id")
    if agent is not None and memory.agent_id != agent:
        return False
    if not all(has_entity(memory, key) for key in scope.wildcards()):
        return False
    return all(tag in memory.tags for tag in scope.tags() if not tag.startswith(TAGGED["run_id"])) and (
        run is None or memory.run_id == run or TAGGED["run_id"] + run in memory.tags
    )


def listing(services: Services, team: str, scope: Scope, page: int, size: int) -> tuple[list[Memory], int]:
    """The page'th `size` memories of `scope`, newest first, and how many there are (up to SCAN_CAP)."""
    tags = [t for t in scope.tags() if not t.startswith(TAGGED["run_id"])]
    flt = ListFilter(
        agent_id=scope.concrete("agent_id"),
        run_id=scope.concrete("run_id"),
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
