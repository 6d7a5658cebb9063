"""Who is using a data dir: a running service holds a shared lock on `<data dir>/.lock`, a restore an
exclusive one (so does a backup that copies the vector files, which must not change under it).

`flock`, not a pid file: the kernel drops the lock when its process dies, so a crash never leaves a
stale lock behind. Where `fcntl` does not exist (Windows) nothing is locked and the service must be
stopped by hand before a restore.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"


class DataDirBusy(RuntimeError):
    """Another process holds the data dir's lock in a conflicting mode."""


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self, *, exclusive: bool, wait: bool) -> DataDirLock:
        """Take the lock; without `wait`, raise `DataDirBusy` at once when it is held in a conflicting mode."""
        if fcntl is None or self._fd is not None:
            return self
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, mode)
            except BlockingIOError:
                os.close(fd)
                raise DataDirBusy(str(self.path.parent)) from None
            # a restore may have swapped the directory while we waited: the lock must be on the file there now
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return self
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
