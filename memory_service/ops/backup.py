"""`memory-service backup DIR` and `memory-service restore DIR`.

A backup is a directory: a copy of each SQLite database of the data dir (the journal: texts, jobs,
facts; the limits store: counters and the handled ledger; the API keys, as hashes) plus `manifest.json`
with their sha256 and row counts. The copies come from SQLite's online backup API, so a backup can be taken while
the service runs: each database is copied from one read snapshot (WAL: writers carry on) and is
consistent on its own. The databases never refer to each other, so snapshots a moment
apart are a valid state. A backup is built in a hidden sibling directory and renamed into place
last, so a directory with a manifest is always complete.

Vectors are derived from the journal. While a service runs they are not copied (Chroma's files are
not safe to copy under a writer) and restore embeds every passage and active fact again. When no
service holds the data dir, the backup copies them too, under the data dir's exclusive lock, and
restore uses the copy.

Restore checks every checksum first (a damaged or partial backup changes nothing), refuses while a
service holds the data dir, builds the new data dir beside the old one, and only then swaps them:
the current data is moved aside to `<data dir>.before-restore-<time>`, never deleted. Each rename is
followed by an fsync of the parent directory. A crash between the two renames leaves no data dir but a
staged one marked complete: the next start refuses and names it (storage/datadir.py) instead of starting
on an empty data dir. Jobs queued or mid-extraction in the snapshot are queued again on the next start.
Backups and restored data dirs are their owner's only (directories 0700, files 0600), like the data dir.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..storage.datadir import (
    DATABASE_FILES,
    JOURNAL_FILE,
    LOCK_NAME,
    RESTORE_READY,
    VECTORS_DIR,
    DataDir,
    DataDirBusy,
    kept_aside,
    make_private,
    restore_staging,
)
from ..storage.datalock import DataDirLock
from .files import COPYING, CopiedBytes, describe, files_under, private_dir, sha256, sync_dir, sync_tree
from .progress import Progress, no_progress

if TYPE_CHECKING:
    from .reindex import Reindexed

FORMAT = "memory-service-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
JOURNAL = JOURNAL_FILE
DATABASES = DATABASE_FILES  # the journal, the limits store, the API keys (as hashes)
VECTORS = VECTORS_DIR


class BackupError(RuntimeError):
    """A backup or restore that cannot go ahead; the message says why and what to do."""


# ---------------------------------------------------------------- backup


def backup(data_dir: Path, dest: Path, progress: Progress = no_progress) -> dict[str, Any]:
    """Snapshot `data_dir` into the new directory `dest`; returns a summary."""
    data_dir = data_dir.absolute()
    dest = dest.absolute()
    if not (data_dir / JOURNAL).is_file():
        raise BackupError(
            f"no {JOURNAL} in {data_dir}: is it a memory-service data dir? (--data-dir, env MEMORY_DATA_DIR)"
        )
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} already exists and is not empty: back up into a new directory")
    if dest == data_dir or data_dir in dest.parents:
        raise BackupError(f"{dest} is inside the data dir: back up somewhere else")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    lock = DataDirLock(data_dir)
    try:
        lock = DataDir(data_dir).lock(exclusive=True)
        quiescent = True  # no service: the vector files hold still and can be copied
    except DataDirBusy:
        quiescent = False
    try:
        private_dir(staging)
        sources = [data_dir / name for name in DATABASES if (data_dir / name).is_file()]
        copied = CopiedBytes(progress, COPYING, sources + (files_under(data_dir / VECTORS) if quiescent else []))
        files = {source.name: _snapshot(source, staging / source.name, copied) for source in sources}
        vectors: dict[str, Any] = {"mode": "rebuild"}
        if quiescent and (data_dir / VECTORS).is_dir():
            shutil.copytree(data_dir / VECTORS, staging / VECTORS, copy_function=copied.copy)
            vectors = {
                "mode": "copied",
                "files": {
                    f"{VECTORS}/{path.relative_to(staging / VECTORS).as_posix()}": describe(path)
                    for path in sorted((staging / VECTORS).rglob("*"))
                    if path.is_file()
                },
            }
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "source_data_dir": str(data_dir),
            "package_version": _package_version(),
            "files": files,
            "vectors": vectors,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        make_private(staging)
        sync_tree(staging)
        if dest.exists():
            dest.rmdir()
        staging.rename(dest)
        sync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        lock.release()
    journal_rows = files[JOURNAL]["rows"]
    return {
        "backup": str(dest),
        "data_dir": str(data_dir),
        "created_at": manifest["created_at"],
        "memories": journal_rows.get("memories", 0),
        "facts": journal_rows.get("facts", 0),
        "databases": sorted(files),
        "vectors": "copied" if vectors["mode"] == "copied" else "rebuilt on restore",
    }


def _snapshot(source: Path, target: Path, copied: CopiedBytes) -> dict[str, Any]:
    """One consistent copy of a live SQLite database, as a single self-contained file."""
    src = sqlite3.connect(source, timeout=30)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)  # all pages in one step: one read snapshot, writers are not blocked (WAL)
        dst.execute("PRAGMA journal_mode=DELETE")  # no -wal beside the copy
        problem = _check_database(dst)
        if problem:
            raise BackupError(f"{source} fails SQLite's check ({problem}): the database itself is damaged")
        rows = _row_counts(dst)
    finally:
        dst.close()
        src.close()
    copied.add(source)
    return {**describe(target), "rows": rows}


def _row_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Rows per table, leaving out full-text indexes (derived from the tables they index)."""
    tables = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchall()
    virtual = [name for name, sql in tables if (sql or "").upper().startswith("CREATE VIRTUAL")]
    real = [name for name, _ in tables if name not in virtual and not any(name.startswith(v + "_") for v in virtual)]
    return {name: conn.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()[0] for name in real}


def _check_database(conn: sqlite3.Connection) -> str | None:
    result = [row[0] for row in conn.execute("PRAGMA quick_check")]
    return None if result == ["ok"] else "; ".join(map(str, result[:3]))


# ---------------------------------------------------------------- verify


def verify(src: Path) -> dict[str, Any]:
    """The backup's manifest once every file it lists is present with its size and checksum."""
    if not src.is_dir():
        raise BackupError(f"{src} is not a directory")
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except FileNotFoundError:
        raise BackupError(f"{src} is not a complete backup: {MANIFEST} is missing") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"{src}/{MANIFEST} is unreadable ({exc}): the backup is damaged") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"{src}/{MANIFEST} is not a memory-service backup manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BackupError(
            f"{src} was written in backup format {version!r}; this version reads up to "
            f"{FORMAT_VERSION}: upgrade memory-service to restore it"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or JOURNAL not in files:
        raise BackupError(f"{src}/{MANIFEST} lists no {JOURNAL}: the backup is damaged")
    for name, info in _listed(manifest).items():
        problem = _file_problem(src, name, info)
        if problem:
            raise BackupError(f"the backup in {src} is damaged: {problem}; nothing was restored")
    return manifest


def _listed(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    vectors = manifest.get("vectors") or {}
    return {**manifest["files"], **(vectors.get("files") or {} if vectors.get("mode") == "copied" else {})}


def _file_problem(root: Path, name: str, info: Any) -> str | None:
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts or not isinstance(info, dict):
        return f"the manifest entry {name!r} is not a file of the backup"
    path = root / relative
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size != info.get("bytes"):
        return f"{name} has {size} bytes, the manifest says {info.get('bytes')}"
    if sha256(path) != info.get("sha256"):
        return f"{name} does not match its checksum in the manifest"
    return None


# ---------------------------------------------------------------- restore


def restore(
    src: Path,
    settings: Settings,
    *,
    force: bool = False,
    rebuild_vectors: bool = False,
    progress: Progress = no_progress,
) -> dict[str, Any]:
    """Make `settings.data_dir` the state saved in the backup `src`; returns a summary."""
    src = src.absolute()
    data_dir = settings.data_dir.absolute()
    manifest = verify(src)
    if settings.chroma_url:
        raise BackupError(
            "restore rebuilds the vector store under the data dir, but MEMORY_CHROMA_URL points at a "
            "Chroma server: unset it to restore into the embedded store"
        )
    lock, occupied = _lock_for_restore(data_dir, force)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    staging = restore_staging(data_dir, stamp)
    try:
        private_dir(staging)
        copied = manifest.get("vectors", {}).get("mode") == "copied" and not rebuild_vectors
        files = [src / name for name in manifest["files"]] + (files_under(src / VECTORS) if copied else [])
        counter = CopiedBytes(progress, COPYING, files)
        _stage_databases(src, staging, manifest, counter)
        if copied:
            shutil.copytree(src / VECTORS, staging / VECTORS, copy_function=counter.copy)
            embedded = None
        else:
            embedded = _rebuild_vectors(staging, settings, progress)
        (staging / RESTORE_READY).touch()  # complete: a start that finds only this dir tells how to finish
        make_private(staging)
        sync_tree(staging)
        previous = _swap_in(staging, data_dir, occupied, stamp)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        lock.release()
    journal_rows = manifest["files"][JOURNAL].get("rows", {})
    summary: dict[str, Any] = {
        "restored": str(data_dir),
        "from": str(src),
        "backup_created_at": manifest.get("created_at"),
        "memories": journal_rows.get("memories"),
        "facts": journal_rows.get("facts"),
        "vectors": "copied" if copied else "rebuilt",
        "previous_data": str(previous) if previous else None,
    }
    if embedded is not None:
        summary.update(passages_embedded=embedded.passages, facts_embedded=embedded.facts)
    return summary


def _lock_for_restore(data_dir: Path, force: bool) -> tuple[DataDirLock, bool]:
    """The data dir's exclusive lock (none to take if it does not exist yet), and whether it holds data."""
    if data_dir.exists() and not data_dir.is_dir():
        raise BackupError(f"{data_dir} is not a directory")
    lock = DataDirLock(data_dir)
    if data_dir.is_dir():
        try:
            lock = DataDir(data_dir).lock(exclusive=True)
        except DataDirBusy:
            raise BackupError(f"a memory-service is running on {data_dir}: stop it, then restore") from None
    occupied = data_dir.is_dir() and any(p.name != LOCK_NAME for p in data_dir.iterdir())
    if occupied and not force:
        lock.release()
        raise BackupError(
            f"{data_dir} already holds data: pass --force to restore over it (the current data "
            "is moved aside, not deleted)"
        )
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    return lock, occupied


def _stage_databases(src: Path, staging: Path, manifest: dict[str, Any], copied: CopiedBytes) -> None:
    """Copy the backup's databases into `staging`, checking each copy (checksum, then SQLite's own check)."""
    for name, info in manifest["files"].items():
        shutil.copyfile(src / name, staging / name)
        copied.add(src / name)
        problem = _file_problem(staging, name, info)  # the copy, not only the original, is what counts
        if problem:
            raise BackupError(f"copying the backup failed: {problem}; nothing was restored")
        conn = sqlite3.connect(staging / name)
        try:
            problem = _check_database(conn)
        finally:
            conn.close()
        if problem:
            raise BackupError(
                f"{src / name} fails SQLite's check ({problem}): the backup is damaged; nothing was restored"
            )


def _swap_in(staging: Path, data_dir: Path, occupied: bool, stamp: str) -> Path | None:
    """Rename the staged data dir into place; the current data, if any, is moved aside (returned), not deleted.
    The parent is fsynced after each rename: else a power cut may keep the second and lose the first."""
    aside: Path | None = None
    if data_dir.exists():
        if occupied:
            aside = kept_aside(data_dir, stamp)
            data_dir.rename(aside)
        else:
            (data_dir / LOCK_NAME).unlink(missing_ok=True)
            data_dir.rmdir()
        sync_dir(data_dir.parent)
    try:
        staging.rename(data_dir)
    except BaseException:
        if aside is not None:
            aside.rename(data_dir)
            sync_dir(data_dir.parent)
        raise
    sync_dir(data_dir.parent)
    (data_dir / RESTORE_READY).unlink()
    sync_dir(data_dir)
    return aside


def _rebuild_vectors(staging: Path, settings: Settings, progress: Progress) -> Reindexed:
    """Embed the restored journal into a new vector store beside it (the model loads only here)."""
    from ..embedding.embedder import embedder_for
    from ..embedding.selection import model_for
    from .reindex import reindex

    data = DataDir(staging)
    model, _ = model_for(settings, data)  # the backup holds no vectors: they become this model's
    journal = data.open_journal()
    try:
        vectors = data.open_vectors()
        done = reindex(journal, embedder_for(settings, model), vectors, progress=progress)
    finally:
        journal.close()
    data.record_embedder(model)
    return done


def _package_version() -> str:
    try:
        return metadata.version("memory-service")
    except metadata.PackageNotFoundError:
        return "unknown"
