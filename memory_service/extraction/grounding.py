"""Check every extracted fact against the text it came from.

Small models "remember" things that were never said. A fact is kept only if
its numbers, its names and most of its content words occur in the source
(after normalisation and light stemming). Facts made only of small talk are
dropped too: grounding alone can't catch them, since their words *are* in the
source. Each kept fact gets the character span(s) of the sentences it rests on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..contract.text import STOPWORDS, normalize
from .guard import reads_nothing_on_error
from .identifiers import SourceIdentifiers, capitalised
from .phatic import states_nothing
from .sentences import sentence_spans

_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_NAME = re.compile(r"\b[A-Z][\w'’-]+")
# Emails, URLs and @handles: a name inside one is not a name in the text ("alice@example.com" is not Alice).
_ADDRESS = re.compile(r"\S+@\S+|https?://\S+|www\.\S+|@\w+")
# Where one fact may hold several claims: "; ", a sentence end, ", but ", ", while ", ", whereas ", and
# ", and" / ", so" when a new subject follows ("I love dogs, and coffee is ...", ", so I ...").
_SUBJECT = r"(?:(?i:i|we|you|he|she|they|it)|[A-Z][\w'’-]+)\b"
_CLAUSE = re.compile(
    r"\s*;\s+|(?<=[.!?])\s+|,\s+(?:but|while|whereas)\s+"
    rf"|,\s+(?:and|so)\s+(?={_SUBJECT})"
)
ECHO_JACCARD = 0.8

SMALL_TALK = frozenset(
    """thanks thank haha hahaha lol talk soon bye goodbye hello hi hey great awesome cool nice glad see later welcome
    sounds sure okay ok yeah yes yep wow care take chat catch pleasure cheers morning evening night good day
    congrats congratulations amazing wonderful fun happy hear hope doing well fine alright right totally""".split()
)

# Words that open a sentence without naming anything; checked like any content word, not as names.
OPENERS = frozenset(
    """currently recently today yesterday tomorrow however additionally also overall both either neither
    everyone someone nobody meanwhile later earlier afterwards first second third finally next last since
    because although while during after before until unless once""".split()
)

MIN_CONTENT_COVERAGE = 0.6
# A statement that ends on a bare pronoun says nothing on its own: "Caroline is part of that!"
_DANGLING = re.compile(r"\b(?:it|that|this|them|those|these)\W*$", re.IGNORECASE)
VAGUE_MAX_WORDS = 4  # with this many content words or more, a statement says something despite its ending


# A number right after one of these words names a thing ("ticket 1010", "order 3"); it is not a value
# that can change. Facts that differ in such a number are about different things.
ID_WORDS = frozenset(
    """ticket order invoice issue pr id no number room flight build version release case account item task
    job run step page chapter line port pid ref bug incident ticket tickets orders invoices commit""".split()
)


def _is_number(token: str) -> bool:
    return bool(_NUMBER.fullmatch(token))


def shape(norm_text: str) -> str:
    """The fact with its value numbers masked: one shape with different values states a changed value."""
    tokens = norm_text.split()
    return " ".join("#" if _is_number(t) and not (i and tokens[i - 1] in ID_WORDS) else t for i, t in enumerate(tokens))


def identifiers(norm_text: str) -> list[str]:
    """Numbers that name things (see ID_WORDS), in order."""
    tokens = norm_text.split()
    return [t for i, t in enumerate(tokens) if _is_number(t) and i and tokens[i - 1] in ID_WORDS]


def numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in _NUMBER.findall(text)]


def stem(word: str) -> str:
    return word[:5] if len(word) > 5 else word.rstrip("s")


def vague(text: str) -> bool:
    """A short statement that ends on a bare pronoun ("Caroline is part of that!"): it says nothing without
    the text around it, and as a fact it matches every query about its subject."""
    return bool(_DANGLING.search(text.strip())) and len(content_words(normalize(text))) < VAGUE_MAX_WORDS


def content_words(norm_text: str) -> list[str]:
    return [w for w in norm_text.split() if len(w) >= 3 and w not in STOPWORDS and not w.isdigit()]


@dataclass
class GroundedFact:
    text: str
    spans: list[tuple[int, int]]
    # earlier saves given as context that the fact also rests on: (memory id, start, end) in that save
    context: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass
class RejectedFact:
    """`reason` says why to a reader; `code` is one of REJECT_CODES, a bounded name to count by."""

    text: str
    reason: str
    code: str = "other"


REJECT_CODES = (
    "question",
    "address",
    "small_talk",
    "vague",
    "numbers",
    "identifiers",
    "names",
    "coverage",
    "context",
    "other",
)
# A fact helped by context must still rest on the text: this many of its key words (or all, if fewer);
# and, since borrowed names make a made-up claim look grounded, more of its words must be found at all.
MIN_OWN_WORDS = 2
BORROWING_MIN_COVERAGE = 0.75


@dataclass
class GroundingResult:
    kept: list[GroundedFact] = field(default_factory=list)
    rejected: list[RejectedFact] = field(default_factory=list)


class SourceIndex:
    """What a fact may draw on: the source's words, stems, numbers and sentences."""

    def __init__(self, source: str, offset: int = 0) -> None:
        self.source = source
        self.offset = offset
        norm = normalize(source)
        self.words = set(norm.split())
        self.stems = {stem(w) for w in self.words}
        self.numbers = set(numbers(source))
        self.identifiers = SourceIdentifiers(source)
        # words that stand as words, outside emails and URLs: what a name in a fact must match
        self.name_words = set(normalize(_ADDRESS.sub(" ", source)).split())
        self.name_stems = {stem(w) for w in self.name_words}
        self.sentences: list[tuple[int, int, set[str]]] = []
        for start, end in sentence_spans(source):  # emails, URLs, decimals and versions stay whole
            sentence = source[start:end]  # its numbers too: a fact's "10:30" rests on the line that says it
            self.sentences.append((start, end, {stem(w) for w in normalize(sentence).split()} | set(numbers(sentence))))

    def has(self, word: str) -> bool:
        return word in self.words or stem(word) in self.stems

    def has_name(self, word: str) -> bool:
        return word in self.name_words or stem(word) in self.name_stems


@reads_nothing_on_error(lambda fact, index: RejectedFact(fact, "could not be checked against its source", "other"))
def check_fact(fact: str, index: SourceIndex) -> GroundedFact | RejectedFact:
    norm = normalize(fact)
    words = content_words(norm)
    if fact.rstrip().endswith("?"):
        return RejectedFact(fact, "a question, not a fact", "question")
    if words and not content_words(normalize(_ADDRESS.sub(" ", fact))):
        return RejectedFact(fact, "only an address, not a claim about anything", "address")
    if not words or all(w in SMALL_TALK for w in words) or states_nothing(fact):
        return RejectedFact(fact, "small talk: nothing durable to remember", "small_talk")
    if vague(fact):
        return RejectedFact(
            fact, "ends on a bare pronoun (it, that, this, them) and says little else: nothing on its own", "vague"
        )
    ids = index.identifiers.check(fact)
    if ids.missing and not all(_is_number(n.split()[0]) for n in ids.missing):
        return RejectedFact(fact, f"identifiers not in the source as written: {', '.join(ids.missing)}", "identifiers")
    if ids.missing:
        missing = ", ".join(n.replace(",", "") for n in ids.missing)  # 9,999 and 9999 are one number
        return RejectedFact(fact, f"numbers not in the source: {missing}", "numbers")
    fact = ids.text  # an identifier that differed only in case is spelled as the source spells it
    missing_numbers = [n for n in numbers(fact) if n not in index.numbers]
    if missing_numbers:
        return RejectedFact(fact, f"numbers not in the source: {', '.join(missing_numbers)}", "numbers")
    names = [
        re.sub(r"'s\b", "", normalize(m)) for m in _NAME.findall(_ADDRESS.sub(" ", fact))
    ]  # "Speaker's" names the speaker
    # The first word is capitalised anyway, but facts start with their subject: an invented one there
    # ("Zorblax approved the plan") is the costliest mistake, and a wrongly rejected fact still leaves
    # the passage recallable. Only ordinary sentence openers are let through unseen.
    missing_names = [
        n
        for n in names
        if n and n not in STOPWORDS and n not in OPENERS and not all(index.has_name(p) for p in n.split())
    ]
    if missing_names:
        return RejectedFact(fact, f"names not in the source: {', '.join(missing_names)}", "names")
    present = [w for w in words if index.has(w)]
    coverage = len(present) / len(words)
    if coverage < MIN_CONTENT_COVERAGE:
        absent = [w for w in words if not index.has(w)]
        return RejectedFact(
            fact,
            f"only {coverage:.0%} of its key words are in the source (missing: {', '.join(absent[:6])})",
            "coverage",
        )
    return GroundedFact(fact, _spans(words, numbers(fact), index))


def _spans(words: list[str], nums: list[str], index: SourceIndex) -> list[tuple[int, int]]:
    """The sentences a fact rests on: the best match, plus any that add words the best one lacks (max 3)."""
    wanted = {stem(w) for w in words} | set(nums)
    chosen: list[tuple[int, int]] = []
    covered: set[str] = set()
    while len(chosen) < 3:
        best = max(
            (
                (len((wanted - covered) & sent_words), -start, start, end)
                for start, end, sent_words in index.sentences
                if (start, end) not in chosen
            ),
            default=None,
        )
        if best is None or best[0] == 0:
            break
        chosen.append((best[2], best[3]))
        covered |= wanted & next(w for s, e, w in index.sentences if (s, e) == (best[2], best[3]))
        if covered >= wanted:
            break
    if not chosen:
        return [(index.offset, index.offset + len(index.source))]
    return sorted((index.offset + start, index.offset + end) for start, end in chosen)


def token_jaccard(a: str, b: str) -> float:
    left, right = set(normalize(a).split()), set(normalize(b).split())
    return len(left & right) / len(left | right) if left and right else 0.0


def clauses(text: str) -> list[str]:
    """The claims in a text, each as a sentence of its own; `[text]` when it holds one claim.

    Questions and fragments with fewer than two content words ("Not cool.", "You?") are not claims.
    """
    pieces = [p.strip(" ,;") for p in _CLAUSE.split(text.strip()) if p and p.strip(" ,;.")]
    parts = [p for p in pieces if not p.endswith("?") and len(content_words(normalize(p))) >= 2]
    if not parts or (len(parts) == 1 and len(pieces) == 1):
        return [text]
    out = []
    for part in parts:
        part = capitalised(part)
        out.append(part if part[-1] in ".!?" else part + ".")
    return out


def split_echoes(facts: list[str], source: str) -> tuple[list[str], int]:
    """A "fact" that repeats a source of several claims is split into one fact per claim.

    Small models often return the input as one fact; one claim per fact is what
    makes dedup, supersede and recall work. Returns the facts and how many were split.
    """
    out: list[str] = []
    split = 0
    several = len(clauses(source)) > 1 or len(_CLAUSE.split(source.strip())) > 1
    for fact in facts:
        parts = clauses(fact) if several and token_jaccard(fact, source) >= ECHO_JACCARD else [fact]
        split += parts != [fact]
        out.extend(parts)
    return out, split


def ground(
    facts: list[str], source: str, offset: int = 0, context: list[tuple[str, str, int]] | None = None
) -> GroundingResult:
    """Keep the facts grounded in `source`; with `context` (earlier saves: (memory id, the part shown, its
    offset in that save)), names, numbers and words may also come from it, but each fact must still rest
    on the source itself."""
    index = SourceIndex(source, offset)
    earlier = [(memory_id, SourceIndex(text, start)) for memory_id, text, start in context or []]
    reach = SourceIndex("\n".join([source, *(text for _, text, _ in context or [])])) if earlier else index
    result = GroundingResult()
    seen: set[str] = set()
    for fact in facts:
        norm = normalize(fact)
        if norm in seen:
            continue
        seen.add(norm)
        verdict = check_fact(fact, reach)
        if isinstance(verdict, GroundedFact) and earlier:
            verdict = _with_context(verdict.text, index, reach, earlier)
        if isinstance(verdict, GroundedFact):
            result.kept.append(verdict)
        else:
            result.rejected.append(verdict)
    return result


def _with_context(
    fact: str, index: SourceIndex, reach: SourceIndex, earlier: list[tuple[str, SourceIndex]]
) -> GroundedFact | RejectedFact:
    """A fact grounded in text + context: spans in the text, and the earlier saves it borrowed from."""
    words, nums = content_words(normalize(fact)), numbers(fact)
    own = [w for w in words if index.has(w)] + [n for n in nums if n in index.numbers]
    if len(own) < min(MIN_OWN_WORDS, len(words) + len(nums)):
        return RejectedFact(fact, "rests on the context only, not on this text", "context")
    borrowed = [w for w in words if not index.has(w)]
    borrowed_nums = [n for n in nums if n not in index.numbers]
    if borrowed and words:
        coverage = sum(1 for w in words if reach.has(w)) / len(words)
        if coverage < BORROWING_MIN_COVERAGE:
            absent = [w for w in words if not reach.has(w)]
            return RejectedFact(
                fact,
                f"borrows from the context, and only {coverage:.0%} of its key words are in "
                f"the text or context (missing: {', '.join(absent[:6])})",
                "coverage",
            )
    sources = []
    for memory_id, other in earlier:
        mine = [w for w in borrowed if other.has(w)]
        mine_nums = [n for n in borrowed_nums if n in other.numbers]
        if mine or mine_nums:
            sources += [(memory_id, start, end) for start, end in _spans(mine, mine_nums, other)]
    return GroundedFact(fact, _spans(words, nums, index), sources)
