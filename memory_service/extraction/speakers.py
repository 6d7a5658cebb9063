"""Who said each line of a text: "Name: ..." chat lines and JSON log lines with a speaker or agent field.

A save may hold many speakers (an ops log, a pasted chat). A fact is about what its own line says, so "I"
and "we" are that line's speaker and a fact that names nobody is attributed to that speaker, never to the
first line's (the field case: every fact of a 14-line ops log got the first speaker's name in front). The
fact's line is the line its first span starts in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# "[8 May 2023, 1:56 pm] Caroline: ..." or "Caroline: ..." at the start of a line: a chat line by Caroline.
HEADER = re.compile(r"^[ \t]*(?:\[[^\]\n]{1,60}\][ \t]*)?([A-Z][\w.'’-]*(?: [A-Z][\w.'’-]*)?):[ \t]+")
# Words that open a labelled note, not a chat line: "Note: I restarted it" is not said by "Note".
LABELS = frozenset(
    """note notes summary error warning warn info debug update status result results task todo question answer
    subject re fwd fw reply log output input action observation thought plan step reason context tip fyi ps
    important reminder alert issue fix bug done next goal decision""".split()
)
SPEAKER_KEYS = ("speaker", "agent", "author", "name", "from", "user", "role")
BODY_KEYS = ("text", "message", "content", "msg", "body")
MAX_JSON_LINE = 20_000


@dataclass(frozen=True)
class Line:
    start: int
    body_start: int  # where the line's words start (after its header)
    end: int
    speaker: str | None
    body_end: int = -1  # where its words end, when not at the line's end (a JSON line's closing quote)


def _json_line(line: str) -> tuple[str, str] | None:
    """(speaker, body) of a JSON log line such as {"agent": "deployer", "message": "..."}, or None."""
    stripped = line.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")) or len(stripped) > MAX_JSON_LINE:
        return None
    try:
        record = json.loads(stripped)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    speaker = next((record[k] for k in SPEAKER_KEYS if isinstance(record.get(k), str) and record[k].strip()), None)
    body = next((record[k] for k in BODY_KEYS if isinstance(record.get(k), str)), None)
    return (speaker.strip()[:80], body) if speaker and body is not None else None


def lines_of(text: str) -> list[Line]:
    """Each non-blank line of `text` with its speaker: its header's, else the line before it's (None: no
    header yet, or a label such as "Note:")."""
    out: list[Line] = []
    current: str | None = None  # a line with no header continues the message of the line before it
    for match in re.finditer(r"[^\n]+", text):
        line = match.group()
        header = HEADER.match(line)
        if header:
            label = header.group(1).split()[0].lower() in LABELS
            current = None if label else header.group(1)
            out.append(Line(match.start(), match.start() + (0 if label else header.end()), match.end(), current))
            continue
        record = _json_line(line)
        if record is not None:
            written = json.dumps(record[1], ensure_ascii=False)[1:-1]
            found = line.find(written) if record[1] else -1
            current = record[0]
            if found >= 0:
                body = match.start() + found
                out.append(Line(match.start(), body, match.end(), current, body + len(written)))
            else:
                out.append(Line(match.start(), match.end(), match.end(), current))
            continue
        if line.strip():
            out.append(Line(match.start(), match.start(), match.end(), current))
    return out


def line_at(lines: list[Line], position: int) -> Line | None:
    """The line that holds `position` (the first line for a position before it)."""
    for line in lines:
        if position < line.end:
            return line if position >= line.start else None
    return None


def without_speaker_prefix(fact: str, speakers: set[str]) -> str:
    """`fact` without a leading "Name: " that names one of the text's speakers (the model copied a header)."""
    header = HEADER.match(fact)
    if header and header.group(1) in speakers and fact[header.end() :].strip():
        return fact[header.end() :]
    return fact
