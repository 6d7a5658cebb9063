"""What a small model leaves out of its facts, put back in code: who "I" is, the sentences no fact covers,
and the question a reply answers.

Measured on LoCoMo dev turns with the default 0.5B model, facts recalled less than the raw text they came
from. Reading the misses showed three causes that need no model to fix:
- facts kept the speaker's "I" and "my" ("I'd love to support those with similar issues"), so the fact
  does not say whom it is about, although the chat line names its speaker;
- the model skipped whole sentences that carry the answer (a necklace from a grandma in Sweden, an ad
  campaign just launched), and a fact that was never written can never be recalled;
- a reply that only makes sense with the question before it ("5 years already!", "Yes! I finally did
  it") names nothing that a later question asks about.

So, after grounding: a text that opens with a speaker header ("[date] Caroline: ...") has its first
person in every fact rewritten to the speaker's name, and each sentence of the text that states something
(three content words or more, not a question, not small talk) but that no kept fact covers becomes a fact
of its own, in the same third person. Both keep the words of the text, so grounding, spans and the date
resolution that follows still apply. When the save just before it in its conversation ended on a question
by someone else, the reply up to its first sentence that names something is also kept with that question,
as one fact whose sources are both saves. Last, a fact of a chat line that still does not name its speaker
("The 2 younger kids love nature.", a shared photo's caption) is stored as the line's own header shows it,
"Melanie: The 2 younger kids love nature.": the raw line names who said it, so a fact that does not would
lose to it for every question that names the person (on the LoCoMo dev conversations, facts-only
recall@10 +0.013 and +0.027 with the same model output). The job's report counts what was added.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ..contract.text import normalize
from .gate import FILLER
from .grounding import SMALL_TALK, GroundedFact, content_words, stem, vague
from .guard import reads_nothing_on_error
from .identifiers import capitalised
from .phatic import states_nothing
from .sentences import sentence_spans
from .speakers import Line, line_at, lines_of, without_speaker_prefix

# "[8 May 2023, 1:56 pm] Caroline: ..." or "Caroline: ..." at the start of a text: a chat line by Caroline.
_HEADER = re.compile(r"^\s*(?:\[[^\]\n]{1,60}\]\s*)?([A-Z][\w.'’-]*(?: [A-Z][\w.'’-]*)?):[ \t]+")
# Words that open a labelled note, not a chat line: "Note: I restarted it" is not said by "Note".
LABELS = frozenset(
    """note notes summary error warning warn info debug update status result results task todo question answer
    subject re fwd fw reply log output input action observation thought plan step reason context tip fyi ps
    important reminder alert issue fix bug done next goal decision""".split()
)
# First-person forms and their third-person replacements ("{}" is the speaker's name).
_FIRST_PERSON = [
    (re.compile(r"\bI[’']m\b"), "{} is"),
    (re.compile(r"\bI[’']ve\b"), "{} has"),
    (re.compile(r"\bI[’']d\b"), "{} would"),
    (re.compile(r"\bI[’']ll\b"), "{} will"),
    (re.compile(r"\bI am\b"), "{} is"),
    (re.compile(r"\bI was\b"), "{} was"),
    (re.compile(r"\bI\b"), "{}"),
    (re.compile(r"\b[Mm]yself\b"), "{}"),
    (re.compile(r"\b[Mm]y\b"), "{}'s"),
    (re.compile(r"\b[Mm]ine\b"), "{}'s"),
    (re.compile(r"\bme\b"), "{}"),
    # "we" is the speaker's side: the speaker is who can be asked about it
    (re.compile(r"\b[Ww]e[’']re\b|\b[Ww]e are\b"), "{} is"),
    (re.compile(r"\b[Ww]e[’']ve\b"), "{} has"),
    (re.compile(r"\b[Ww]e were\b"), "{} was"),
    (re.compile(r"\b[Ww]e\b"), "{}"),
    (re.compile(r"\b[Oo]ur\b"), "{}'s"),
]
MIN_SENTENCE_WORDS = 3  # content words a sentence needs to count as a statement
COVERED_SHARE = 0.5  # a sentence whose content words are at least this much in the kept facts is covered
MAX_SENTENCE_CHARS = 300  # a longer sentence stays the passage's: a fact is one short statement
MAX_ADDED = 8  # sentences added per text at most: a long report is the model's and the passage's job
MAX_QUESTION_CHARS = 160  # the question an answer keeps, cut at its end (its last words are the question)
MAX_ANSWER_CHARS = 200
_SECOND_PERSON = [
    (re.compile(r"\byou[’']re\b", re.IGNORECASE), "{} is"),
    (re.compile(r"\byou[’']ve\b", re.IGNORECASE), "{} has"),
    (re.compile(r"\b(?:are|were|have|do|did) you\b", re.IGNORECASE), None),
    (re.compile(r"\byour(?:s)?\b", re.IGNORECASE), "{}'s"),
    (re.compile(r"\byou\b", re.IGNORECASE), "{}"),
]


@dataclass(frozen=True)
class Speaker:
    name: str
    body_start: int  # where the text after the header starts


def speaker_of(text: str) -> Speaker | None:
    """The speaker a chat-line header names, or None (no header, or a label such as "Note:")."""
    match = _HEADER.match(text)
    if match is None or match.group(1).split()[0].lower() in LABELS:
        return None
    return Speaker(match.group(1), match.end())


def _sentences(text: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """(where it starts, the sentence) for each non-blank sentence of `text` from `start`, spaces trimmed."""
    for begin, end in sentence_spans(text[start:]):
        yield start + begin, text[start + begin : start + end]


def in_third_person(sentence: str, speaker: str) -> str:
    """`sentence` with the speaker's I, me, my and mine replaced by the speaker's name."""
    for pattern, replacement in _FIRST_PERSON:
        sentence = pattern.sub(replacement.format(speaker), sentence)
    return sentence


def to_listener(sentence: str, listener: str) -> str:
    """`sentence` with "you" and "your" replaced by the listener's name ("did you" -> "did Melanie")."""
    for pattern, replacement in _SECOND_PERSON:
        if replacement is None:  # "are you" -> "are Melanie": keep the verb, name the listener
            sentence = pattern.sub(lambda m: m.group(0).rsplit(" ", 1)[0] + " " + listener, sentence)
        else:
            sentence = pattern.sub(replacement.format(listener), sentence)
    return sentence


@dataclass(frozen=True)
class Asked:
    """The save just before a text in its conversation, when it ends on a question."""

    memory_id: str
    question: str  # in the asker's third person
    start: int  # the question's span in that save
    end: int
    asker: str | None  # who asked it, when that save names its speaker


@reads_nothing_on_error(lambda memory_id, text: None)
def asked_in(memory_id: str, text: str) -> Asked | None:
    """The question an earlier save ends on (its last sentence, if that is a question), or None."""
    speaker = speaker_of(text)
    last = None
    for sentence_at in _sentences(text, speaker.body_start if speaker else 0):
        last = sentence_at
    if last is None or not last[1].endswith("?"):
        return None
    begin, sentence = last
    end = begin + len(sentence)
    start = max(begin, end - MAX_QUESTION_CHARS)
    question = in_third_person(text[start:end], speaker.name) if speaker else text[start:end]
    return Asked(memory_id, question, start, end, speaker.name if speaker else None)


def answer_to(asked: Asked, text: str) -> GroundedFact | None:
    """A reply to a question, with the question it answers: "Melanie, asked how long have Melanie and
    Melanie's husband been married? said: 5 years already!". The answer alone ("5 years already!", "Yes! I
    finally did it") names nothing the question asked about; the pair does. The question's save becomes a
    source of the fact."""
    speaker = speaker_of(text)
    if speaker is None or speaker.name == asked.asker:
        return None  # whose answer it is must be known, and someone answering their own question is not one
    span = _answer_span(text, speaker, asked.asker)
    if span is None:
        return None
    begin, end = span
    answer = text[begin:end]
    question = to_listener(asked.question, speaker.name)
    question = question[0].lower() + question[1:]
    said = in_third_person(answer, speaker.name)
    return GroundedFact(
        f"{speaker.name}, asked {question} said: {said}",
        [(begin, begin + len(answer))],
        [(asked.memory_id, asked.start, asked.end)],
    )


def _answer_span(text: str, speaker: Speaker, asker: str | None) -> tuple[int, int] | None:
    """Where the answer of a reply is: from its start to the end of its first sentence that names something.

    "Thanks! Searching for investors has been tough" answers "How's the hunt for investors going?" with
    its second sentence: a reply's first sentence is often only "Thanks!" or "Wow, Jon!". The words before
    stay ("Yes! I finally did it" answers a yes-or-no question with its first word). None when the reply
    says nothing or first asks back."""
    names = {stem(w) for w in normalize(f"{speaker.name} {asker or ''}").split()}
    begin = end = None
    for start, sentence in _sentences(text, speaker.body_start):
        if sentence.endswith("?"):
            return None  # a question answered with a question
        begin = start if begin is None else begin
        end = min(start + len(sentence), begin + MAX_ANSWER_CHARS)
        if _stems(sentence) - names or end - begin >= MAX_ANSWER_CHARS:
            break
    return None if begin is None or end is None else (begin, end)


def _stems(text: str) -> set[str]:
    """The stems of a text's content words, small talk left out ("Haha, thanks, Wren said: talk soon!")."""
    return {stem(w) for w in content_words(normalize(text)) if w not in SMALL_TALK and w not in FILLER}


@dataclass
class GapsFilled:
    """The facts once what the model left out is filled in, and what was filled in (for the job's report)."""

    facts: list[GroundedFact]
    speaker: str | None
    rewritten: int  # facts whose first person was rewritten
    added: int  # sentences no fact covered, added as facts
    attributed: int = 0  # facts that did not name the speaker, given the line's "Speaker: " in front
    answered_id: str | None = None  # the save whose question this text answers (a source of the pair)

    @property
    def answered(self) -> bool:
        return self.answered_id is not None


@reads_nothing_on_error(lambda facts, text, asked=None: GapsFilled(facts, None, 0, 0))  # unread: the model's facts
def fill_in_gaps(facts: list[GroundedFact], text: str, asked: Asked | None = None) -> GapsFilled:
    """The model's grounded facts in the speaker's third person, plus the text's uncovered statements, and,
    when the save before it ended on a question (`asked`), the answer with its question."""
    speaker = speaker_of(text)
    lines = lines_of(text)
    names = {line.speaker for line in lines if line.speaker}
    out: list[GroundedFact] = []
    rewritten = 0
    for fact in facts:
        who = _speaker_of_fact(text, lines, fact)
        body = without_speaker_prefix(fact.text, names)  # a header the model copied, maybe another line's
        changed = in_third_person(body, who) if who else body
        rewritten += changed != fact.text
        out.append(replace(fact, text=changed) if changed != fact.text else fact)
    covered: set[str] = set()
    for fact in out:
        covered |= _stems(fact.text)
    seen = {normalize(f.text) for f in out}
    added = 0
    for begin, sentence, who in _line_sentences(text, lines):
        if added >= MAX_ADDED:
            break
        if sentence.endswith("?") or len(sentence) > MAX_SENTENCE_CHARS or vague(sentence) or states_nothing(sentence):
            continue
        words = _stems(sentence)
        if len(words) < MIN_SENTENCE_WORDS:
            continue
        if len(words & covered) >= COVERED_SHARE * len(words):
            continue
        statement = in_third_person(capitalised(sentence), who) if who else capitalised(sentence)
        if normalize(statement) in seen:
            continue
        seen.add(normalize(statement))
        out.append(GroundedFact(statement, [(begin, begin + len(sentence))]))
        covered |= words
        added += 1
    attributed = 0
    for index, fact in enumerate(out):
        who = _speaker_of_fact(text, lines, fact)
        if who is not None and not mentions(fact.text, who):
            out[index] = replace(fact, text=f"{who}: {fact.text}")
            attributed += 1
    pair = answer_to(asked, text) if asked is not None else None
    if pair is not None and normalize(pair.text) not in seen:
        out.append(pair)  # it names the speaker: "Melanie, asked ... said: ..."
    answered_id = asked.memory_id if pair is not None and asked is not None else None
    return GapsFilled(out, speaker.name if speaker else None, rewritten, added, attributed, answered_id)


def _speaker_of_fact(text: str, lines: list[Line], fact: GroundedFact) -> str | None:
    """The speaker of the line a fact rests on most (its first when tied): a fact that also names another
    speaker ("Priya: Tomás moved ...") rests on that speaker's line too, but less."""
    if not fact.spans:
        return None
    words = _stems(fact.text)
    best = max(fact.spans, key=lambda span: (len(words & _stems(text[span[0] : span[1]])), -span[0]))
    line = line_at(lines, best[0])
    return line.speaker if line is not None else None


def _line_sentences(text: str, lines: list[Line]) -> Iterator[tuple[int, str, str | None]]:
    """(where it starts, the sentence, its line's speaker) for each sentence after each line's header."""
    for line in lines:
        stop = line.end if line.body_end < 0 else line.body_end
        for begin, end in sentence_spans(text[line.body_start : stop]):
            yield line.body_start + begin, text[line.body_start + begin : line.body_start + end], line.speaker


def mentions(text: str, name: str) -> bool:
    """Whether `text` names someone: any word of the name ("Jon" for "Jon Smith"), in any case."""
    words = set(normalize(text).split())
    return any(part in words for part in normalize(name).split() if len(part) > 1)
