"""Recall's vector leg: a team's nearest vectors that pass a filter, and the hubness discount on them.

What the rest of the package uses:
- `FilteredVectors` (`filtered`): the search, `search(team, kind, vector, k, VectorFilter)`, and each
  found item's hubness score; `VectorFilter` (`directory`): an agent, tags and a time window;
- `VectorView` (`view`): what this process holds of each team's vectors, the vector store's listener,
  registered before any write (Services does so before a worker starts);
- `BackgroundWork` (`background`): the pool the directory loads, index builds and hubness passes run on,
  off the request path; Services owns it and joins it at stop, before the stores close;
- `rerank_by_hubness` (`hubness.rerank`): the found list ordered by cosine less the items' hubness;
- `UNFILTERED_EXACT_MAX_ROWS`: the largest team an unfiltered search scores exactly (the benchmark's).

How a filtered search is planned (`filtered`): each team's directory (`directory`, loaded once from the
journal, kept current by `view`) counts the rows a filter keeps, so the plan is chosen, not guessed. No
filter: exact search over a small team, else its in-process clustered index (`clusters`, built in the
background by `clustered_indexes`), Chroma's HNSW until that is ready. A filter keeping few rows: exact
search over just their vectors, cached (`matrices`). One keeping many: the clustered index with the
filter as a mask, else over-fetch from HNSW, then exact when that comes up short; a filter too big to
cache whose over-fetch is short, or a Chroma server other processes write: Chroma's `where`. Hubness
scores (`hubness`) are computed by `hub_scores` in the background, from vectors already held.
"""

from .background import BackgroundWork
from .directory import VectorFilter
from .filtered import UNFILTERED_EXACT_MAX_ROWS, FilteredVectors
from .hubness import rerank as rerank_by_hubness
from .view import VectorView

__all__ = [
    "UNFILTERED_EXACT_MAX_ROWS",
    "BackgroundWork",
    "FilteredVectors",
    "VectorFilter",
    "VectorView",
    "rerank_by_hubness",
]
