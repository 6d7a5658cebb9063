"""export | import: the team's memories as JSON Lines, streamed both ways (a large team never sits in memory).

A person is told what was written or read (how many memories, which file); `--json` prints it as JSON. An
import with any failed line exits 1, the summary still printed: a script must not take a partial import for done.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

from ..ops.progress import Stage
from .common import Subcommands, answer, open_service, print_json, wants_json
from .errors import EXIT_FAILED, checked
from .progress import Bars

EXPORTING, IMPORTING = Stage("exporting", "memories"), Stage("importing", "lines")
PIECE = 1 << 16  # an import goes up in 64 KiB pieces


def add_export_parser(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("export", help="write the team's memories as JSON Lines")
    parser.add_argument("--out", "-o", help="file to write, created owner-only (default stdout)")
    parser.set_defaults(func=run_export)
    return parser


def run_export(args: argparse.Namespace) -> int:
    """Stream the export to a file or stdout as it arrives. A new file is its owner's only (0600, whatever the
    umask): it holds every text the team saved. Written to a file, it says what it wrote."""
    to_file = bool(args.out) and args.out != "-"
    out: IO[bytes] = open(args.out, "wb", opener=_private) if to_file else sys.stdout.buffer
    lines = written = 0
    try:
        with open_service(args) as client, Bars() as bars:
            total = _team_memories(client) if bars.enabled else None
            with client.stream("GET", "/v1/export") as response:
                checked(response)
                for chunk in response.iter_bytes():
                    out.write(chunk)
                    lines, written = lines + chunk.count(b"\n"), written + len(chunk)
                    bars(EXPORTING, lines, total)
    finally:
        if to_file:
            out.close()
    if to_file:
        summary = {"exported": lines, "path": os.path.abspath(args.out), "bytes": written}
        if wants_json(args):
            print_json(summary)
        else:
            print(f"exported {lines} memor{'y' if lines == 1 else 'ies'} to {args.out} ({_size(written)})")
    return 0


def _team_memories(client: Any) -> int | None:
    """How many memories the export will hold (the team's count), for the bar's total; None when unknown."""
    response = client.get("/v1/team")
    return response.json().get("memories") if response.status_code == 200 else None


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def _size(count: int) -> str:
    for unit in ("bytes", "KB", "MB"):
        if count < 1024 or unit == "MB":
            return f"{count} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count} bytes"


def add_import_parser(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("import", help="read JSON Lines written by export ('-' reads stdin)")
    parser.add_argument("file", help="a file written by `memory-service export`, or '-' for stdin")
    parser.add_argument("--re-extract", action="store_true", help="drop the facts and extract them again")
    parser.set_defaults(func=run_import)
    return parser


def run_import(args: argparse.Namespace) -> int:
    """Stream the file to the service in 64 KiB pieces: an export of any size goes up without being read whole."""
    source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    try:
        with open_service(args) as client, Bars() as bars:
            total = _lines_in(source) if bars.enabled else None
            summary = answer(
                client.post(
                    "/v1/import",
                    params={"re_extract": str(args.re_extract).lower()},
                    content=_pieces(source, lambda lines: bars(IMPORTING, lines, total)),
                    headers={"content-type": "application/x-ndjson"},
                )
            )
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    if wants_json(args):
        print_json(summary)
    else:
        where = "stdin" if args.file == "-" else args.file
        print(
            f"imported {summary['imported']}, skipped {summary['skipped']} (imported before), "
            f"failed {summary['failed']} from {where}"
        )
    return _import_failures(summary)


def _lines_in(source: IO[bytes]) -> int | None:
    """The lines of a file that can be read twice (not stdin), for the bar's total; read again from the start."""
    if not source.seekable():
        return None
    count = sum(piece.count(b"\n") for piece in iter(lambda: source.read(1 << 20), b""))
    source.seek(0)
    return count


def _pieces(source: IO[bytes], sent: Callable[[int], None]) -> Iterator[bytes]:
    """The file in 64 KiB pieces, counting the lines sent: the service reads the body as it comes, so what has
    gone up is close to what it has imported."""
    lines = 0
    while piece := source.read(PIECE):
        yield piece
        lines += piece.count(b"\n")
        sent(lines)


def _import_failures(summary: dict[str, Any]) -> int:
    """Exit 1 when any line failed, even when others went in; the first few on stderr."""
    failed = summary.get("failed", 0)
    if not failed:
        return 0
    total = failed + summary.get("imported", 0) + summary.get("skipped", 0)
    first = "; ".join(f"line {e.get('line')}: {e.get('detail')}" for e in summary.get("errors", [])[:3])
    print(f"memory-service import: {failed} of {total} lines failed ({first})", file=sys.stderr)
    return EXIT_FAILED
