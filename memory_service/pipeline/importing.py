"""Import: exported memories back into a team, their facts kept (and embedded) or queued for extraction.

Each line is its own transaction keyed on the original id, so an import cut off half-way can simply
be run again: lines already in are skipped. Facts are committed as not yet indexed and their vectors
written after the commit; when that fails (vector store down, a stop), the indexer's sweep writes them,
as it does for a job's facts. Passages are embedded by the usual indexer afterwards.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..embedding.embedder import Embedder
from ..extraction.grounding import shape
from ..storage.catalog import ImportedFact, import_record
from ..storage.journal import Journal, Memory
from ..storage.vectors import VectorStore
from .passages import write_fact_vectors
from .vector_items import memory_fact_item

log = logging.getLogger("memory_service.pipeline.importing")


@dataclass
class ImportTally:
    imported: int = 0
    skipped: int = 0


def import_batch(
    records: list[dict],
    *,
    team: str,
    journal: Journal,
    embedder: Embedder,
    vectors: VectorStore,
    re_extract: bool,
    budget_s: float,
) -> ImportTally:
    """Store a batch of validated export records; facts kept as they are unless `re_extract`."""
    tally = ImportTally()
    to_embed: list[tuple[Memory, ImportedFact]] = []
    for record in records:
        memory, created, facts = import_record(
            journal, team, record, keep_facts=not re_extract, budget_s=budget_s, shape=shape
        )
        if created:
            tally.imported += 1
            to_embed += [(memory, fact) for fact in facts]
        else:
            tally.skipped += 1
    if to_embed:
        try:
            embeddings = embedder.embed([fact.text for _, fact in to_embed])
            items = [memory_fact_item(m, fact.id, fact.text, vec) for (m, fact), vec in zip(to_embed, embeddings)]
            write_fact_vectors(journal, vectors, team, items)
        except Exception:  # the lines are committed: what is missing is derived state, which the sweep rebuilds
            log.warning(
                "import: %d fact vectors not written now; the indexer's sweep writes them", len(to_embed), exc_info=True
            )
    return tally
