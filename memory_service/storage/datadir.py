"""The data dir: the one place that names its files and opens its stores.

```
<data dir>/
  .lock             who is using it (see datalock): a service shares it, restore/reindex/migrate hold it alone
  journal.sqlite3   texts, jobs, facts, consolidated items (unless MEMORY_DATABASE_URL names PostgreSQL)
  limits.sqlite3    daily-limit counters and the handled ledger (idem)
  keys.sqlite3      API keys, as hashes (idem)
  chroma/           the embedded vector store (unless MEMORY_CHROMA_URL names a Chroma server)
```

The service, backup/restore, reindex and migrate all open the stores through `DataDir`, so a file name
or the way a store is opened is decided once.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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
DATABASE_FILES = (JOURNAL_FILE, LIMITS_FILE, KEYS_FILE)  # the SQLite files, in the order a backup lists them

__all__ = [
    "DATABASE_FILES",
    "JOURNAL_FILE",
    "KEYS_FILE",
    "LIMITS_FILE",
    "LOCK_NAME",
    "VECTORS_DIR",
    "DataDir",
    "DataDirBusy",
    "Stores",
]


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

    def has_journal(self) -> bool:
        """Whether this looks like a data dir at all (the journal is the one file every data dir has)."""
        return self.journal_file.is_file()

    def lock(self, *, exclusive: bool, wait: bool = False) -> DataDirLock:
        """The data dir's lock, taken (`DataDirBusy` without `wait` when a conflicting holder has it)."""
        return DataDirLock(self.path).acquire(exclusive=exclusive, wait=wait)

    def open_journal(self, database: Database | None = None) -> Journal:
        """The journal on the shared `database`, or in this data dir's SQLite file."""
        from .journal import Journal

        return Journal(database or self.journal_file)

    def open_limits(self, database: Database | None = None) -> LimitStore:
        from .limits import LimitStore

        return LimitStore(database or self.path / LIMITS_FILE)

    def open_keys(self, database: Database | None = None) -> KeyStore:
        from .keys import KeyStore

        return KeyStore(database or self.path / KEYS_FILE)

    def open_vectors(self, url: str | None = None, *, process: bool = False) -> VectorStore:
        """The Chroma server at `url`, or the embedded store in `chroma/` (in a child process with `process`)."""
        from .vectors import VectorStore

        return VectorStore(self.vectors_dir, url=url, process=process)

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
