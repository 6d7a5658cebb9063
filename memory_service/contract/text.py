"""Text normalisation shared by grounding, dedup and search: one definition of a "word"."""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"[0-9a-z]+(?:['’][a-z]+)?")

# Words that carry no content of their own (plus the ones a model adds when it restates a note:
# "the user", "the speaker", "mentioned").
STOPWORDS = frozenset(
    """a an the and or but if then than so of to in on at by for with from into onto over under about as is are was
    were be been being am do does did doing have has had having it its it's this that these those there here they them
    their theirs he him his she her hers we us our ours you your yours i me my mine who whom whose which what when where
    why how not no nor very can could should would will shall may might must also just only up down out off all any
    some each both more most other such own same too s t don now user users speaker agent text note mentioned says said
    told tells stated states wants want wanted like likes liked per via one""".split()
)


def normalize(text: str) -> str:
    """Lower-case words and numbers, NFKC-folded, joined by single spaces."""
    text = unicodedata.normalize("NFKC", text).lower().replace("’", "'")
    return " ".join(_WORD.findall(text))
