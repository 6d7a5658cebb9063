"""How long one PostgreSQL statement may hold a thread: the server's own limit, and ours when the server is stuck.

Why (issue 53): psycopg waits for a statement's answer for ever. The server ends a slow statement (or a lock
wait) itself at `statement_timeout`, which the service sets on its connections; but a server that is stopped,
swapping to death, or behind a network that dropped without a reset never answers at all, not even to say
so, and the thread that asked (one of the blocking pool's, which saves, recalls and key lookups share) would
wait with it for good. `Watchdog` gives each statement the server's limit plus `GRACE_S`; past that it shuts
the connection's socket down, the statement fails as a lost connection (503, retried) and the pool drops the
connection.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

GRACE_S = 10.0  # past statement_timeout: the server's own cancel has had time to arrive
TICK_S = 0.25  # how often the watchdog looks


class Watchdog:
    """One thread per database: cuts off connections whose statement outlived `limit_s`."""

    def __init__(self, limit_s: float, where: str) -> None:
        self.limit_s, self.where = limit_s, where
        self._busy: dict[int, tuple[float, Any]] = {}  # id(connection) -> (deadline, connection)
        self._cut: set[int] = set()  # connections cut off, until their statement's caller has seen it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def statement(self, conn: Any) -> Iterator[None]:
        """Around one round trip on `conn` (a statement, BEGIN or COMMIT): cut off past `limit_s`."""
        key = id(conn)
        with self._lock:
            self._busy[key] = (time.monotonic() + self.limit_s, conn)
        try:
            yield
        except Exception as exc:
            with self._lock:
                cut = key in self._cut
                self._cut.discard(key)
            if cut:
                raise self._why(exc) from exc
            raise
        finally:
            with self._lock:
                self._busy.pop(key, None)
                self._cut.discard(key)

    def _why(self, exc: Exception) -> Exception:
        import psycopg

        return psycopg.OperationalError(
            f"PostgreSQL at {self.where} did not answer a statement within {self.limit_s:.0f}s "
            f"(MEMORY_DATABASE_STATEMENT_TIMEOUT_S plus {GRACE_S:.0f}s) nor end it itself: the connection was "
            f"cut off, the server is stuck or unreachable ({' '.join(str(exc).split())})"
        )

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            now = time.monotonic()
            with self._lock:
                late = [(key, conn) for key, (at, conn) in self._busy.items() if at <= now and key not in self._cut]
                self._cut.update(key for key, _ in late)
            for _, conn in late:
                log.warning(
                    "PostgreSQL at %s: a statement outlived %.0fs; cutting its connection", self.where, self.limit_s
                )
                _shut_down(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def _shut_down(conn: Any) -> None:
    """End the connection's socket under libpq's feet: its wait wakes up to a closed connection."""
    try:
        fd = os.dup(conn.pgconn.socket)
    except Exception:  # already closed: nothing waits on it
        return
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def with_statement_timeout(url: str, seconds: float) -> dict[str, Any]:
    """The connection parameters that add `statement_timeout` to those the URL gives (its own `options` kept)."""
    from psycopg.conninfo import conninfo_to_dict

    options = str(conninfo_to_dict(url).get("options") or "")
    return {"options": f"{options} -c statement_timeout={int(seconds * 1000)}".strip()}
