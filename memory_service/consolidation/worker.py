"""The consolidation pass: runs only while no save waits, and gets out of a save's way at once.

Between groups it looks for a save (the wake event every save sets, and the journal's queue, which other
processes write too); while a model call is in flight it keeps looking and, when one arrives, cancels the
call: the call is streamed, so closing it stops llama-server at its next token and frees the slot, and
the save's extraction never queues behind consolidation. What a pass wrote stays; the next pass
recomputes what is due from the digests, so a stop or a yield anywhere resumes without writing a group
twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from ..config import Settings
from ..embedding.embedder import Embedder
from ..extraction.errors import ExtractionError, LlmUnavailable
from ..llm.client import LlamaClient
from ..llm.pool import ModelPool
from ..pipeline.vector_items import consolidated_item
from ..storage.consolidation import ConsolidationStore, Item
from ..storage.consolidation_runs import DONE, FAILED, INTERRUPTED, YIELDED
from ..storage.vectors import VectorItem, VectorStore
from . import summary
from .groups import GROUP_MAX_FACTS, Group, group_facts

log = logging.getLogger("memory_service.consolidation")

RECENT_FACTS = 2000  # a team's newest active facts a pass groups
QUIET_S = 2.0  # the queue must stay empty this long before a pass starts
IDLE_POLL_S = 1.0
NOTHING_DUE_S = 60.0  # after a pass with nothing to do, look again after a save or this long
YIELD_POLL_S = 0.1  # how often an in-flight call looks at the journal's queue
MAX_POINT_TOKENS = 256


class Yielded(Exception):
    """A save arrived: the pass stops here."""


@dataclass
class Consolidator:
    settings: Settings
    store: ConsolidationStore
    models: ModelPool
    embedder: Embedder
    vectors: VectorStore
    holder: str
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set by every save
    running: bool = False
    last_error: str | None = None

    async def run(self) -> None:
        # a data dir has one process: any run left running was cut off; on a shared database, only the
        # runs whose holder stopped beating
        alone = self.settings.database_url is None
        closed = await asyncio.to_thread(self.store.close_dead_runs, self.holder if alone else None)
        if closed:
            log.info("consolidation: %d run(s) cut off by a stop marked interrupted; resuming", closed)
        while True:
            try:
                await self._until_idle()
                if not await self.run_pass():
                    await _wait(self.wake, NOTHING_DUE_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the loop must outlive any bug in one pass
                self.last_error = repr(exc)
                log.exception("consolidation: unexpected error")
                await asyncio.sleep(5.0)

    async def _until_idle(self) -> None:
        """Until no save is queued or being extracted, and none arrived for `QUIET_S`."""
        while True:
            self.wake.clear()
            if await asyncio.to_thread(self.store.save_waiting):
                await _wait(self.wake, IDLE_POLL_S)
                continue
            await asyncio.sleep(QUIET_S)
            if not self.wake.is_set() and not await asyncio.to_thread(self.store.save_waiting):
                return

    async def _save_arrived(self) -> bool:
        return self.wake.is_set() or await asyncio.to_thread(self.store.save_waiting)

    async def run_pass(self) -> bool:
        """One pass over every team; True when it had work (done or yielded), False when nothing was due."""
        await asyncio.to_thread(self._finish_purges)
        due, removed = await asyncio.to_thread(self._plan)
        if not due:
            return removed > 0
        handle = self.models.primary
        await handle.wait_ready()
        run_id = await asyncio.to_thread(self.store.start_run, self.holder, len(due))
        log.info("consolidation run %s: %d group(s) due, %d stale item(s) removed", run_id, len(due), removed)
        written, outcome, detail = 0, DONE, None
        self.running = True
        try:
            for group in due:
                if await self._save_arrived():
                    raise Yielded
                points = await self._points(handle.client, group)
                item = _item(group, summary.line(group.subject, points))
                if await asyncio.to_thread(self.store.write, item):
                    await asyncio.to_thread(self._index, [item])
                    written += 1
                await asyncio.to_thread(self.store.beat, run_id, written, removed)
        except Yielded:
            outcome, detail = YIELDED, "a save arrived"
        except LlmUnavailable as exc:
            outcome, detail = FAILED, str(exc)
            await handle.went_down(str(exc))
        except asyncio.CancelledError:
            outcome, detail = INTERRUPTED, "the service stopped"
            raise
        except BaseException as exc:
            outcome, detail = FAILED, repr(exc)
            raise
        finally:
            self.running = False
            await asyncio.shield(asyncio.to_thread(self.store.end_run, run_id, outcome, written, removed, detail))
            log.info("consolidation run %s %s: %d item(s) written of %d due", run_id, outcome, written, len(due))
        return True

    def _plan(self) -> tuple[list[Group], int]:
        """The groups whose facts changed since their item was written (newest first), after removing the
        items whose facts are gone or superseded and the parts a subject no longer has."""
        due: list[Group] = []
        removed = 0
        for team in self.store.teams():
            removed += self.store.drop_stale(team)
            groups = group_facts(team, self.store.recent_facts(team, RECENT_FACTS))
            have = self.store.digests(team)
            due += [g for g in groups if have.get(g.id) != g.digest]
            grouped = {(g.agent_id, g.subject.lower()) for g in groups}
            wanted = {g.id for g in groups}
            extra = [i for i in have if i not in wanted]
            if extra:
                extra_items = self.store.items_by_ids(team, extra)
                removed += self.store.drop(
                    team, [i for i, item in extra_items.items() if (item.agent_id, item.subject.lower()) in grouped]
                )
        if removed:
            self._finish_purges()
        due.sort(key=lambda g: g.newest, reverse=True)
        return due, removed

    async def _points(self, client: LlamaClient, group: Group) -> list[str]:
        """The model's points for a group, completed from the facts; cancelled at once when a save arrives."""
        call = asyncio.create_task(
            client.complete_json(
                summary.build_messages(group.subject, group.facts),
                schema=summary.schema(GROUP_MAX_FACTS + 2),
                max_tokens=min(MAX_POINT_TOKENS, self.settings.max_output_tokens),
                timeout_s=self.settings.extract_budget_s,
            )
        )  # streamed: a cancel frees the slot at once
        try:
            while not call.done():
                await asyncio.wait({call}, timeout=YIELD_POLL_S)
                if not call.done() and await self._save_arrived():
                    raise Yielded
            completion = call.result()
        except LlmUnavailable:
            raise
        except ExtractionError as exc:  # timed out or unusable: the facts themselves make the line
            log.info("consolidation of %r: model answer not used (%s)", group.subject, exc)
            return summary.from_facts(group.subject, group.facts)
        finally:
            if not call.done():
                call.cancel()  # closes the request: llama-server frees the slot for the save
                with contextlib.suppress(BaseException):
                    await call
        points = summary.grounded(group.subject, summary.parse_points(completion.content), group.facts)
        return summary.complete(group.subject, points, group.facts)

    def _index(self, items: list[Item]) -> None:
        index_items(self.store, self.embedder, self.vectors, items)

    def _finish_purges(self) -> None:
        """Vectors of dropped items, and of items a stop left unindexed."""
        for team, ids in self.store.purges().items():
            self.vectors.delete(team, ids)
            self.store.purged(team, ids)
        while batch := self.store.unindexed(32):
            self._index(batch)

    def status(self) -> dict:
        """What /v1/stats shows: on or off, running now, items, and the latest runs."""
        return {
            "enabled": True,
            "running": self.running,
            "items": self.store.count(),
            "runs": self.store.runs(5),
            "last_error": self.last_error,
        }


def index_items(store: ConsolidationStore, embedder: Embedder, vectors: VectorStore, items: list[Item]) -> None:
    """Embed items into their Chroma kind, then mark them indexed (a stop in between: embedded again)."""
    embeddings = embedder.embed([item.text for item in items])
    by_team: dict[str, list[VectorItem]] = {}
    for item, vec in zip(items, embeddings):
        by_team.setdefault(item.team, []).append(consolidated_item(item, vec))
    for team, batch in by_team.items():
        vectors.upsert(team, batch)
    store.mark_indexed([item.id for item in items])


def _item(group: Group, text: str) -> Item:
    """The item of a group: cites every fact and memory; dated by its newest fact; the tags all share."""
    newest = max(group.facts, key=lambda f: (f.created_at, f.id))
    tags = set(group.facts[0].tags).intersection(*(f.tags for f in group.facts[1:]))
    occurred = [f.occurred_at for f in group.facts if f.occurred_at is not None]
    return Item(
        id=group.id,
        team=group.team,
        agent_id=group.agent_id,
        subject=group.subject,
        part=group.part,
        text=text,
        tags=sorted(tags),
        memory_id=newest.memory_ids[-1],
        created_at=newest.created_at,
        occurred_at=max(occurred) if occurred else None,
        digest=group.digest,
        sources=[(f.id, m) for f in group.facts for m in f.memory_ids],
    )


async def _wait(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
