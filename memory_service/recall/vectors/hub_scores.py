"""When each team's hubness scores (`hubness`) are computed: off the request path, again as the team grows.

A pass reads vectors this process already holds (a small team's cached matrix, a large team's clustered
index) or fetches a small team's from the store, and runs on the background runner, never on a recall's
thread: until it is done (a team's first recall, a save since) the scores are NaN or a little old.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import hubness
from .background import BackgroundWork
from .clustered_indexes import TeamKind
from .directory import Directory
from .matrices import Matrix, whole_team_key
from .view import VectorView

log = logging.getLogger("memory_service")

HUB_REFRESH_SHARE = 0.1  # hubness scores are computed again once the team's vectors grew by this share
HUB_REFRESH_MIN = 20  # ... and by at least this many

Scored = tuple[np.ndarray, np.ndarray]  # directory rows, and the hubness score of each
ScorePass = Callable[[], Scored]  # runs outside the lock


@dataclass
class HubState:
    """One team and kind's hubness scores by directory row (NaN: not computed yet), and when they were."""

    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    live_at: int = -1  # vectors the team had when they were computed; -1: never
    running: bool = False


class HubnessScores:
    """Every team's scores, and the passes that refresh them. The caller holds the lock unless said."""

    def __init__(self, lock: threading.RLock, background: BackgroundWork) -> None:
        self._lock = lock
        self._background = background
        self.states: dict[TeamKind, HubState] = {}

    def due(self, team_kind: TeamKind, d: Directory) -> bool:
        """Never computed, or the team grew enough since, and no pass is running."""
        state = self.states.setdefault(team_kind, HubState())
        grown = d.live - max(state.live_at, 0)
        stale = state.live_at < 0 or grown >= max(HUB_REFRESH_MIN, state.live_at * HUB_REFRESH_SHARE)
        return stale and not state.running

    def start(self, team_kind: TeamKind, d: Directory, prepare: Callable[[], ScorePass]) -> None:
        """Refresh the scores in the background: `prepare` runs under the lock and takes what the pass
        reads; the pass it returns runs outside it."""
        state = self.states.setdefault(team_kind, HubState())
        state.running = True
        if not self._background.submit(self._refresh, team_kind, d, state, prepare):
            state.running = False  # stopping: nothing more is started

    def of(self, team_kind: TeamKind, d: Directory, ids: list[str]) -> np.ndarray:
        """Each item's score, NaN where there is none yet."""
        out = np.full(len(ids), np.nan, dtype=np.float32)
        scores = self.states.setdefault(team_kind, HubState()).scores
        for i, item_id in enumerate(ids):
            r = d.row.get(item_id)
            if r is not None and r < len(scores):
                out[i] = scores[r]
        return out

    def _refresh(self, team_kind: TeamKind, d: Directory, state: HubState, prepare: Callable[[], ScorePass]) -> None:
        try:
            with self._lock:
                live = d.live
                score_pass = prepare()
            have, scores = score_pass()
            with self._lock:
                full = np.full(len(d.alive), np.nan, dtype=np.float32)
                full[have] = scores
                state.scores, state.live_at = full, live
        except Exception:  # noqa: BLE001 - a ranking prior: recall goes on with the scores it has
            log.exception("could not compute the hubness scores of a team's %ss", team_kind[1])
            with self._lock:
                state.live_at = d.live  # not tried again on every search
        finally:
            with self._lock:
                state.running = False


def prepare_pass(
    view: VectorView,
    fetch: Callable[[str, str, Directory, np.ndarray], Matrix],
    team_kind: TeamKind,
    d: Directory,
    small: bool,
) -> ScorePass:
    """What a pass reads, taken under the lock: a small team's cached whole-team matrix (its arrays, not the
    object: a search may fold writes into it) or its rows to fetch; a large team's clustered index (replaced,
    never changed, by a fold)."""
    team, kind = team_kind
    if not small:
        index = view.clustered.ready[team_kind]
        return lambda: (index.rows, hubness.clustered(index.vectors, index.offsets))
    rows = d.all_rows()
    cached = view.matrices.peek(whole_team_key(team, kind))
    matrix = None
    if cached is not None:
        cached.current()
        matrix = Matrix(cached.rows, cached.vectors)

    def exact_pass() -> Scored:
        held = matrix if matrix is not None else fetch(team, kind, d, rows)  # fetched outside the lock
        return held.rows, hubness.exact(held.vectors) if len(held.rows) else np.zeros(0)

    return exact_pass
