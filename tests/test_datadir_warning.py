"""A new data dir starts without a warning; data that really was readable by others is still reported.

`prepare` warns when it takes group and others' access away, because then something in the data dir was
readable by them. An empty dir made for the service (`mkdir`, the benchmarks' and the tests' launcher, a
container volume) had nothing to read, yet its first start logged that warning about it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from conftest import ServiceProcess

from memory_service.storage.datadir import DataDir

WARNING_TEXT = "took group and others' access away"


def made_with_usual_umask(path: Path) -> Path:
    previous = os.umask(0o022)
    try:
        path.mkdir()
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o755
    return path


def test_an_empty_dir_made_for_the_service_is_tightened_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = made_with_usual_umask(tmp_path / "data")
    with caplog.at_level(logging.WARNING):
        DataDir(data_dir).prepare()
    assert data_dir.stat().st_mode & 0o777 == 0o700
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_data_dir_whose_files_others_could_read_is_still_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = made_with_usual_umask(tmp_path / "data")
    journal = data_dir / "journal.sqlite3"
    journal.write_bytes(b"")
    journal.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        DataDir(data_dir).prepare()
    assert journal.stat().st_mode & 0o777 == 0o600
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and WARNING_TEXT in warnings[0] and "2 path(s)" in warnings[0]


@pytest.mark.process
def test_serve_on_a_new_data_dir_logs_no_warning(tmp_path: Path) -> None:
    """The benchmarks' launcher (which the tests share) makes the data dir, then starts `serve` on it."""
    data_dir = tmp_path / "data"
    previous = os.umask(0o022)
    try:
        service = ServiceProcess(data_dir, "http://127.0.0.1:9").start()
    finally:
        os.umask(previous)
    try:
        log = service.log()
    finally:
        service.stop()
    assert WARNING_TEXT not in log, log
    assert data_dir.stat().st_mode & 0o777 == 0o700
