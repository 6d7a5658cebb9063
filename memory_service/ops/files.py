"""The file work a backup and a restore share: checksums, owner-only directories, syncing to disk, and copying
with the bytes done reported (progress.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .progress import Progress, Stage

COPYING = Stage("copying", "bytes")


class CopiedBytes:
    """Bytes copied of a known set of files, reported as one stage; `copy` serves as copytree's copy_function."""

    def __init__(self, progress: Progress, stage: Stage, paths: Iterable[Path]) -> None:
        self.progress, self.stage = progress, stage
        self.total = sum(path.stat().st_size for path in paths if path.is_file())
        self.done = 0
        progress(stage, 0, self.total)

    def add(self, path: Path) -> None:
        self.done += path.stat().st_size
        self.progress(self.stage, self.done, max(self.total, self.done))

    def copy(self, source: str, target: str) -> str:
        copied = shutil.copy2(source, target)
        self.add(Path(source))
        return str(copied)


def files_under(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()] if root.is_dir() else []


def describe(path: Path) -> dict[str, Any]:
    return {"sha256": sha256(path), "bytes": path.stat().st_size}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def private_dir(path: Path) -> None:
    """A new directory only its owner can enter, whatever the umask (what is written in it stays private)."""
    path.mkdir(mode=0o700)
    path.chmod(0o700)


def sync_dir(path: Path) -> None:
    """A directory's entries (a rename into or out of it) on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(root: Path) -> None:
    """Files and directories on disk before the rename that makes them visible."""
    for path in [*sorted(root.rglob("*")), root]:
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
