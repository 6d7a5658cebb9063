"""The gate's calls (reserve -> finish, or release, around a guarded tool call): a part of `core.Requests`,
written apart so each module keeps to one job. The wrapper that uses them is guard.py."""

from __future__ import annotations

from ..contract.gate import DEFAULT_LEASE_S, FinishAnswer, ReleaseAnswer, ReserveAnswer
from .calls import Call, drop_none, read_as


class GateRequests:
    """`client.gate.reserve/finish/release` (see core.Requests for how methods become the clients')."""

    def gate_reserve(
        self,
        tool: str,
        *,
        key: str | None = None,
        scope: str = "team",
        limit: str | None = None,
        units: int | None = None,
        agent_id: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> Call[ReserveAnswer]:
        """Before running `tool`: hold `key` (a handled-ledger key, in the team's or, scope="agent", the agent's
        ledger) and consume `units` of the daily `limit`, in one step. A ReserveAnswer: `allowed` with a
        `reservation` to finish or release, or refused (an answer, not an exception) with `reason` ("handled",
        "in_progress", "limit") and `message`, one sentence to hand to the model."""
        # not resent after a lost answer: the resend would find our own reservation and answer in_progress
        body = drop_none(
            {
                "tool": tool,
                "key": key,
                "scope": scope,
                "limit": limit,
                "units": units,
                "agent_id": agent_id,
                "lease_s": lease_s,
            }
        )
        return Call("POST", "/v1/gate/reserve", read_as(ReserveAnswer), json=body, idempotent=False, accept=(409, 429))

    def gate_finish(self, reservation: str, *, result: str | None = None) -> Call[FinishAnswer]:
        """The tool ran: record the reservation's key handled with a short `result` (at most 500 chars)."""
        return Call(
            "POST",
            "/v1/gate/finish",
            read_as(FinishAnswer),
            json=drop_none({"reservation": reservation, "result": result}),
            idempotent=False,  # a resend after a lost answer would be a 404: the first one finished it
        )

    def gate_release(self, reservation: str, *, error: str | None = None) -> Call[ReleaseAnswer]:
        """The tool failed: free the reservation's key and give back its units (`refunded`)."""
        return Call(
            "POST",
            "/v1/gate/release",
            read_as(ReleaseAnswer),
            json=drop_none({"reservation": reservation, "error": error}),
            idempotent=False,
        )
