"""Every file `serve` and its Chroma child create in the data dir while running is the owner's only.

`prepare` tightens what it finds at start, but Chroma writes new files (its segments, its SQLite journal)
while the service runs, and they took the process's umask: 0644/0755 under the usual 022, though the docs
promise 0600. `serve` now sets umask 077 before anything is created, and the Chroma child sets it too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import ServiceProcess, eventually

pytestmark = pytest.mark.process  # the modes `serve` itself gives its files


def loose(data_dir: Path) -> list[str]:
    """Paths in the data dir that group or others may read, write or enter."""
    found = []
    for root, dirs, files in os.walk(data_dir):
        for name in [*dirs, *files]:
            path = Path(root, name)
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode) and mode & 0o077:
                found.append(f"{path.relative_to(data_dir)} {stat.filemode(mode)}")
    return found


def test_files_created_while_serving_are_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    previous = os.umask(0o022)  # what `serve` inherits from a usual shell
    try:
        service = ServiceProcess(data_dir, "http://127.0.0.1:9").start()
    finally:
        os.umask(previous)
    try:
        with service.client() as client:
            assert (
                client.post(
                    "/v1/remember", json={"text": "The boiler is serviced in May.", "agent_id": "a"}
                ).status_code
                == 202
            )

            def indexed() -> bool:  # the passage is in Chroma: it has written its files
                items = client.post("/v1/recall", json={"query": "boiler service month"}).json()["items"]
                return any(item["kind"] == "passage" for item in items)

            eventually("the saved text to be searchable as a passage", indexed, timeout=120)
        chroma_files = [p for p in (data_dir / "chroma").rglob("*") if p.is_file()]
        assert chroma_files, "Chroma wrote nothing"
        assert loose(data_dir) == []
    finally:
        service.kill()
