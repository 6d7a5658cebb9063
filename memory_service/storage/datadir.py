"""The data dir: the one place that names its files and opens its stores.

```
<data dir>/
  .lock             who is using it (see datalock): a service shares it, restore/reindex/migrate hold it alone
  journal.sqlite3   texts, jobs, facts, consolidated items (unless MEMORY_DATABASE_URL names PostgreSQL)
  limits.sqlite3    daily-limit counters and the handled ledger (idem)
  keys.sqlite3      API keys, as hashes (idem)
  chroma/           the embedded vector store (unless MEMORY_CHROMA_URL names a Chroma server)
  embedder.json     which embedding model made the vectors ({"model": "minilm"}); a dir without it predates
                    the record, when the MiniLM was the only model
```

The service, backup/restore, reindex and migrate all open the stores through `DataDir`, so a file name
or the way a store is opened is decided once. The dir is its owner's only (0700, files 0600, whatever the
umask): it holds every text an agent saved and the key hashes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .datalock import LOCK_NAME, DataDirBusy, DataDirLock

if TYPE_CHECKING:
    from ..config import Settings
    from .database import Database
    from .journal import Journal
    from .keys import KeyStore
    from .limits import LimitStore
    from .vectors import VectorStore

JOURNAL_FILE = "journal.sqlite3"
LIMITS_FILE = "limits.sqlite3"
KEYS_FILE = "keys.sqlite3"
VECTORS_DIR = "chroma"
EMBEDDER_FILE = "embedder.json"
UNRECORDED_EMBEDDER = "minilm"  # the model of every data dir made before the record existed
DATABASE_FILES = (JOURNAL_FILE, LIMITS_FILE, KEYS_FILE)  # the SQLite files, in the order a backup lists them
# in a restore's staged data dir once it is complete and on disk, until it is renamed into place
RESTORE_READY = ".restore-ready"

log = logging.getLogger(__name__)

__all__ = [
    "DATABASE_FILES",
    "JOURNAL_FILE",
    "KEYS_FILE",
    "LIMITS_FILE",
    "LOCK_NAME",
    "VECTORS_DIR",
    "DataDir",
    "DataDirBusy",
    "DataDirIncomplete",
    "Stores",
]


class DataDirIncomplete(RuntimeError):
    """The data dir is missing because a restore was cut off between its two renames: starting would
    create an empty one and hide the restored data; the message says how to finish."""


def restore_staging(path: Path, stamp: str) -> Path:
    """Where a restore builds the new data dir, beside `path` (hidden; renamed into place last)."""
    return path.parent / f".{path.name}.restoring-{stamp}-{os.getpid()}"


def kept_aside(path: Path, stamp: str) -> Path:
    """Where a restore moves the data it replaces (never deleted)."""
    return path.with_name(f"{path.name}.before-restore-{stamp}")


def unfinished_restore(path: Path) -> str | None:
    """When `path` is missing and a restore left its complete staged copy beside it: what to do, else None."""
    if path.exists() or not path.parent.is_dir():
        return None
    ready = sorted(p for p in path.parent.glob(f".{path.name}.restoring-*") if (p / RESTORE_READY).is_file())
    if not ready:
        return None
    aside = sorted(path.parent.glob(f"{path.name}.before-restore-*"))
    before = f"; the data from before it is in {aside[-1]} (`mv {aside[-1]} {path}` puts it back)" if aside else ""
    return (
        f"the data dir {path} is missing: a restore was cut off between moving the old data aside and moving "
        f"the restored data in. The restored data is complete in {ready[-1]}{before}. Finish the restore with "
        f"`mv {ready[-1]} {path}`, then start again (nothing was created)"
    )


def make_private(root: Path) -> int:
    """Take group and others' access away from `root` and everything under it; returns how many paths
    changed (0 when it was private already). Paths another user owns are left as they are."""
    changed = 0
    for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
        try:
            mode = path.lstat().st_mode
            if path.is_symlink() or not mode & 0o077:
                continue
            path.chmod(mode & 0o700)
            changed += 1
        except (FileNotFoundError, PermissionError):
            continue
    return changed


def private_umask() -> None:
    """From now on this process (and every child it starts, which inherits it) creates files 0600 and dirs
    0700: the files Chroma and SQLite make while the service runs, not only those `prepare` finds at start."""
    os.umask(0o077)


def private_file(path: Path) -> None:
    """Create `path` empty (an empty file is an empty SQLite database) or tighten it: 0600, whatever the
    umask; SQLite gives its -wal and -shm files the database file's mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class DataDir:
    """A data dir's paths, its lock, and its stores (the stores' modules load only when one is opened)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def journal_file(self) -> Path:
        return self.path / JOURNAL_FILE

    @property
    def vectors_dir(self) -> Path:
        return self.path / VECTORS_DIR

    def prepare(self) -> None:
        """Create the data dir (0700), or take group and others' access away from an existing one (logged
        once: the next start finds nothing to change). Refuses (`DataDirIncomplete`) when a restore was cut
        off between its renames, instead of creating an empty dir that hides the restored data."""
        problem = unfinished_restore(self.path)
        if problem:
            raise DataDirIncomplete(problem)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path.mkdir(mode=0o700)
            self.path.chmod(0o700)  # mkdir's mode is masked by the umask
            return
        except FileExistsError:
            pass
        (self.path / RESTORE_READY).unlink(missing_ok=True)  # a restore stopped after its last rename
        if not any(self.path.iterdir()):
            # an empty dir made for us (`mkdir`, a tool, a container volume): nothing in it was ever readable,
            # so there is nothing to warn about (a new data dir's first log line was this warning)
            self.path.chmod(0o700)
            return
        changed = make_private(self.path)
        if changed:
            log.warning("%s: took group and others' access away from %d path(s) (0700/0600)", self.path, changed)

    def has_journal(self) -> bool:
        """Whether this looks like a data dir at all (the journal is the one file every data dir has)."""
        return self.journal_file.is_file()

    def embedder_record(self) -> str | None:
        """The embedding model this dir's vectors were made with; None for a new dir (no journal, no record)."""
        try:
            model = json.loads((self.path / EMBEDDER_FILE).read_text())["model"]
        except FileNotFoundError:
            return UNRECORDED_EMBEDDER if self.has_journal() else None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{self.path / EMBEDDER_FILE} is unreadable ({exc}): delete it and reindex") from None
        if not isinstance(model, str) or not model:
            raise ValueError(f"{self.path / EMBEDDER_FILE} names no model: delete it and reindex")
        return model

    def record_embedder(self, model: str) -> None:
        """Note that the vectors are (now) `model`'s: written whole or not at all, 0600 like the rest."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = self.path / EMBEDDER_FILE
        staged = target.with_name(f".{EMBEDDER_FILE}.{os.getpid()}")
        private_file(staged)
        staged.write_text(json.dumps({"model": model}) + "\n")
        os.replace(staged, target)

    def lock(self, *, exclusive: bool, wait: bool = False) -> DataDirLock:
        """The data dir's lock, taken (`DataDirBusy` without `wait` when a conflicting holder has it)."""
        return DataDirLock(self.path).acquire(exclusive=exclusive, wait=wait)

    def open_journal(self, database: Database | None = None) -> Journal:
        """The journal on the shared `database`, or in this data dir's SQLite file."""
        from .journal import Journal

        return Journal(database or self._private(self.journal_file))

    def open_limits(self, database: Database | None = None) -> LimitStore:
        from .limits import LimitStore

        return LimitStore(database or self._private(self.path / LIMITS_FILE))

    def open_keys(self, database: Database | None = None) -> KeyStore:
        from .keys import KeyStore

        return KeyStore(database or self._private(self.path / KEYS_FILE))

    def _private(self, file: Path) -> Path:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        private_file(file)
        return file

    def open_vectors(
        self,
        url: str | None = None,
        *,
        process: bool = False,
        call_timeout_s: float | None = None,
        max_reply_bytes: int | None = None,
    ) -> VectorStore:
        """The Chroma server at `url`, or the embedded store in `chroma/` (in a child process with `process`)."""
        from .vectors import VectorStore

        more: dict[str, Any] = {} if call_timeout_s is None else {"call_timeout_s": call_timeout_s}
        if max_reply_bytes is not None:
            more["max_reply_bytes"] = max_reply_bytes
        store = VectorStore(self.vectors_dir, url=url, process=process, **more)
        if url is None:  # files from before `private_umask` (or made by another umask) are tightened here
            make_private(self.vectors_dir)
        return store

    def remove_vectors(self) -> None:
        """Delete the embedded vector store (derived state: a reindex writes it again)."""
        shutil.rmtree(self.vectors_dir, ignore_errors=True)

    def open_stores(self, settings: Settings) -> Stores:
        """The database the settings name (None: this data dir's SQLite files) and the journal on it."""
        from .database import open_database

        database = open_database(settings)
        try:
            return Stores(database, self.open_journal(database))
        except BaseException:
            if database is not None:
                database.close()
            raise


@dataclass
class Stores:
    """The journal and the shared database under it (None: the journal has its own file); closed together."""

    database: Database | None
    journal: Journal

    def close(self) -> None:
        self.journal.close()
        if self.database is not None:
            self.database.close()
