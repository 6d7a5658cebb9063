"""LoCoMo-format data: conversations of dated turns, and the questions with the turns that answer them.

Evidence ids come written many ways in the data set (`D8:6; D9:17`, `D30:05`, `D:11:26`);
they are normalised here so a question is judged by the turns that really exist.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

SKIP_CATEGORIES = {5}  # adversarial: no turn answers them
_EVIDENCE = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_AGENT_OK = re.compile(r"[^A-Za-z0-9._:@/-]")


@dataclass
class Turn:
    dia_id: str
    session: int
    date: str
    speaker: str
    text: str
    caption: str | None = None


@dataclass
class Question:
    index: int
    question: str
    category: int
    evidence: list[str]
    raw_evidence: list[str]
    answer: str = ""  # the gold answer (LoCoMo's `answer`), for the reader's F1 and the judge


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[Question]
    skipped: dict[str, int] = field(default_factory=dict)
    # LoCoMo's own observations: (statement, dia_id of the turn it cites), the silver facts of each turn
    observations: list[tuple[str, str]] = field(default_factory=list)


def normalize_evidence(raw: Iterable[str], valid: set[str] | None = None) -> list[str]:
    """`D8:6; D9:17` -> [D8:6, D9:17]; `D30:05` -> D30:5; `D:11:26` -> D11:26; ids not in `valid` dropped."""
    out: list[str] = []
    for entry in raw:
        for session, turn in _EVIDENCE.findall(str(entry)):
            dia_id = f"D{int(session)}:{int(turn)}"
            if (valid is None or dia_id in valid) and dia_id not in out:
                out.append(dia_id)
    return out


def turn_text(turn: Turn) -> str:
    """What an agent would save: speaker and session date in the text, a shared photo described."""
    text = f"[{turn.date}] {turn.speaker}: {turn.text}"
    if turn.caption:
        text += f" (shared a photo: {turn.caption})"
    return text


def session_time(value: str) -> str | None:
    """LoCoMo's session date ("1:56 pm on 8 May, 2023") as ISO-8601, or None when it reads otherwise."""
    for layout in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(value.strip(), layout).isoformat()
        except ValueError:
            continue
    return None


def agent_id_for(sample_id: str) -> str:
    cleaned = _AGENT_OK.sub("-", sample_id).strip("-") or "conversation"
    return cleaned if cleaned[0].isalnum() else "c" + cleaned


def _session_numbers(conv: dict[str, Any]) -> list[int]:
    nums = []
    for key, value in conv.items():
        match = re.fullmatch(r"session_(\d+)", key)
        if match and isinstance(value, list):
            nums.append(int(match.group(1)))
    return sorted(nums)


def parse_conversation(sample: dict[str, Any]) -> Conversation:
    conv = sample["conversation"]
    turns: list[Turn] = []
    for n in _session_numbers(conv):
        date = str(conv.get(f"session_{n}_date_time") or "").strip()
        for raw in conv[f"session_{n}"]:
            caption = raw.get("blip_caption")
            ids = normalize_evidence([raw["dia_id"]])
            turns.append(
                Turn(
                    dia_id=ids[0] if ids else str(raw["dia_id"]),
                    session=n,
                    date=date,
                    speaker=str(raw.get("speaker", "")),
                    text=str(raw.get("text", "")),
                    caption=str(caption) if caption else None,
                )
            )
    valid = {t.dia_id for t in turns}
    questions: list[Question] = []
    skipped = {"adversarial": 0, "no_valid_evidence": 0}
    for index, qa in enumerate(sample.get("qa", [])):
        category = int(qa.get("category", 0))
        if category in SKIP_CATEGORIES:
            skipped["adversarial"] += 1
            continue
        raw_evidence = [str(e) for e in qa.get("evidence", [])]
        evidence = normalize_evidence(raw_evidence, valid)
        if not evidence:
            skipped["no_valid_evidence"] += 1
            continue
        answer = str(qa.get("answer", ""))
        questions.append(Question(index, str(qa["question"]), category, evidence, raw_evidence, answer))
    return Conversation(str(sample["sample_id"]), turns, questions, skipped, _observations(sample, valid))


def _observations(sample: dict[str, Any], valid: set[str]) -> list[tuple[str, str]]:
    """`observation: {session_N_observation: {speaker: [[statement, dia_id], ...]}}`, each statement with
    the turn it cites; a malformed entry or one citing no turn of the conversation is left out."""
    out: list[tuple[str, str]] = []
    sessions = sample.get("observation")
    for per_speaker in sessions.values() if isinstance(sessions, dict) else []:
        for entries in per_speaker.values() if isinstance(per_speaker, dict) else []:
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[0], str):
                    cited = normalize_evidence([str(entry[1])], valid)
                    out.extend((entry[0], dia_id) for dia_id in cited[:1])
    return out


def load(path: Path, limit: int | None = None) -> list[Conversation]:

    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not data or "conversation" not in data[0]:
        raise ValueError(f"{path} is not LoCoMo-format data (a JSON list of {{sample_id, conversation, qa}})")
    samples = data[:limit] if limit else data
    return [parse_conversation(s) for s in samples]


def is_locomo(path: Path) -> bool:
    """A JSON list whose first element has `conversation` and `qa`."""

    if path.suffix != ".json":
        return False
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "conversation" in data[0]
