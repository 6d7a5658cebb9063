"""Who is talking, and what the proxy holds per session: the brief, fixed once sent, and the messages already
queued for saving.

Agent: the `X-Memory-Agent` header; else the request's `user` field (when it is a valid agent id, otherwise
`user-` and its hash); else the proxy's default agent. Session: the `X-Memory-Session` header; else a hash of
the conversation's opening (the first system message and the first user message), which every turn of a
conversation re-sends unchanged. Sessions are kept in a bounded LRU: a session pushed out and resumed later
gets a brief again, which may differ.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..contract.ids import ID_RULE, is_id
from .messages import BadRequest, first_text

AGENT_HEADER = "x-memory-agent"
SESSION_HEADER = "x-memory-session"
MAX_SESSION_LEN = 256
SESSIONS = 10_000  # sessions held at once, least recently used pushed out first
SAVED_KEYS = 4096  # save keys remembered per session; past them the service's idempotency still holds
BRIEF_TRIES = 3  # a session whose recalls failed this many times goes on without a brief


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Identity:
    agent: str
    session: str  # as given, or derived
    run_id: str  # the session as the service's run id (an id: the session itself when it is one)

    @property
    def key(self) -> tuple[str, str]:
        return self.agent, self.session


def identify(headers: dict[str, str], body: dict[str, Any], default_agent: str) -> Identity:
    """The agent and session of a request, by the rules in the module docstring; a bad header is a BadRequest."""
    agent = headers.get(AGENT_HEADER)
    if agent is not None:
        if not is_id(agent):
            raise BadRequest(f"X-Memory-Agent {agent[:80]!r} is not an agent id: {ID_RULE}")
    else:
        user = body.get("user")
        if isinstance(user, str) and user:
            agent = user if is_id(user) else "user-" + _digest(user)[:16]
        else:
            agent = default_agent
    session = headers.get(SESSION_HEADER)
    if session is not None:
        if not 0 < len(session) <= MAX_SESSION_LEN or any(ord(c) < 32 or ord(c) == 127 for c in session):
            raise BadRequest(f"X-Memory-Session must be 1-{MAX_SESSION_LEN} characters without control characters")
    else:
        messages = body["messages"]
        session = "open-" + _digest(first_text(messages, "system"), first_text(messages, "user"))[:24]
    run_id = session if is_id(session) else "session-" + _digest(session)[:32]
    return Identity(agent, session, run_id)


@dataclass
class Session:
    """`brief` is what every request of the session carries once `fixed` (None: nothing bore on it)."""

    brief: str | None = None
    fixed: bool = False
    tries: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    saved: set[str] = field(default_factory=set)

    def note_saved(self, key: str) -> bool:
        """True the first time this session queues `key`."""
        if key in self.saved:
            return False
        if len(self.saved) >= SAVED_KEYS:
            self.saved.clear()
        self.saved.add(key)
        return True


class Sessions:
    """The LRU of sessions, by (agent, session)."""

    def __init__(self, capacity: int = SESSIONS) -> None:
        self.capacity = capacity
        self._held: OrderedDict[tuple[str, str], Session] = OrderedDict()

    def get(self, who: Identity) -> Session:
        session = self._held.get(who.key)
        if session is None:
            session = self._held[who.key] = Session()
            while len(self._held) > self.capacity:
                self._held.popitem(last=False)
        else:
            self._held.move_to_end(who.key)
        return session

    def __len__(self) -> int:
        return len(self._held)
