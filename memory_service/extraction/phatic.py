"""Whether a sentence states nothing: greetings, thanks, laughter, acknowledgements and evaluations of "that".

Talk keeps a conversation going without saying anything about the world; a fact made of it ("Haha that was
fun, thanks so much for your patience today!") matches every query about its speaker and answers none. The
rule reads the form of a clause, not a list of one dataset's phrases: a text states nothing when each of its
clauses is one of
- made of interjections, fillers and function words only ("haha", "ok great", "talk soon", "you too");
- thanks, optionally for a short object that names no thing ("thanks so much for your patience today",
  but not "thanks for restarting db-1" nor "thanks for the pizza recipe");
- an evaluation of the conversation itself: "that/this/it" + a copula + one word ("that was fun", "this is
  amazing", "it was a pleasure");
- a name said to the listener ("Thanks, Nate!", "Bye Nate").
Anything with a digit or an identifier, or a name elsewhere ("Talk to Dana"), states something. Written for chat lines,
agent logs and notes alike: a log line "OK, done." states nothing; "OK, the backup finished." does.
"""

from __future__ import annotations

import re

from ..contract.text import STOPWORDS, normalize
from .guard import reads_nothing_on_error
from .identifiers import identifiers_in

# Words that carry no claim in talk: interjections, greetings, thanks, politeness, evaluations.
PHATIC_WORDS = frozenset(
    """thanks thank thx ty haha hahaha hehe lol lmao rofl omg wow woah whoa oh ooh aw aww awww yay woohoo hmm hmmm
    huh ah ahh uh um ok okay okey k kk sure yes yeah yep yup yea nope nah no alright right fine cool nice great
    awesome amazing wonderful lovely fantastic incredible perfect excellent brilliant sweet neat fun glad happy
    pleased sorry apologies welcome congrats congratulations cheers bye goodbye hello hi hey heya hiya morning
    evening night afternoon day later soon talk chat chatting catch care take see ya hope hoping well good
    pleasure appreciate appreciated appreciation much lot ton really so very super totally absolutely definitely
    indeed exactly agreed agree true course certainly noted got will do done bet deal anytime problem worries
    luck enjoy enjoyed love loved xoxo xo dear friend buddy pal guys folks everyone everybody again too also
    best proud sounds sound looks that's it's what's you're i'm we're i'll you'll we'll
    let's""".split()
)
_THANKS = re.compile(
    r"^(?:many |big |huge )?(?:thanks|thank you|thank u|thx|ty)(?: (?:so|very|soo+) much| a lot| a ton| again|"
    r" a million| heaps)*(?: for (?P<object>.+))?$"
)
# what a thanks may be for and still name nothing: "your patience", "the chat today", "everything"
_OBJECT_WORDS = frozenset(
    """your you all the this that today tonight everything anything listening having me us being so much
    always earlier again""".split()
)
_EVALUATION = re.compile(
    r"^(?:that|this|it)(?:'s| s| is| was| has been| sounds| sounded| looks| looked| seems| seemed| felt| feels)"
    r"(?: (?:so|really|very|pretty|super|such|totally|absolutely|quite|truly|just|a|an|like))* (?P<word>[a-z']+)$"
)
_INTERJECTION = re.compile(r"^(?:(?:a?(?:ha|he|hi)+h?|lo+l|lmao|rofl|xd|omg|wow|oh+|aw+|ah+|yay|ok|okay|well|so)\s+)+")
_TRAILING_LAUGH = re.compile(r"(?:\s+(?:a?(?:ha|he)+h?|lo+l|lmao|rofl|xd))+$")
_EMOTICON = re.compile(r"(?<![A-Za-z0-9])(?:[:;=8][-o^']?[()DPpO/\\|\]\[3*]+|<3)(?![A-Za-z0-9])")
# clause ends: sentence marks, commas, semicolons, dashes, line breaks
_CLAUSES = re.compile(r"[.!?;…]+|,|\s[-–—]+\s|\n|:(?=\s|$)|\(|\)")
_NAME = re.compile(r"^[A-Z][a-z]+$")
# a name after a greeting or thanks is said to the listener: "Bye Nate", "Thank you Dana", "See you soon Mel"
_VOCATIVE = re.compile(
    r"^(.*\b(?i:hi|hey|hello|bye|goodbye|thanks|thank you|you|later|night|morning|soon|care|much|lot|again))\s+[A-Z][a-z]+$"
)
_HAS_DIGIT = re.compile(r"[0-9]")
# when a farewell or a wish is for: "see you tomorrow", "have a great weekend" (a date alone is not talk)
_WHEN_WORDS = frozenset(
    "today tonight tomorrow weekend week next then monday tuesday wednesday thursday friday".split()
)
_FAREWELL = re.compile(r"^(?:see|talk|catch|have|enjoy|hope|good|until|till|bye|night|speak)\b")


def _clause_is_phatic(clause: str) -> bool:
    raw = clause.strip(" \t\"'*_~")
    if not raw or _NAME.match(raw):
        return True  # nothing, or a name said to the listener ("Thanks, Nate!")
    raw = _VOCATIVE.sub(r"\1", raw)
    words = normalize(raw)
    if not words:
        return True  # an emoticon, an emoji, punctuation
    words = _TRAILING_LAUGH.sub("", _INTERJECTION.sub("", words + " ").strip())
    if not words:
        return True
    thanks = _THANKS.match(words)
    if thanks:
        obj = (thanks.group("object") or "").split()
        return len(obj) <= 5 and sum(1 for w in obj if w not in _OBJECT_WORDS and w not in STOPWORDS) <= 1
    evaluation = _EVALUATION.match(words)
    if evaluation and evaluation.group("word") not in STOPWORDS:
        return True
    when = _WHEN_WORDS if _FAREWELL.match(words) else frozenset()
    return all(w in PHATIC_WORDS or w in STOPWORDS or w in when for w in words.split())


@reads_nothing_on_error(lambda text: False)  # unread: it may state something
def states_nothing(text: str) -> bool:
    """True when every clause of `text` is talk with no claim (see the module's docstring)."""
    if not text.strip() or _HAS_DIGIT.search(text) or identifiers_in(text):
        return not text.strip()
    return all(_clause_is_phatic(c) for c in _CLAUSES.split(_EMOTICON.sub(" ", text)))
