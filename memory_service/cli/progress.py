"""Progress bars for the long commands (import, export, reindex, backup, restore, `remember --wait`).

rich (installed with chromadb anyway, and now named in pyproject.toml) draws them: a bar per stage with the
count done of the total, the elapsed time and the time left, redrawn in place ten times a second, sizes for
bytes. They go to stderr, so stdout keeps only the answer (`--json` and `> file` stay clean), and only when
stderr is a terminal: under a script, a CI log or `2> file`, a redrawn bar is noise that ends as hundreds of
lines, and stderr stays for errors, so the quiet fallback is no bar at all (the summary still says what was done).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from ..ops.progress import Stage


class Bars:
    """A `Progress` callback (ops/progress.py): one bar per stage on stderr while it is a terminal; a no-op else.

    Use it as a context manager: the bars stop (and the cursor comes back) however the command ends."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress: Any = None
        self._tasks: dict[Stage, Any] = {}

    def __enter__(self) -> Bars:
        if self.enabled:
            self._progress = _progress()
            self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __call__(self, stage: Stage, done: int, total: int | None) -> None:
        if self._progress is None:
            return
        task = self._tasks.get(stage)
        if task is None:
            task = self._tasks[stage] = self._progress.add_task(stage.what, total=total, unit=stage.unit)
        self._progress.update(task, completed=done, total=total)


def _progress() -> Any:
    """The rich display, imported only when a bar is drawn (a script's call never loads it)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        _counts_column(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        refresh_per_second=10,
    )


def _counts_column() -> Any:
    from rich.filesize import decimal
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Counts(ProgressColumn):
        """`340/1000 lines`, or `1.2 MB/4.5 MB` for bytes; without a total, the count alone."""

        def render(self, task: Any) -> Text:
            unit = task.fields.get("unit", "")
            done, total = int(task.completed), None if task.total is None else int(task.total)
            if unit == "bytes":
                shown = decimal(done) + ("" if total is None else f"/{decimal(total)}")
            else:
                shown = f"{done}" + ("" if total is None else f"/{total}") + f" {unit}"
            return Text(shown)

    return Counts()
