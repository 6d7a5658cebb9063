"""Identifiers in a fact must be the source's, as written: numbers, ids, emails, URLs, paths, versions.

Grounding by words lets a changed identifier through: "moved 45 tables from db-1 to db-1" has every word of
"moved 45 tables from db-1 to db-2", and a made-up "db-16" shares its stem with "db-1". A reader acts on an
identifier (mails the address, opens the path, restores the database), so one wrong character makes the whole
fact wrong. So each identifier-like token of a fact must occur in the source as a whole token, no more often
than the source has it; a token that differs from the source's only in case takes the source's spelling back
(a model capitalises a sentence that starts with "alice@example.com"); anything else rejects the fact.
Numbers written differently but equal ("1,250,000" and "1250000") are the same number.

The patterns read ASCII only: a token in other scripts is not read as an identifier (and words are still
checked by grounding), so no input can make this raise or reject on a misreading.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_URL = r"(?:https?|ftp)://[^\s<>\"'`]+|www\.[^\s<>\"'`]+"
_EMAIL = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+"
_PATH = r"(?:~|\.{1,2})?/[A-Za-z0-9._%+@-]+(?:/[A-Za-z0-9._%+@-]+)*/?|[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)+"
# a word joined by - _ . : or / that holds a digit (db-16, R385-P94, v1.2.3, us-east-1, 10:30, 24/7), and a
# number with thousands commas (1,250,000; "1,2" is two numbers)
_TOKEN = r"[A-Za-z0-9]+(?:[-_.:/][A-Za-z0-9]+|,[0-9]{3}(?![0-9]))*"
_CANDIDATE = re.compile(rf"{_URL}|{_EMAIL}|{_PATH}|{_TOKEN}", re.ASCII)
_TRAILING = ".,;:!?)]}'\""
_DIGIT = re.compile(r"[0-9]")
_THOUSANDS = re.compile(r"^[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?$")


def _is_identifier(token: str) -> bool:
    """A token a reader would copy, not read: it holds a digit, an @, a scheme or a path separator."""
    if "@" in token or "://" in token or token.startswith("www."):
        return True
    if "/" in token:  # a path has a slash and more than "and/or": a dot, a digit or a leading slash
        return token.startswith(("/", "~/", "./", "../")) or bool(_DIGIT.search(token)) or "." in token
    return bool(_DIGIT.search(token))


def _canonical(token: str) -> str:
    """How two spellings of one number compare equal: "1,250,000" is "1250000"."""
    return token.replace(",", "") if _THOUSANDS.match(token) else token


def identifiers_in(text: str) -> list[str]:
    """The identifier-like tokens of `text`, in order, as written (trailing punctuation off)."""
    found = []
    for match in _CANDIDATE.finditer(text):
        token = match.group().rstrip(_TRAILING)
        if token and _is_identifier(token):
            found.append(token)
    return found


@dataclass
class IdentifierCheck:
    """The fact with identifiers that differed only in case put back in the source's spelling, the
    identifiers that are not in the source (the fact is rejected if any), and how many were respelled."""

    text: str
    missing: list[str]
    respelled: int


class SourceIdentifiers:
    """The identifiers of a source: how often each occurs, and each one's spelling by lower case."""

    def __init__(self, source: str) -> None:
        tokens = identifiers_in(source)
        self.counts = Counter(_canonical(t) for t in tokens)
        self.spelling: dict[str, str] = {}
        for token in tokens:
            self.spelling.setdefault(_canonical(token).lower(), token)

    def check(self, fact: str) -> IdentifierCheck:
        """Each identifier of `fact` must be the source's, no more often than the source has it."""
        used: Counter[str] = Counter()
        missing: list[str] = []
        respell: dict[str, str] = {}
        for token in identifiers_in(fact):
            key = _canonical(token)
            if key not in self.counts:
                source_form = self.spelling.get(key.lower())
                if source_form is None:
                    missing.append(token)
                    continue
                respell[token] = source_form
                key = _canonical(source_form)
            used[key] += 1
            if used[key] > self.counts[key]:
                missing.append(f"{token} (the source has it {self.counts[key]}x)")
        text = fact
        for token, source_form in respell.items():
            pattern = rf"(?<![A-Za-z0-9]){re.escape(token)}(?![A-Za-z0-9])"
            text = re.sub(pattern, source_form.replace("\\", "\\\\"), text)
        return IdentifierCheck(text, missing, len(respell))


def capitalised(sentence: str) -> str:
    """`sentence` with its first letter upper-cased, unless it opens with an identifier ("alice@example.com
    wrote", "db-1 is down"), whose case is part of it."""
    words = sentence.split(maxsplit=1)
    if not words or identifiers_in(words[0]) or not sentence[:1].isalpha():
        return sentence
    return sentence[0].upper() + sentence[1:]
