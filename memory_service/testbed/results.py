"""What a benchmark or an eval writes: its JSON, and PNG figures when matplotlib (the `bench` extra) is there.

The figures are all in the JSON; the PNGs are a convenience, so a plain install still
benchmarks and evaluates.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@functools.cache
def plots_available() -> bool:
    """Whether matplotlib can be imported. Cached, so the reason is logged once per process, not per plot."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        log.warning(
            "PNG plots skipped: matplotlib is not installed (%s); the JSON results are complete. "
            "Install the extra for plots: pip install 'memory-service[bench]'",
            exc,
        )
        return False
    return True


def save_plot(plot: Callable[[Any, Path], None], result: Any, path: Path) -> bool:
    """Draw `result` into `path` with `plot` when matplotlib is there; False when plots are skipped."""
    if not plots_available():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    plot(result, path)
    return True


def pyplot() -> Any:
    """matplotlib with the Agg backend: no display on a server. Callers go through save_plot()."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_figure(fig: Any, path: Path) -> None:
    """Lay out, write as a 100-dpi PNG, and free the figure (pyplot keeps every open one)."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
