"""Earlier saves of a conversation, shown to the model as past turns before the text to extract.

Kept apart from the extractor: the worker builds them from the journal, the extractor only shows them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeGuard


@dataclass(frozen=True)
class Earlier:
    """An earlier save shown as a past turn: its text (cut at its head to a maximum, from `offset` in that
    save's text) and the model's answer to it."""

    memory_id: str
    text: str
    offset: int
    answer: str


NO_FACTS = '{"facts": []}'


def earlier_context(saves: list[tuple[str, str, str | None]], max_chars: int) -> list[Earlier]:
    """Earlier saves (id, text, raw reply) as past turns. A reply that is not a clean facts answer (a
    failure, a skip, several chunks) is shown as no facts: a past turn must never teach a bad answer."""
    out = []
    for memory_id, text, reply in saves:
        part = text[-max_chars:]
        out.append(Earlier(memory_id, part, len(text) - len(part), reply if _clean(reply) else NO_FACTS))
    return out


def _clean(reply: str | None) -> TypeGuard[str]:
    try:
        return reply is not None and isinstance(json.loads(reply).get("facts"), list)
    except (ValueError, AttributeError):
        return False


def history_of(context: list[Earlier]) -> list[tuple[str, str]]:
    return [(e.text, e.answer) for e in context]
