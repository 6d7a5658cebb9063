"""The soak benchmark's load: agents of two teams doing a steady mix of operations, retrying through faults.

Every operation is retried (same idempotency key) until it gets a definitive answer, so a save counts
as acknowledged only when it got a 2xx, and a consume is counted once whatever the retries. What each
agent got acknowledged is kept, for the checks at the end; every list and recall answer is checked
for the other team's ids and marker word as it arrives.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..client.service import service_client

# op -> weight in the mix; forget only runs when the agent has memories to spare
MIX = {"remember": 3, "recall": 3, "consume": 2, "handled": 1, "list": 1, "forget": 1}
ATTEMPT_TIMEOUT_S = 30.0
OP_DEADLINE_S = 300.0  # a service restart plus the model's reload fit well within it
TOPICS = (
    "deployed the billing service to staging",
    "read the incident report about the cache outage",
    "was told the customer prefers email over phone calls",
    "reviewed the pull request that renames the queue",
    "booked the quarterly planning meeting for Thursday",
    "found that the nightly backup job takes forty minutes",
)


@dataclass
class Team:
    """One team: its key, its unique marker word and what the service acknowledged to its agents."""

    name: str
    key: str
    marker: str
    limit: str
    daily_limit: int
    saved: dict[str, str] = field(default_factory=dict)  # acknowledged memory id -> text
    ever: set[str] = field(default_factory=set)  # every id ever acknowledged, forgotten ones included
    lost_on_forget: list[str] = field(default_factory=list)  # acknowledged, yet 404 on the first forget
    forgotten: set[str] = field(default_factory=set)
    uncertain_forget: set[str] = field(default_factory=set)  # sent, never answered definitively
    handled: set[str] = field(default_factory=set)
    consumed: int = 0  # units allowed (200) by the service
    unresolved_consumes: int = 0


@dataclass
class Sample:
    op: str
    phase: str
    attempt_s: float  # the attempt that got the definitive answer
    total_s: float  # with every retry
    status: int
    retries: int


class Recorder:
    """Samples and counters, shared by the agent threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: list[Sample] = []
        self.statuses: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.cross_team = {"answers_checked": 0, "items_checked": 0, "violations": 0}
        self.violations: list[str] = []
        self.unresolved: dict[str, int] = defaultdict(int)
        self.phase = "quiet"

    def add(self, sample: Sample) -> None:
        with self.lock:
            self.samples.append(sample)

    def status(self, op: str, status: int | str) -> None:
        with self.lock:
            self.statuses[op][str(status)] += 1

    def cross_check(self, items: list[dict[str, Any]], other: Team, where: str) -> None:
        """An answer of one team must hold none of the other team's ids nor its marker word."""
        with self.lock:
            self.cross_team["answers_checked"] += 1
            self.cross_team["items_checked"] += len(items)
            for item in items:
                ids = {item.get("id"), item.get("memory_id"), *(item.get("source_memory_ids") or [])}
                text = str(item.get("text", ""))
                if ids & other.ever or other.marker in text:
                    self.cross_team["violations"] += 1
                    if len(self.violations) < 20:
                        self.violations.append(f"{where}: {sorted(i for i in ids if i)} {text[:80]!r}")


Outcome = tuple[int, httpx.Response | None, int]  # status, the answer (None: none came), retries


class Agent:
    """One agent: a thread doing `rate` operations a second, each retried until it is answered."""

    def __init__(self, url: str, team: Team, other: Team, agent_id: str, rate: float, recorder: Recorder) -> None:
        self.url, self.team, self.other, self.agent_id = url, team, other, agent_id
        self.rate, self.recorder = rate, recorder
        self.rng = random.Random(agent_id)
        self.stop = threading.Event()
        self.seq = 0
        self.mine: list[str] = []  # this agent's acknowledged, not forgotten, memory ids
        self.thread = threading.Thread(target=self.run, name=agent_id, daemon=True)

    def run(self) -> None:
        ops = list(MIX)
        weights = [MIX[o] for o in ops]
        next_at = time.monotonic()
        with service_client(self.url, self.team.key, timeout=ATTEMPT_TIMEOUT_S) as client:
            while not self.stop.is_set():
                op = self.rng.choices(ops, weights)[0]
                if op == "forget" and len(self.mine) < 4:
                    op = "remember"
                getattr(self, f"do_{op}")(client)
                next_at = max(next_at + 1.0 / self.rate, time.monotonic())
                self.stop.wait(max(0.0, next_at - time.monotonic()))

    def call(self, client: httpx.Client, op: str, send: Callable[[], httpx.Response], done: set[int]) -> Outcome:
        """Send until an answer in `done` (or any other 4xx) comes back; give up after `op_deadline_s`."""
        started = time.monotonic()
        phase = self.recorder.phase
        retries = 0
        while True:
            attempt = time.monotonic()
            try:
                response = send()
                status = response.status_code
            except httpx.HTTPError as exc:
                response, status = None, 0
                self.recorder.status(op, type(exc).__name__)
            else:
                self.recorder.status(op, status)
            if response is not None and (status in done or (400 <= status < 500 and status not in (408, 429))):
                now = time.monotonic()
                self.recorder.add(Sample(op, phase, now - attempt, now - started, status, retries))
                return status, response, retries
            if time.monotonic() - started > OP_DEADLINE_S:
                with self.recorder.lock:
                    self.recorder.unresolved[op] += 1
                return status, None, retries
            retries += 1
            time.sleep(0.5)

    def do_remember(self, client: httpx.Client) -> None:
        self.seq += 1
        text = f"{self.agent_id} {self.rng.choice(TOPICS)}, note {self.seq} tagged {self.team.marker}."
        body = {"text": text, "agent_id": self.agent_id, "idempotency_key": secrets.token_hex(12)}
        status, response, _ = self.call(client, "remember", lambda: client.post("/v1/remember", json=body), {202})
        if response is not None and 200 <= status < 300:
            memory_id = response.json()["id"]
            with self.recorder.lock:
                self.team.saved[memory_id] = text
                self.team.ever.add(memory_id)
            self.mine.append(memory_id)

    def do_recall(self, client: httpx.Client) -> None:
        # half the queries name the other team's marker: the likeliest way to surface its memories
        marker = self.other.marker if self.rng.random() < 0.5 else self.team.marker
        body = {"query": f"{self.rng.choice(TOPICS)} {marker}", "k": 10}
        status, response, _ = self.call(client, "recall", lambda: client.post("/v1/recall", json=body), {200})
        if response is not None and status == 200:
            self.recorder.cross_check(response.json()["items"], self.other, f"recall by {self.agent_id}")

    def do_list(self, client: httpx.Client) -> None:
        status, response, _ = self.call(client, "list", lambda: client.get("/v1/memories", params={"limit": 50}), {200})
        if response is not None and status == 200:
            self.recorder.cross_check(response.json()["items"], self.other, f"list by {self.agent_id}")

    def do_consume(self, client: httpx.Client) -> None:
        body = {"agent_id": self.agent_id, "idempotency_key": secrets.token_hex(12)}
        path = f"/v1/limits/{self.team.limit}/consume"
        status, response, _ = self.call(client, "consume", lambda: client.post(path, json=body), {200, 429})
        with self.recorder.lock:
            if response is None:
                self.team.unresolved_consumes += 1
            elif status == 200:
                self.team.consumed += 1

    def do_handled(self, client: httpx.Client) -> None:
        key = f"{self.agent_id}/event/{secrets.token_hex(8)}"
        status, response, _ = self.call(client, "handled", lambda: client.post("/v1/handled", json={"key": key}), {200})
        if response is not None and status == 200:
            with self.recorder.lock:
                self.team.handled.add(key)

    def do_forget(self, client: httpx.Client) -> None:
        memory_id = self.mine.pop(self.rng.randrange(len(self.mine)))
        path = f"/v1/memories/{memory_id}"
        status, response, retries = self.call(client, "forget", lambda: client.delete(path), {204, 404})
        with self.recorder.lock:
            if response is None:
                self.team.uncertain_forget.add(memory_id)
            elif status in (204, 404):  # 404 after a retry: the first attempt did it
                self.team.forgotten.add(memory_id)
                if status == 404 and retries == 0:
                    self.team.lost_on_forget.append(memory_id)
            else:
                return
            self.team.saved.pop(memory_id, None)
