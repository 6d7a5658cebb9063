"""The last line of defence of a text heuristic: what it cannot read, it reads nothing of.

Dates, "when" windows, the small-talk gate, grounding and coverage run inside requests and extraction jobs
on any text a caller sends. Each matches ASCII forms and skips the rest, so none should ever raise; if one
still does (a bug), the request or job must not fail for it: the entry point logs the error's type and
place (never the text) and returns what "nothing read" means for it. Tests call the unguarded function
(`__wrapped__`), so a bug there still fails them.
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def reads_nothing_on_error(nothing: Callable[..., Any]) -> Callable[[F], F]:
    """Guard a heuristic: on an exception, `nothing(*args, **kwargs)` is its answer, and a warning is logged."""

    def decorate(read: F) -> F:
        @functools.wraps(read)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return read(*args, **kwargs)
            except Exception as error:  # a heuristic must never fail a request or a job
                where = traceback.extract_tb(error.__traceback__)[-1]
                log.warning(
                    "%s could not read a text (%s at %s:%s); it reads nothing of it",
                    read.__qualname__,
                    type(error).__name__,
                    where.filename.rsplit("/", 1)[-1],
                    where.lineno,
                )
                return nothing(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    return decorate
