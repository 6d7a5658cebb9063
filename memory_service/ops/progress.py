"""How a long operation on the data dir (reindex, backup, restore) reports how far it is.

A callback, so that ops never imports the command line that draws the bars; stdlib only, so the light
operations (backup) can take one without loading the heavy ones (reindex loads the embedder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """A named part of a long operation and what it counts."""

    what: str
    unit: str = "items"  # "bytes": the command line shows sizes


# (stage, done, total), as often as it is cheap to say
Progress = Callable[[Stage, int, int], None]


def no_progress(stage: Stage, done: int, total: int) -> None:
    """The report nobody listens to."""
