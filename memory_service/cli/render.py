"""What the memory commands print for a person (`--json` prints the service's answer instead, for scripts).

Plain aligned lines, one per hit or memory, the free text last: ids are fixed-width, so columns line up
without a table library, and a line stays whole for grep. On a terminal the text is cut to its width; in a
pipe it is not. rich's tables were tried and left: in a pipe they fit every table into 80 columns and squeeze
the 36-character memory ids to `mem_20d5…`, which `get` cannot use. (rich draws the progress bars: progress.py.)
"""

from __future__ import annotations

import shutil
import sys
from typing import Any


def _fit(line: str) -> str:
    """`line` cut to the terminal's width when stdout is one; whole otherwise."""
    if not sys.stdout.isatty():
        return line
    width = shutil.get_terminal_size().columns
    return line if len(line) <= width else line[: width - 1] + "…"


def _flat(text: str) -> str:
    return " ".join(text.split())


def print_recall(answer: dict[str, Any], *, context_only: bool) -> None:
    """The paste-ready context block, then the hits with their scores (unless `context_only`)."""
    items = answer.get("items", [])
    if context_only:
        if answer.get("context"):
            print(answer["context"])
        return
    if not items:
        print(answer.get("note") or "no memories match")
        return
    print(answer.get("context", ""))
    print()
    print(f"{'score':<7} {'similarity':<10} {'kind':<12} {'memory':<36}  text")
    for item in items:
        similarity = item.get("similarity")
        sim = "-" if similarity is None else f"{similarity:.2f}"
        print(
            _fit(f"{item['score']:<7.4f} {sim:<10} {item['kind']:<12} {item['memory_id']:<36}  {_flat(item['text'])}")
        )
    if answer.get("note"):  # the relevance floor's word on the hits it left out
        print(answer["note"])


def print_memories(page: dict[str, Any]) -> None:
    """One line per memory, newest first, and how to ask for the next page."""
    items = page.get("items", [])
    if not items:
        print("no memories")
    else:
        print(f"{'id':<36}  {'status':<10} {'saved':<16}  {'facts':>5}  {'agent':<12} text")
        for memory in items:
            saved = str(memory.get("created_at", ""))[:16].replace("T", " ")
            facts = str(memory.get("facts", ""))
            print(
                _fit(
                    f"{memory['id']:<36}  {memory['status']:<10} {saved:<16}  {facts:>5}  "
                    f"{memory['agent_id']:<12} {_flat(memory['text'])}"
                )
            )
    if page.get("next_cursor"):
        print(f"more: repeat with --cursor {page['next_cursor']}")


def print_memory(memory: dict[str, Any]) -> None:
    """A memory in short lines: who, when, its status, its facts, what went wrong."""
    head = f"{memory['id']}  {memory['status']}  agent {memory['agent_id']}"
    if memory.get("run_id"):
        head += f"  run {memory['run_id']}"
    print(head)
    print(f"saved {str(memory.get('created_at', ''))[:19].replace('T', ' ')} UTC" + _tags(memory.get("tags") or []))
    progress = memory.get("progress")
    if progress and memory["status"] in ("queued", "extracting"):
        print(f"extracting: {progress_words(progress)}")
    print(f"text: {_shorten(memory['text'], 300)}")
    print_facts(memory)
    if memory.get("last_error"):
        print(f"last error: {memory['last_error']}")


def print_facts(memory: dict[str, Any]) -> None:
    """`N facts:` and one line each (superseded ones marked), or why there are none."""
    facts = memory.get("facts") or []
    if not facts:
        print("no facts" + ("" if memory["status"] in ("done", "failed") else " yet"))
        return
    print(f"{len(facts)} fact{'s' if len(facts) != 1 else ''}:")
    for fact in facts:
        mark = " (superseded)" if fact.get("superseded_by") else ""
        print(f"  - {fact['text']}{mark}")


def progress_words(progress: dict[str, int]) -> str:
    """`8000/20000 characters, 2 chunks done` from a memory's `progress`."""
    parts = []
    if progress.get("chars_total"):
        parts.append(f"{progress.get('chars_done', 0)}/{progress['chars_total']} characters")
    if progress.get("chunks_done"):
        parts.append(f"{progress['chunks_done']} chunks done")
    return ", ".join(parts) or "started"


def print_saved(saved: dict[str, Any]) -> None:
    """A save's receipt: its id, and when its facts should be there."""
    eta = saved.get("estimated_extraction_s")
    when = f", facts in ~{eta:.0f} s" if eta is not None else ""
    again = "" if saved.get("created", True) else " (saved before with this idempotency key)"
    print(f"saved {saved['id']}: {saved['status']}, {saved['queue_depth']} in the queue{when}{again}")


def print_summary(title: str, summary: dict[str, Any]) -> None:
    """A command's summary as `title` and aligned `key  value` lines (None left out)."""
    print(title)
    shown = {key: value for key, value in summary.items() if value is not None}
    width = max((len(key) for key in shown), default=0)
    for key, value in shown.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        print(f"  {key.replace('_', ' ').ljust(width)}  {value}")


def _tags(tags: list[str]) -> str:
    return f"  tags {', '.join(tags)}" if tags else ""


def _shorten(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
