"""The embedded Chroma store, run in a child process that the API process talks to over a pipe.

Why: chromadb's embedded calls hold Python's lock for their whole length. Measured in the API process, an
upsert of 16 passages took 40 ms and stalled every other thread for 33 ms of it, so each save acked
behind whatever passage batch was being indexed. In a child process the same call costs the API process
a pickled request and a wait on a pipe, and that wait releases the lock.

The child owns the data dir's store alone (one writer per path, as with the embedded client), serves one
call at a time, and exits when its pipe closes, so it cannot outlive the service. It is a fresh interpreter
(`python -m` this module) joined by a socket pair, not a `multiprocessing` child: those re-run the parent's
main script, and forking a process whose threads may hold locks can deadlock the child. A child that dies or
hangs is replaced: a call that found it dead, or that it died during, is asked once more of the new one
(every call is safe to repeat). Only a second failure, or a hang, raises `ChromaProcessFailed`, which the
API answers with 503 and the indexers treat as a failed vector write (the journal keeps the text; the
vectors are written later).
"""

from __future__ import annotations

import builtins
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # importing chromadb and opening a large store on a slow, busy machine
# A call's answer is awaited `call_timeout_s` (MEMORY_VECTOR_CALL_TIMEOUT_S) plus ROW_ALLOWANCE_S per row
# it carries: then the child is taken as hung (chromadb's upsert hung so after the disk filled up), killed
# and replaced, and the call fails as `ChromaProcessFailed`. Measured on a loaded 2-core machine: 5,000
# rows took 0.17 s to get with embeddings and 2.5-3.8 s to upsert; 10 ms a row allows 50 s for them (with
# the base, 80 s: twenty times the slowest upsert seen).
CALL_TIMEOUT_S = 30.0
ROW_ALLOWANCE_S = 0.01
DROP_TIMEOUT_S = 300.0  # dropping a whole collection (a rebuild) rewrites the store: no per-row count says how long
STOP_TIMEOUT_S = 10.0


def chroma_settings() -> Any:
    """Chroma's settings for every client this service opens: no telemetry, no reset."""
    from chromadb.config import Settings as ChromaSettings

    return ChromaSettings(anonymized_telemetry=False, allow_reset=False)


class ChromaProcessFailed(RuntimeError):
    """The child serving the vector store died or stopped answering; the next call starts a new one."""


class ChromaCallError(RuntimeError):
    """Chroma raised an error of its own type in the child; the message keeps its type and text."""

    @property
    def storage_full_or_failing(self) -> bool:
        """Whether the store's disk is full or failing (SQLite's words, which chromadb passes on): it passes,
        so a retry can succeed; any other Chroma error is a bug or bad input."""
        text = str(self).lower()
        return any(words in text for words in _DISK_TROUBLE)


_DISK_TROUBLE = ("database or disk is full", "disk i/o error", "no space left on device")


def _serve(conn: Any, path: str) -> None:
    """The child's loop: one request at a time, until the pipe closes or `close` is asked."""
    import chromadb
    import numpy as np

    try:
        client = chromadb.PersistentClient(path=path, settings=chroma_settings())
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which raises it
        conn.send(("error", (type(exc).__name__, str(exc))))
        return
    conn.send(("ok", None))
    collections: dict[str, Any] = {}

    def collection(name: str) -> Any:
        coll = collections.get(name)
        if coll is None:
            coll = client.get_or_create_collection(name, metadata={"hnsw:space": "cosine"}, embedding_function=None)
            collections[name] = coll
        return coll

    while True:
        try:
            op, name, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if op == "close":
                client.close()  # type: ignore[attr-defined]  # on chromadb's Client, not on its ClientAPI stub
                conn.send(("ok", None))
                return
            if op == "list":
                result: Any = [c.name for c in client.list_collections()]
            elif op == "drop":
                client.delete_collection(name)
                collections.pop(name, None)
                result = None
            elif op == "max_batch":
                result = int(client.get_max_batch_size())
            elif op in ("upsert", "delete", "query", "get", "count"):
                result = getattr(collection(name), op)(**kwargs)
                if op == "get" and result.get("embeddings") is not None:
                    result = dict(result, embeddings=np.asarray(result["embeddings"], dtype=np.float32))
            else:
                raise ValueError(f"unknown vector store call {op!r}")
            conn.send(("ok", result))
        except BaseException as exc:  # noqa: BLE001 - the parent re-raises it; the child serves on
            conn.send(("error", (type(exc).__name__, str(exc))))


def _raise(kind: str, message: str) -> None:
    builtin = getattr(builtins, kind, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        raise builtin(message)
    raise ChromaCallError(f"{kind}: {message}")


class ChildCollection:
    """One collection of the child's store, with the calls of a chromadb collection that `VectorStore` uses."""

    def __init__(self, process: ChromaProcess, name: str) -> None:
        self._process, self.name = process, name

    def upsert(self, **kwargs: Any) -> None:
        self._process.call("upsert", self.name, **kwargs)

    def delete(self, **kwargs: Any) -> None:
        self._process.call("delete", self.name, **kwargs)

    def query(self, **kwargs: Any) -> dict[str, Any]:
        return self._process.call("query", self.name, **kwargs)

    def get(self, **kwargs: Any) -> dict[str, Any]:
        return self._process.call("get", self.name, **kwargs)

    def count(self) -> int:
        return self._process.call("count", self.name)


class ChromaProcess:
    """The client side: the calls of a chromadb client that `VectorStore` uses, answered by the child."""

    def __init__(self, path: Path, *, call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self._path = str(path)
        self.call_timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._ready = False
        self._closed = False
        with self._lock:
            self._start()

    # -- the calls VectorStore makes on a chromadb client
    def get_or_create_collection(self, name: str, **_: Any) -> ChildCollection:
        """The child creates a collection on its first call (metadata and settings as `VectorStore` asks)."""
        return ChildCollection(self, name)

    def list_collections(self) -> list[ChildCollection]:
        return [ChildCollection(self, name) for name in self.call("list")]

    def delete_collection(self, name: str) -> None:
        self.call("drop", name)

    def get_max_batch_size(self) -> int:
        return self.call("max_batch")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def call(self, op: str, name: str | None = None, **kwargs: Any) -> Any:
        """One call in the child. Every call is safe to repeat (upserts by id, deletes, reads), so a child
        found dead, or dying during the call, is replaced and the call asked once more of the new one."""
        with self._lock:
            if self._closed:
                raise ChromaProcessFailed("the vector store is closed")
            for attempt in (1, 2):
                process, conn = self._running()
                try:
                    conn.send((op, name, kwargs))
                    timeout = self.timeout_for(op, kwargs)
                    if not conn.poll(timeout):
                        raise TimeoutError(f"no answer in {timeout:.0f} s")
                    status, value = conn.recv()
                    break
                except (EOFError, OSError, TimeoutError) as exc:
                    process.kill()  # a hung child too: the next call needs a fresh one
                    code = process.wait()
                    self._stop()
                    if attempt == 2 or isinstance(exc, TimeoutError):
                        raise ChromaProcessFailed(
                            f"the vector store's process stopped during {op} ({exc or type(exc).__name__}, "
                            f"exit code {code}); the next call starts a new one"
                        ) from None
                    log.warning(
                        "the vector store's process stopped during %s (exit code %s); starting another", op, code
                    )
        if status == "error":
            _raise(*value)
        return value

    def timeout_for(self, op: str, kwargs: dict[str, Any]) -> float:
        """How long a call may take before its child is taken as hung: the base plus an allowance per row."""
        if op == "drop":
            return max(self.call_timeout_s, DROP_TIMEOUT_S)
        embeddings = kwargs.get("embeddings")
        rows = max(
            len(kwargs.get("ids") or ()),
            0 if embeddings is None else len(embeddings),
            int(kwargs.get("n_results") or 0) * len(kwargs.get("query_embeddings") or ()),
            int(kwargs.get("limit") or 0),
        )
        return self.call_timeout_s + ROW_ALLOWANCE_S * rows

    def _running(self) -> tuple[subprocess.Popen, Connection]:
        """The child and its pipe, started again if it died and waited for until its store is open."""
        if self._process is None or self._conn is None or self._process.poll() is not None:
            self._stop()
            self._start()
        process, conn = self._process, self._conn
        assert process is not None and conn is not None  # _start set both
        if not self._ready:
            self._wait_ready(process, conn)
        return process, conn

    def _start(self) -> None:
        """Start the child; it opens the store while this process goes on (the first call waits for it)."""
        mine, theirs = socket.socketpair()
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), self._path],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                close_fds=True,
                env=_child_env(),
            )
        self._process, self._conn, self._ready = process, Connection(mine.detach()), False
        log.debug("vector store process %d serves %s", process.pid, self._path)

    def _wait_ready(self, process: subprocess.Popen, conn: Connection) -> None:
        try:
            if not conn.poll(START_TIMEOUT_S):
                raise TimeoutError(f"it did not open the store in {START_TIMEOUT_S:.0f} s")
            status, value = conn.recv()
        except (EOFError, OSError, TimeoutError) as exc:
            self._stop()
            raise ChromaProcessFailed(
                f"the vector store's process could not open {self._path} ({exc or 'it exited'}, exit code "
                f"{process.poll()}); its error is in the service's log"
            ) from None
        if status == "error":
            self._stop()
            _raise(*value)
        self._ready = True

    def _stop(self) -> None:
        """Ask the child to close its store, then make sure it is gone."""
        process, conn, ready = self._process, self._conn, self._ready
        self._process = self._conn = None
        self._ready = False
        if process is None or conn is None:
            return
        try:
            if process.poll() is None:
                conn.send(("close", None, {}))
                for _ in range(1 if ready else 2):  # a child still opening answers "ready" first
                    if conn.poll(STOP_TIMEOUT_S):
                        conn.recv()
        except (EOFError, OSError):
            pass
        finally:
            conn.close()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)


def _child_env() -> dict[str, str]:
    """The service's environment, with this package's own copy first on the path (the child runs the same
    code even when the service was started from a checkout) and Chroma's telemetry off."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, ANONYMIZED_TELEMETRY="False")


def main(argv: list[str]) -> None:
    """The child's entry: `python -m memory_service.storage.chroma_process FD PATH`."""
    fd, path = int(argv[0]), argv[1]
    os.umask(0o077)  # the store's files are 0600, dirs 0700, whoever started this child (as datadir.private_umask)
    # a Ctrl-C or SIGTERM sent to the service's whole process group is the service's to handle: the child
    # finishes the call in hand and leaves when the service closes the pipe (or dies)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        _serve(Connection(fd), path)
    except (BrokenPipeError, ConnectionResetError):  # the service went away mid-answer: nothing to tell
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
