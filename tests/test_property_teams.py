"""Sequences of operations by two teams with two key roles, checked after every step (Hypothesis, stateful).

The example tests pin what one request does; this explores what a sequence does. The rules are what agents
and operators call: remember, forget, import, export, consume, mark handled, revoke, list and recall, each
by team A or team B with an admin or a write key. After each step, whatever the sequence:

- no answer is a 5xx;
- nothing acknowledged is lost: every save answered 2xx and not forgotten is listed and exported, with its text;
- no answer of one team names the other team's memories, words or counters;
- every exported line is strict JSON (no NaN/Infinity) that imports back to the same state;
- counters are exact: `used` is the sum of what was allowed, never above the limit.

The service is the real app in this process over real HTTP, with the fake llama-server extracting facts, so
forgets race real extraction jobs. CI runs a fixed seed (`derandomize`); a larger run for a manual session:
`MEMORY_PROPERTY_EXAMPLES=200 MEMORY_PROPERTY_STEPS=60 pytest tests/test_property_teams.py`.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.fakes.fake_llama_server import FakeLlamaServer
from tests.inprocess import KEYS, InProcessService

PAIRS = 3000  # one fresh pair of teams per run (Hypothesis replays runs while shrinking): state never carries over
TEAM_KEYS = {f"key-{n}-{side}": f"prop{n}-{side}" for n in range(PAIRS) for side in "ab"}
TEAMS = ("a", "b")
AGENTS = ("scout", "writer")
LIMIT = 7
# The Unicode classes that break text handling somewhere: long s and dotless i (case-fold to s and i), the
# Kelvin sign (NFKC: K), sharp s (upper-cases to SS), a ligature, combining marks, right-to-left text and
# controls, fullwidth digits, an emoji (a surrogate pair in JSON), NUL and lone surrogates (both refused).
SPECIAL = [
    "ſ",
    "ı",
    "\u212a",
    "ß",
    "ﬁ",
    "e\u0301",
    "\u0301",
    "\u05d0\u05d1",
    "\u202e",
    "１２３",
    "😀",
    "\x00",
    "\ud800",
    "\udc80",
]
piece = st.one_of(st.sampled_from(SPECIAL), st.text(max_size=4))
any_text = st.lists(piece, max_size=4).map("".join)
# a field's text: often plain, so a bad value elsewhere (metadata) is what a save is judged on
field_text = st.text(max_size=6) | any_text
json_leaf = st.one_of(
    any_text, st.integers(-(2**53), 2**53), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none()
)
any_json = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3), max_leaves=6
)
any_metadata = st.dictionaries(any_text, any_json, max_size=3)


def _breaks_the_boundary(value: object) -> bool:
    """Whether any key or string holds NUL or a lone surrogate, or any number is not finite (contract/boundary.py)."""
    if isinstance(value, str):
        return "\x00" in value or any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(_breaks_the_boundary(k) or _breaks_the_boundary(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_breaks_the_boundary(v) for v in value)
    return False


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=50_000) as fake:
        svc = InProcessService(Path(tmp_path_factory.mktemp("property")), fake.url)
        svc.settings = svc.settings.with_overrides(api_keys=KEYS | TEAM_KEYS)
        with svc:
            yield svc


def _strict_json(line: str) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"exported line holds {constant}, which is not JSON")

    return json.loads(line, parse_constant=refuse)


def _import_key(line: dict) -> str:
    """The key an import stores a line under: its own, or `import:<its id>` (its lineage)."""
    return line.get("idempotency_key") or f"import:{line['id']}"


class TwoTeams(RuleBasedStateMachine):
    """The model: per team, the acknowledged memories (id -> text), the marker words it holds, the counters'
    allowed sums, the handled keys seen, and which original each imported copy descends from."""

    svc: InProcessService
    runs = 0

    def __init__(self) -> None:
        super().__init__()
        TwoTeams.runs += 1
        assert TwoTeams.runs < PAIRS, "more runs than team pairs: raise PAIRS"
        self.admin = {side: f"key-{TwoTeams.runs}-{side}" for side in TEAMS}
        self.http = httpx.Client(base_url=self.svc.url, timeout=60)
        self.saved: dict[str, dict[str, str]] = {}
        self.words: dict[str, set[str]] = {team: set() for team in TEAMS}
        self.used: dict[tuple[str, str], int] = {}
        self.handled: dict[str, set[str]] = {team: set() for team in TEAMS}
        self.keys: dict[str, dict[str, str | None]] = {team: {} for team in TEAMS}  # memory id -> its stored key
        self.writers: dict[str, str] = {}
        self.revoked: list[str] = []
        self.limit = f"calls-{uuid.uuid4().hex[:8]}"

    def teardown(self) -> None:
        self.http.close()

    # ------------------------------------------------------------------ calls

    def call(
        self, method: str, path: str, key: str | None, headers: dict[str, str] | None = None, **kwargs: object
    ) -> httpx.Response:
        headers = (headers or {}) | ({"Authorization": f"Bearer {key}"} if key else {})
        response = self.http.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
        assert response.status_code < 500, f"{method} {path}: {response.status_code} {response.text[:500]}"
        return response

    def key(self, team: str, role: str) -> str:
        return self.admin[team] if role == "admin" else self.writers[team]

    def listed(self, team: str) -> dict[str, str]:
        found: dict[str, str] = {}
        cursor: str | None = None
        while True:
            params = {"limit": 100} | ({"cursor": cursor} if cursor else {})
            page = self.call("GET", "/v1/memories", self.admin[team], params=params).json()
            found.update({item["id"]: item["text"] for item in page["items"]})
            cursor = page["next_cursor"]
            if not cursor:
                return found

    def already_here(self, team: str, line: dict) -> bool:
        """Whether an import into `team` skips `line`: the team holds its key (a client's key, or the lineage
        `import:<original id>` of an earlier copy), the memory itself, or the original it was copied from."""
        key = _import_key(line)
        original = key.removeprefix("import:") if key.startswith("import:") else line["id"]
        return any(self.keys[team].get(mid) == key or mid in (line["id"], original) for mid in self.saved[team])

    def saved_anywhere(self) -> set[str]:
        return set(self.saved[TEAMS[0]]) | set(self.saved[TEAMS[1]])

    def exported(self, team: str) -> list[dict]:
        response = self.call("GET", "/v1/export", self.admin[team])
        assert response.status_code == 200
        # JSON Lines end at "\n" only (U+2028 or \x85 inside a text is not a line end)
        return [_strict_json(line) for line in response.text.split("\n") if line.strip()]

    # ------------------------------------------------------------------ set-up

    @initialize()
    def start(self) -> None:
        """Each run has two teams of its own, empty: a write key each and a limit."""
        for team in TEAMS:
            self.saved[team] = {}
            made = self.call("POST", "/v1/keys", self.admin[team], json={"role": "write"})
            assert made.status_code == 201, made.text
            self.writers[team] = made.json()["key"]
            spec = {"daily_limit": LIMIT, "timezone": "UTC", "per": "agent"}
            assert self.call("PUT", f"/v1/limits/{self.limit}", self.admin[team], json=spec).status_code in (200, 201)

    # ------------------------------------------------------------------ rules

    @rule(team=st.sampled_from(TEAMS), role=st.sampled_from(["admin", "write"]), agent=st.sampled_from(AGENTS))
    def remember(self, team: str, role: str, agent: str) -> None:
        word = f"zq{uuid.uuid4().hex[:10]}"
        text = f"{agent} deployed build {word} to staging; the canary for {word} passed."
        body = {"text": text, "agent_id": agent}
        response = self.call("POST", "/v1/remember", self.key(team, role), json=body)
        assert response.status_code in (200, 201, 202), response.text
        self.saved[team][response.json()["id"]] = text
        self.words[team].add(word)

    @rule(
        team=st.sampled_from(TEAMS),
        agent=st.sampled_from(AGENTS),
        head=field_text,
        tail=field_text,
        tags=st.lists(st.text(min_size=1, max_size=6) | any_text, max_size=2),
        metadata=any_metadata,
        key=st.none() | field_text,
    )
    def remember_any_unicode(
        self, team: str, agent: str, head: str, tail: str, tags: list[str], metadata: dict, key: str | None
    ) -> None:
        """Every string field, metadata at any depth included: what breaks the text boundary is a 422, the rest
        is kept as given (no normalisation) and must export as strict JSON that imports back."""
        word = f"zq{uuid.uuid4().hex[:10]}"
        text = f"{head} {word} {tail}"
        body: dict = {"text": text, "agent_id": agent, "tags": tags, "metadata": metadata}
        if key is not None:
            body["idempotency_key"] = f"k-{word}-{key}"  # unique: a replay would not be a new memory
        raw = json.dumps(body).encode()  # ASCII escapes: how a lone surrogate or NaN travels as raw JSON
        response = self.call(
            "POST", "/v1/remember", self.admin[team], {"Content-Type": "application/json"}, content=raw
        )
        if _breaks_the_boundary(body):
            assert response.status_code == 422, response.text
            return
        assert response.status_code in (202, 422), response.text  # 422: a tag of control characters, say
        if response.status_code == 202:
            memory_id = response.json()["id"]
            got = self.call("GET", f"/v1/memories/{memory_id}", self.admin[team]).json()
            assert (got["text"], got["metadata"]) == (text, metadata)
            self.saved[team][memory_id] = text
            self.keys[team][memory_id] = body.get("idempotency_key")
            self.words[team].add(word)

    @rule(team=st.sampled_from(TEAMS), data=st.data())
    def forget_one(self, team: str, data: st.DataObject) -> None:
        if not self.saved[team]:
            return
        memory_id = data.draw(st.sampled_from(list(self.saved[team])))
        response = self.call("DELETE", f"/v1/memories/{memory_id}", self.admin[team])
        assert response.status_code in (200, 204), response.text
        del self.saved[team][memory_id]

    @rule(team=st.sampled_from(TEAMS), data=st.data())
    def reach_across(self, team: str, data: st.DataObject) -> None:
        """The other team's ids are unknown here: get and forget answer 404, and nothing of theirs changes."""
        other = TEAMS[1 - TEAMS.index(team)]
        if not self.saved[other]:
            return
        memory_id = data.draw(st.sampled_from(list(self.saved[other])))
        for method in ("GET", "DELETE"):
            assert self.call(method, f"/v1/memories/{memory_id}", self.admin[team]).status_code == 404

    @rule(team=st.sampled_from(TEAMS), own=st.booleans(), data=st.data())
    def recall(self, team: str, own: bool, data: st.DataObject) -> None:
        source = team if own else TEAMS[1 - TEAMS.index(team)]
        if not self.words[source]:
            return
        word = data.draw(st.sampled_from(sorted(self.words[source])))
        response = self.call("POST", "/v1/recall", self.key(team, "write"), json={"query": f"build {word}", "k": 20})
        assert response.status_code == 200, response.text
        others = self.words[TEAMS[1 - TEAMS.index(team)]] - self.words[team]
        for item in response.json()["items"]:
            assert item["memory_id"] in self.saved[team] or item["memory_id"] not in self.saved_anywhere()
            assert not any(w in item["text"] for w in others), f"{team} recalled another team's text: {item}"

    @rule(team=st.sampled_from(TEAMS), agent=st.sampled_from(AGENTS), amount=st.integers(1, 4))
    def consume(self, team: str, agent: str, amount: int) -> None:
        body = {"agent_id": agent, "amount": amount}
        response = self.call("POST", f"/v1/limits/{self.limit}/consume", self.writers[team], json=body)
        before = self.used.get((team, agent), 0)
        allowed = before + amount <= LIMIT
        assert response.status_code == (200 if allowed else 429), response.text
        answer = response.json()
        assert answer["allowed"] is allowed
        self.used[(team, agent)] = before + amount if allowed else before
        assert answer["used"] == self.used[(team, agent)] <= LIMIT

    @rule(team=st.sampled_from(TEAMS), item=st.integers(0, 5))
    def mark_handled(self, team: str, item: int) -> None:
        key = f"ticket-{item}-{self.limit}"
        response = self.call("POST", "/v1/handled", self.writers[team], json={"key": key})
        assert response.status_code == 200, response.text
        assert response.json()["first_time"] is (key not in self.handled[team]), (team, key, response.json())
        self.handled[team].add(key)

    @rule(team=st.sampled_from(TEAMS))
    def reimport_export(self, team: str) -> None:
        lines = self.exported(team)
        body = "".join(json.dumps(line) + "\n" for line in lines)
        response = self.call("POST", "/v1/import", self.writers[team], content=body.encode())
        assert response.status_code == 200, response.text
        tally = response.json()
        assert (tally["imported"], tally["failed"]) == (0, 0), tally
        assert tally["skipped"] == len(lines)

    @rule(team=st.sampled_from(TEAMS))
    def import_from_other(self, team: str) -> None:
        """The other team's export imported here: new memories of this team, the other team unchanged; lines
        imported before (and not forgotten since) are skipped."""
        other = TEAMS[1 - TEAMS.index(team)]
        lines = self.exported(other)
        body = "".join(json.dumps(line) + "\n" for line in lines)
        before = set(self.listed(team))
        response = self.call("POST", "/v1/import", self.writers[team], content=body.encode())
        assert response.status_code == 200, response.text
        tally = response.json()
        fresh = [line for line in lines if not self.already_here(team, line)]
        assert (tally["imported"], tally["skipped"], tally["failed"]) == (len(fresh), len(lines) - len(fresh), 0)
        added = {mid: text for mid, text in self.listed(team).items() if mid not in before}
        assert sorted(added.values()) == sorted(line["text"] for line in fresh)
        by_text = {text: mid for mid, text in added.items()}
        for line in fresh:
            self.keys[team][by_text[line["text"]]] = _import_key(line)
            self.words[team] |= {w for w in line["text"].split() if w.startswith("zq")}
        self.saved[team].update(added)

    @rule(team=st.sampled_from(TEAMS))
    def revoke_writer(self, team: str) -> None:
        """Revoke the team's write key: the next request with it is refused; a new one takes its place."""
        old = self.writers[team]
        keys = self.call("GET", "/v1/keys", self.admin[team]).json()
        mine = [k for k in keys if k["role"] == "write" and k["agent_id"] is None]
        for info in mine:
            assert self.call("DELETE", f"/v1/keys/{info['id']}", self.admin[team]).status_code == 204
        assert self.call("GET", "/v1/team", old).status_code == 401
        self.revoked.append(old)
        self.writers[team] = self.call("POST", "/v1/keys", self.admin[team], json={"role": "write"}).json()["key"]

    # ------------------------------------------------------------------ invariants

    @invariant()
    def nothing_lost_nothing_crossed(self) -> None:
        if not self.saved:
            return
        for team in TEAMS:
            listed = self.listed(team)
            assert listed == self.saved[team], f"{team}: listed differs from what was acknowledged"
            exported = {line["id"]: line["text"] for line in self.exported(team)}
            assert exported == self.saved[team], f"{team}: export differs from what was acknowledged"

    @invariant()
    def revoked_keys_stay_revoked(self) -> None:
        for key in self.revoked[-3:]:
            assert self.call("GET", "/v1/team", key).status_code == 401


_EXAMPLES = int(os.environ.get("MEMORY_PROPERTY_EXAMPLES", "40"))
_STEPS = int(os.environ.get("MEMORY_PROPERTY_STEPS", "25"))


def test_two_teams_any_sequence(service: InProcessService) -> None:
    TwoTeams.svc = service
    run = TwoTeams.TestCase
    run.settings = settings(
        max_examples=_EXAMPLES,
        stateful_step_count=_STEPS,
        deadline=None,
        derandomize=os.environ.get("MEMORY_PROPERTY_EXAMPLES") is None,  # CI: a fixed seed
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        database=None,
    )
    run("runTest").runTest()
