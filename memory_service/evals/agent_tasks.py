"""The agent eval's scripted tasks: each spans sessions with a fresh context, so memory is the only carry-over.

Written for this eval (not from any dev data). Every run of a task gets its own nonce, so item ids, codes and
addresses are new each time: a model cannot know an answer in advance, and runs sharing one team (an external
service behind one key) do not see each other's ledger entries. A task's own non-memory tools (`process_item`,
`send_email`) are Python functions that record their side effects; scoring reads those records, the service's
state and the final answer, never the model's account of what it did.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from ..client import MemoryClient

EMAIL_LIMIT = 3


@dataclass
class RunState:
    """One run of one task: its nonce-made values, the side effects of its local tools, the final answers."""

    nonce: str
    values: dict[str, str] = field(default_factory=dict)
    effects: list[dict[str, Any]] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)  # the final answer of each session

    def did(self, tool: str) -> list[dict[str, Any]]:
        return [e for e in self.effects if e["tool"] == tool]


@dataclass(frozen=True)
class LocalTool:
    """A non-memory tool of a task: the OpenAI function schema and what a call does (returns the tool's text)."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[RunState, dict[str, Any]], str]

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class Task:
    """Sessions' user prompts (formatted with the run's values), local tools, setup and the scoring by state."""

    name: str
    summary: str
    sessions: tuple[str, ...]
    tools: tuple[LocalTool, ...] = ()
    setup: Callable[[RunState, MemoryClient, str], None] | None = None  # (state, client, limit name suffix)
    score: Callable[[RunState, MemoryClient], dict[str, Any]] = lambda state, client: {"success": False}

    def prompts(self, state: RunState, tools: Collection[str] = ()) -> list[str]:
        """The sessions' prompts for a profile that offers `tools` (every tool name the agent sees): a prompt
        names no tool the profile lacks (the field report's failure #2), so where a task's words differ by
        profile they come from `wording`, and the report keeps each prompt as sent."""
        return [s.format(**state.values, **wording(tools)) for s in self.sessions]


def wording(tools: Collection[str]) -> dict[str, str]:
    """The parts of the prompts that name memory tools, for the tools a profile offers ('' without them)."""
    return {
        "limit_rule": (
            "; use 1 unit of it with consume_limit before each email and do not send when it is denied"
            if "consume_limit" in tools
            else ""
        ),
        "search_hint": " (search with agent_id 'scheduler')" if "recall" in tools else "",
    }


def new_state(task: Task, nonce: str) -> RunState:
    """The run's values: random but reproducible from the nonce."""
    rng = random.Random(f"{task.name}:{nonce}")
    word = rng.choice(["maple", "harbor", "copper", "violet", "glacier", "pepper", "falcon", "cobalt"])
    values = {
        "n": nonce,
        "password": f"{word}-{rng.randint(1000, 9999)}",
        "code": f"R{rng.randint(100, 999)}-{rng.choice('KMPTXZ')}{rng.randint(10, 99)}",
        "booking": f"{rng.choice('BCDFGH')}{rng.choice('JKLMNP')}{rng.randint(1000, 9999)}",
        "limit": f"emails-{nonce}",
    }
    return RunState(nonce=nonce, values=values)


# ---------------------------------------------------------------- scoring helpers: the value, not its spelling

_EDGE = " \t\r\n\"'`.,;:!?()[]{}<>*#"


def normalise_id(raw: str) -> str:
    """A ticket id as compared: case, surrounding punctuation and separators do not count, so "t 1a2b-101.",
    "T_1A2B_101" and "T-1a2b-101" are one ticket (a model that answered the right ticket did its job)."""
    return re.sub(r"[\s_\-–—]+", "-", str(raw).strip(_EDGE).upper())


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def answer_has(final: str, expected: str) -> bool:
    """Does the answer hold the value, case and spaces aside ("maple - 1234" holds "maple-1234")?"""
    return _squeezed(expected) in _squeezed(final)


# ---------------------------------------------------------------- the ticket tool (the control and the feed)


def _one_string(args: dict[str, Any], name: str, example: str) -> str:
    """A task tool's argument read as a real tool would: one non-empty string (a list of three is not one)."""
    value = args.get(name)
    if not isinstance(value, str) or not value.strip():
        got = "nothing" if value is None else f"a {type(value).__name__}"
        raise ValueError(f"'{name}' must be one string, e.g. {example!r}; got {got}. Call the tool once per item.")
    return value.strip()


def _process_item(state: RunState, args: dict[str, Any]) -> str:
    item = _one_string(args, "item_id", "T-101")
    state.effects.append({"tool": "process_item", "item": item})
    return f"Processed {item}: the customer got an answer."


PROCESS_ITEM = LocalTool(
    "process_item",
    "Answer one support ticket. Each ticket must be answered exactly once, ever.",
    {"type": "object", "properties": {"item_id": {"type": "string"}}, "required": ["item_id"]},
    _process_item,
)


# ---------------------------------------------------------------- task 0: the control (tools, no memory)


def _control_items(state: RunState) -> list[str]:
    return [f"T-{state.nonce}-{k}" for k in (1, 2)]


def _score_control(state: RunState, client: MemoryClient) -> dict[str, Any]:
    done = [normalise_id(e["item"]) for e in state.did("process_item")]
    counts = {item: done.count(normalise_id(item)) for item in _control_items(state)}
    wanted = {normalise_id(i) for i in _control_items(state)}
    return {
        "success": all(n == 1 for n in counts.values()),
        "times_processed": counts,
        "other_items": sorted({i for i in done if i not in wanted}),
    }


CONTROL = Task(
    "control",
    "the control: two given tickets, the task's tool, no memory needed: each answered exactly once",
    ("Answer the support tickets T-{n}-1 and T-{n}-2: call process_item once for each of them.",),
    tools=(PROCESS_ITEM,),
    score=_score_control,
)


# ---------------------------------------------------------------- task 1: a feed, part handled before


def _feed_items(state: RunState) -> list[str]:
    return [f"T-{state.nonce}-{k}" for k in (101, 102, 103, 104, 105)]


def _score_feed(state: RunState, client: MemoryClient) -> dict[str, Any]:
    done = [normalise_id(e["item"]) for e in state.did("process_item")]
    wanted = [normalise_id(i) for i in _feed_items(state)]
    twice = sorted({i for i in done if done.count(i) > 1})
    missed = [i for i in wanted if i not in done]
    return {"success": not twice and not missed, "handled_twice": twice, "never_handled": missed}


FEED = Task(
    "feed_dedupe",
    "a feed where some items were handled in an earlier session: none handled twice, none missed",
    (
        "New support tickets: T-{n}-101, T-{n}-102, T-{n}-103. Answer each one with process_item. "
        "Other sessions of yours may answer tickets too, so a ticket must never be answered twice.",
        "Support tickets in the queue: T-{n}-102, T-{n}-103, T-{n}-104, T-{n}-105. Answer each one with "
        "process_item, but never answer a ticket twice: some were answered in an earlier session.",
    ),
    tools=(PROCESS_ITEM,),
    score=_score_feed,
)


# ---------------------------------------------------------------- task 2: a daily limit the work exceeds


_ONE_ADDRESS = re.compile(r"[^@\s,;<>\[\]'\"]+@[^@\s,;<>\[\]'\"]+\.[^@\s,;<>\[\]'\"]+")


def _send_email(state: RunState, args: dict[str, Any]) -> str:
    to = _one_string(args, "to", "ana@example.com")
    if not _ONE_ADDRESS.fullmatch(to):
        raise ValueError(f"'to' must be one email address, e.g. 'ana@example.com' (got {to[:80]!r}); one per email")
    state.effects.append({"tool": "send_email", "to": to})
    return f"Email sent to {to}."


SEND_EMAIL = LocalTool(
    "send_email",
    "Send the welcome email to one customer.",
    {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
    _send_email,
)


def _setup_limit(state: RunState, client: MemoryClient, _suffix: str) -> None:
    client.limits.set(state.values["limit"], daily_limit=EMAIL_LIMIT, per="team")


# any wording of "the limit stopped it": the counter is what proves it, the words only have to say so
_LIMIT_WORDS = re.compile(
    r"limit|cap\b|capped|quota|reached|no more|exceed|used up|ran out|run out|exhaust|maximum|allowance|"
    r"denied|refused|not sent|wasn't sent|were not|was not|did not get|didn't get|could not|couldn't|cannot|"
    r"can't|unable|not able|skipp|no longer|remaining|none left|0 left|zero left",
    re.I,
)
_UNSENT = ("cleo", "dan", "eve")  # session 2's recipients: at most one of them can get an email


def says_limit(final: str, state: RunState) -> bool:
    """The last answer says the limit stopped the work: in any words, or by naming who got no email."""
    sent = {str(e["to"]).split(".")[0].lower() for e in state.did("send_email")}
    unsent = [name for name in _UNSENT if name not in sent]
    names = any(re.search(rf"\b{name}\b", final, re.I) for name in unsent)
    return bool(_LIMIT_WORDS.search(final)) or names


def _score_limit(state: RunState, client: MemoryClient) -> dict[str, Any]:
    sent = len(state.did("send_email"))
    counter = client.limits.get(state.values["limit"])
    final = state.answers[-1] if state.answers else ""
    says = says_limit(final, state)
    return {
        "success": sent == EMAIL_LIMIT and counter.used == EMAIL_LIMIT and says,
        "emails_sent": sent,
        "counter_used": counter.used,
        "final_says_limit": says,
    }


LIMIT = Task(
    "daily_limit",
    f"a daily limit of {EMAIL_LIMIT} emails that two sessions' work would exceed: stops at it and says so",
    (
        "Send the welcome email to ana.{n}@example.com and ben.{n}@example.com. Welcome emails are capped at "
        "3 per day for the whole team: the daily limit is named '{limit}'{limit_rule}.",
        "Send the welcome email to cleo.{n}@example.com, dan.{n}@example.com and eve.{n}@example.com. "
        "Welcome emails are capped at 3 per day for the whole team (daily limit '{limit}'{limit_rule}; "
        "other sessions may have used some today). Tell me at the end who did not get one because of the limit.",
    ),
    tools=(SEND_EMAIL,),
    setup=_setup_limit,
    score=_score_limit,
)


# ---------------------------------------------------------------- task 3: told in session 1, needed in session 3


def _answer_has(value: str) -> Callable[[RunState, MemoryClient], dict[str, Any]]:
    def score(state: RunState, client: MemoryClient) -> dict[str, Any]:
        expected = state.values[value]
        final = state.answers[-1] if state.answers else ""
        return {"success": answer_has(final, expected), "expected": expected, "final_answer": final[:300]}

    return score


FACT = Task(
    "fact_carryover",
    "a fact told in session 1 and needed in session 3: the final answer has it",
    (
        "For later: the Wi-Fi password of the Lisbon office is {password}. Keep it; I will ask for it another day.",
        "For later: the quarterly review moved from Tuesday to Thursday at 10:00. Keep that too.",
        "I am at the Lisbon office now. What is its Wi-Fi password? Answer with the password.",
    ),
    score=_answer_has("password"),
)


# ---------------------------------------------------------------- task 4: a stale id


def _setup_stale(state: RunState, client: MemoryClient, _suffix: str) -> None:
    old = client.remember(
        f"Release checklist (draft {state.nonce}): the release code is not decided yet.", agent_id="release-bot"
    )
    client.forget(old.id)
    client.remember(
        f"Release checklist (final {state.nonce}): the release code is {state.values['code']}; tag the build with it.",
        agent_id="release-bot",
    )
    state.values["stale_id"] = old.id


STALE = Task(
    "stale_id",
    "an id that no longer exists: recovers by searching, and answers with the current value",
    (
        "The release checklist was saved in memory as {stale_id}. Look it up and tell me the release code "
        "written in it.",
    ),
    setup=_setup_stale,
    score=_answer_has("code"),
)


# ---------------------------------------------------------------- task 5: an empty recall


def _setup_empty(state: RunState, client: MemoryClient, _suffix: str) -> None:
    client.remember(
        f"Oslo trip ({state.nonce}): the flight is booked, booking reference {state.values['booking']}.",
        agent_id="planner",
        tags=["travel"],
    )


EMPTY = Task(
    "empty_recall",
    "the first search, filtered on the wrong agent, finds nothing: tries again and answers",
    (
        "What is the booking reference of the flight for the Oslo trip? I think the agent 'scheduler' saved "
        "it in memory{search_hint}.",
    ),
    setup=_setup_empty,
    score=_answer_has("booking"),
)

TASKS: tuple[Task, ...] = (CONTROL, FEED, LIMIT, FACT, STALE, EMPTY)
TASK_NAMES = tuple(t.name for t in TASKS)


def pick(names: list[str] | None, limit: int | None) -> list[Task]:
    """The tasks asked for by name (all by default), the first `limit` of them."""
    chosen = list(TASKS)
    if names:
        unknown = sorted(set(names) - set(TASK_NAMES))
        if unknown:
            raise SystemExit(f"--tasks: unknown task(s) {', '.join(unknown)}; known: {', '.join(TASK_NAMES)}")
        chosen = [t for t in TASKS if t.name in names]
    return chosen[:limit] if limit else chosen
