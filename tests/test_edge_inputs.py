"""Edge inputs are a clear 4xx, never a 500: moments at the ends of datetime's range, hostile list cursors.

In process: the real app and stores, no model server (none of this reaches it).
"""

from __future__ import annotations

import base64
import json

import pytest

EDGES = [
    "0001-01-01T00:00:00+14:00",  # before year 1 in UTC
    "9999-12-31T23:00:00-05:00",  # after year 9999 in UTC
    "0001-01-01T00:00:00",  # naive: read in MEMORY_TIMEZONE, which may be east of UTC
    "9999-12-31T23:59:59Z",
    "0001-01-01",
]


@pytest.mark.parametrize("moment", EDGES)
def test_remember_refuses_an_occurred_at_outside_the_range(inprocess, moment: str) -> None:
    with inprocess.client() as client:
        before = inprocess.jobs()
        response = client.post(
            "/v1/remember", json={"text": "The pump was serviced.", "agent_id": "edge", "occurred_at": moment}
        )
        assert response.status_code == 422, response.text
        assert "occurred_at" in response.json()["detail"] and "0002-01-01" in response.json()["detail"]
        assert inprocess.jobs() == before


@pytest.mark.parametrize("moment", EDGES)
@pytest.mark.parametrize("field", ["since", "until"])
def test_recall_and_list_refuse_a_window_outside_the_range(inprocess, moment: str, field: str) -> None:
    with inprocess.client() as client:
        for time_field in ("created_at", "occurred_at"):
            body = {"query": "pump", field: moment, "time_field": time_field}
            recalled = client.post("/v1/recall", json=body)
            assert recalled.status_code == 422 and field in recalled.json()["detail"], recalled.text
        listed = client.get("/v1/memories", params={field: moment})
        assert listed.status_code == 422 and field in listed.json()["detail"], listed.text


def test_moments_inside_the_range_are_taken(inprocess) -> None:
    with inprocess.client() as client:
        for moment in ("0002-01-01T00:00:00+00:00", "9998-12-31T23:00:00Z", "2024-02-29T23:30:00+14:00"):
            saved = client.post(
                "/v1/remember", json={"text": "The pump was serviced.", "agent_id": "edge", "occurred_at": moment}
            )
            assert saved.status_code == 202, saved.text
            assert client.get("/v1/memories", params={"since": moment}).status_code == 200
            assert client.post("/v1/recall", json={"query": "pump", "until": moment}).status_code == 200
        shown = client.get(f"/v1/memories/{saved.json()['id']}")
        assert shown.status_code == 200 and shown.json()["occurred_day"] == "2024-02-29"


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


HOSTILE_CURSORS = [
    _cursor("[" + "9" * 400 + ',"mem_x"]'),  # a 400-digit number: OverflowError in float()
    _cursor("[-" + "9" * 400 + ',"mem_x"]'),
    _cursor('[1e400,"mem_x"]'),  # json reads inf
    _cursor('[Infinity,"mem_x"]'),
    _cursor('[-Infinity,"mem_x"]'),
    _cursor('[NaN,"mem_x"]'),
    _cursor('[1e20,"mem_x"]'),
    _cursor('[-1e20,"mem_x"]'),
    _cursor('["1700000000","mem_x"]'),
    _cursor('[true,"mem_x"]'),
    _cursor('[null,"mem_x"]'),
    _cursor("[1700000000,5]"),
    _cursor("[1700000000]"),
    _cursor('{"a":1}'),
    _cursor("[" * 350 + "]" * 350),
    _cursor("\xff\xfe"),
    "!!!!",
    "a",
    "%%%",
    "====",
]


@pytest.mark.parametrize("cursor", HOSTILE_CURSORS)
def test_a_hostile_cursor_is_a_400(inprocess, cursor: str) -> None:
    with inprocess.client() as client:
        response = client.get("/v1/memories", params={"cursor": cursor})
        assert response.status_code == 400, response.text
        assert "next_cursor" in response.json()["detail"]


def test_a_real_cursor_still_pages(inprocess) -> None:
    with inprocess.client() as client:
        for i in range(3):
            assert (
                client.post("/v1/remember", json={"text": f"Pager note {i}.", "agent_id": "pager"}).status_code == 202
            )
        first = client.get("/v1/memories", params={"agent_id": "pager", "limit": 2}).json()
        assert len(first["items"]) == 2 and first["next_cursor"]
        position = json.loads(base64.urlsafe_b64decode(first["next_cursor"] + "=" * (-len(first["next_cursor"]) % 4)))
        assert isinstance(position[0], float)  # what encode writes, and so what decode must keep taking
        second = client.get("/v1/memories", params={"agent_id": "pager", "limit": 2, "cursor": first["next_cursor"]})
        assert second.status_code == 200 and len(second.json()["items"]) == 1
