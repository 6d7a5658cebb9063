"""Skip the model when a text holds nothing to extract: greetings, thanks, laughter, acknowledgements.

They are a large share of chat turns, and on a CPU each model call costs
seconds. The gate is conservative on purpose: a real fact lost costs more than
a wasted call, and a skipped text keeps its passage, so it stays recallable.
A text is skipped only when every rule agrees: it is short, it holds no digits,
no address and no name (other than the listener's: "Thanks, Nate!"), and every
content word in it is small talk.
"""

from __future__ import annotations

import re

from ..contract.text import STOPWORDS, normalize
from .grounding import SMALL_TALK
from .guard import reads_nothing_on_error
from .phatic import states_nothing
from .sentences import sentences

MAX_CHARS = 160
MAX_WORDS = 25

# Words that add nothing to a greeting or an acknowledgement (beyond grounding's SMALL_TALK list).
FILLER = frozenset(
    """really definitely absolutely exactly agree agreed true lovely fantastic incredible sweet dude omg wow
    appreciate appreciated means lot much sorry excited proud totally super pretty kind guys everyone buddy friend
    anytime soon enjoy enjoyed thrilled awww aww yay woohoo nope nah hmm hmmm huh indeed course certainly glad
    chatting catching problem thing compliment tip tomorrow yourself that's what's you're i'm we're
    they're there's here's i've you've i'll you'll""".split()
)
# A name said to the listener, not about anyone: "Thanks, Nate!", "Bye Joanna!", "Hey Mel,".
_VOCATIVE = re.compile(
    r"(?:,\s*|\b(?:[Hh]i|[Hh]ey|[Hh]ello|[Bb]ye|[Tt]hanks|[Tt]hank you|[Ss]ee you|[Ss]ee ya|[Ll]ater|[Ww]elcome)\s+)"
    r"[A-Z][a-z]+(?=\s*[!,.?]|\s*$)"
)
_LAUGH = re.compile(r"^(?:a?(?:ha|he|hi)+h?|lo+l|lmao|rofl|xd)$")
_HAS_DIGIT = re.compile(r"\d")
# A chat-log header is not the message: "[8 May 2023, 1:56 pm] Jon: Bye!" is the small talk "Bye!".
_LOG_HEADER = re.compile(r"^\s*(?:\[[^\]\n]{1,60}\]\s*)?(?:[A-Z][\w.'-]*(?: [A-Z][\w.'-]*)?:\s+)?")
_ADDRESS = re.compile(r"@|https?://|www\.|\.com\b|/")


@reads_nothing_on_error(lambda text: None)  # unread: the model is asked
def small_talk_reason(text: str) -> str | None:
    """Why this text needs no model call ("small talk"), or None when it might hold a fact."""
    stripped = _LOG_HEADER.sub("", text.strip(), count=1)
    if not stripped or len(stripped) > MAX_CHARS or len(stripped.split()) > MAX_WORDS:
        return None
    if _HAS_DIGIT.search(stripped) or _ADDRESS.search(stripped):
        return None
    unaddressed = _VOCATIVE.sub(lambda m: m.group(0)[: m.group(0).rfind(" ") + 1], stripped)  # drop the name
    if any(word not in ("I", "I'm", "I've", "I'll", "I'd") for word in _inner_names(unaddressed)):
        return None
    words = [w for w in normalize(unaddressed).split() if w not in STOPWORDS]
    content = [w for w in words if not _LAUGH.match(w)]
    if all(w in SMALL_TALK or w in FILLER or len(w) < 3 for w in content) or states_nothing(unaddressed):
        return "small talk"
    return None


def _inner_names(text: str) -> list[str]:
    """Capitalised words that do not start a sentence."""
    names = []
    for sentence in sentences(text):
        tokens = sentence.split()
        for token in tokens[1:]:
            word = token.strip("\"'()[],;:!?.")
            if word[:1].isupper():
                names.append(word)
    return names
