"""The threads the filtered vector search works on off the request path, owned so a stop can join them.

Directory loads, clustered-index builds and hubness passes take from milliseconds to seconds and read the
vector store: they must be over before the store closes. Whoever makes the runner closes it (Services, at
stop, before it closes the stores); work offered after that is declined, not started.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("memory_service")

# two: a directory load or a hubness pass need not wait for a build of seconds; more would only take CPU
# from recalls (the work is numpy and Chroma reads)
WORKERS = 2


class BackgroundWork:
    def __init__(self, workers: int = WORKERS) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vector-background")
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, task: Callable[..., Any], *args: Any) -> bool:
        """Run `task(*args)` on a background thread; False when closed (the caller undoes its bookkeeping).
        The task handles its own errors: nobody waits for its result."""
        with self._lock:
            if self._closed:
                return False
            future: Future[Any] = self._executor.submit(task, *args)
        future.add_done_callback(_log_error)
        return True

    def close(self) -> None:
        """Wait for the running task(s) to finish; queued ones are dropped."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)


def _log_error(future: Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("background vector work failed", exc_info=future.exception())
