"""One text boundary (contract/boundary.py): every string that enters, on every route and at any depth of
`metadata`, is valid Unicode without NUL, every number finite; and rows stored before that rule held still
export, read and list (repaired: U+FFFD for a lone surrogate or NUL, null for a non-finite number).

Against the real app in this process (real SQLite and Chroma). A lone surrogate can only be sent as the JSON
escape `\\udc80` in raw bytes: Python cannot UTF-8-encode one.
"""

from __future__ import annotations

import json
import math

import pytest

from memory_service.contract.boundary import REPLACEMENT, repaired

BAD_METADATA = {
    "surrogate value": (rb'{"s": "\udc80"}', "lone surrogate"),
    "surrogate key": (rb'{"\ud800k": 1}', "lone surrogate"),
    "surrogate deep": (rb'{"a": [{"b": ["ok", "x\udfff"]}]}', "lone surrogate"),
    "NaN": (rb'{"n": NaN}', "finite"),
    "Infinity": (rb'{"n": [Infinity]}', "finite"),
    "-Infinity": (rb'{"n": {"m": -Infinity}}', "finite"),
    "1e400": (rb'{"n": 1e400}', "finite"),
}


def _strict(line: str) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"exported line holds {constant}, which is not JSON")

    return json.loads(line, parse_constant=refuse)


@pytest.mark.parametrize("metadata,needle", BAD_METADATA.values(), ids=list(BAD_METADATA))
def test_metadata_that_json_cannot_carry_back_is_a_422_naming_the_rule(inprocess, metadata, needle) -> None:
    client = inprocess.client()
    before = inprocess.jobs()
    body = b'{"text": "The kiln runs hot.", "agent_id": "potter", "metadata": ' + metadata + b"}"
    answer = client.post("/v1/remember", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid_request" and needle in answer.json()["detail"], answer.json()
    assert answer.json()["errors"][0]["field"] == "metadata"
    assert inprocess.jobs() == before


@pytest.mark.parametrize(
    "field,value",
    [
        ("text", rb'"kiln \udc80"'),
        ("tags", rb'["\ud800"]'),
        ("idempotency_key", rb'"k\udc80"'),
        ("run_id", rb'"\udc80"'),
    ],
)
def test_a_lone_surrogate_in_any_string_field_names_the_rule(inprocess, field, value) -> None:
    # a repeated key: JSON readers keep the last, so `text` is replaced by the bad one
    body = b'{"text": "The kiln runs hot.", "agent_id": "potter", "' + field.encode() + b'": ' + value + b"}"
    answer = inprocess.client().post("/v1/remember", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith(f"{field}") and ("surrogate" in detail or field == "run_id"), detail


def test_recall_query_with_a_lone_surrogate_names_the_rule(inprocess) -> None:
    body = rb'{"query": "kiln \udc80"}'
    answer = inprocess.client().post("/v1/recall", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422 and "lone surrogate" in answer.json()["detail"], answer.text


HINDSIGHT_BAD = {
    "content surrogate": (rb'{"content": "kiln \udc80"}', "lone surrogate"),
    "content block surrogate": (rb'{"content": [{"type": "text", "text": "kiln \udc80"}]}', "lone surrogate"),
    "context surrogate": (rb'{"content": "kiln", "context": "c\udc80"}', "lone surrogate"),
    "metadata surrogate": (rb'{"content": "kiln", "metadata": {"k": "\udc80"}}', "lone surrogate"),
    "metadata NUL": (rb'{"content": "kiln", "metadata": {"k": "a\u0000b"}}', "NUL"),
    "metadata NUL key": (rb'{"content": "kiln", "metadata": {"\u0000": "v"}}', "NUL"),
}


@pytest.mark.parametrize("item,needle", HINDSIGHT_BAD.values(), ids=list(HINDSIGHT_BAD))
def test_hindsight_retain_holds_the_same_boundary(inprocess, item, needle) -> None:
    """Content, context and metadata: a 422 naming the rule (a surrogate was a 500, NUL in metadata stored)."""
    before = inprocess.jobs()
    body = b'{"items": [' + item + b"]}"
    answer = inprocess.client().post(
        "/v1/default/banks/potter/memories", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert needle in answer.json()["detail"], answer.json()
    assert inprocess.jobs() == before


def test_an_import_line_holding_what_remember_refuses_is_reported(inprocess) -> None:
    good = b'{"id": "boundary-ok", "text": "The kiln runs hot.", "agent_id": "potter", "created_at": 2.0'
    lines = [
        good + b', "metadata": {"s": "\\udc80"}}',
        good.replace(b"boundary-ok", b"boundary-nan") + b', "metadata": {"n": NaN}}',
        good.replace(b"boundary-ok", b"boundary-1e400") + b', "metadata": {"n": 1e400}}',
    ]
    answer = inprocess.client().post("/v1/import", content=b"\n".join(lines))
    tally = answer.json()
    assert answer.status_code == 200 and tally["failed"] == 3 and tally["imported"] == 0, tally
    first, *numbers = tally["errors"]
    assert "surrogate" in first["detail"], first  # the line's JSON reader refuses it as JSON already
    assert all(error["detail"].startswith("metadata: at n: numbers must be finite") for error in numbers), tally


def test_text_is_kept_as_given_not_normalised(inprocess) -> None:
    """The stated normal form: none. ſ, K (Kelvin), ﬁ, a combining mark, RTL and fullwidth digits come back
    byte for byte."""
    text = "ſtraße K ﬁle e\u0301 \u202eRTL\u202c １２３ ı"
    client = inprocess.client()
    saved = client.post("/v1/remember", json={"text": text, "agent_id": "potter", "metadata": {"ſ": "K"}})
    assert saved.status_code == 202, saved.text
    got = client.get(f"/v1/memories/{saved.json()['id']}").json()
    assert got["text"] == text and got["metadata"] == {"ſ": "K"}


STORED = {
    "s": "\udc80",
    "n": math.nan,
    "inf": [math.inf, -math.inf],
    "z": "a\x00b",
    "\ud800k": {"deep": ["x\udfff", 1.5]},
    "hindsight": {"context": "ctx\udc80", "metadata": {"k": "v\x00"}, "document_id": "legacy-doc"},
}


def test_rows_stored_before_the_boundary_still_export_read_and_import_back(inprocess) -> None:
    """A row written with the old rules (straight into the journal, as the old routes did): the export stays
    strict JSON for every line and imports back; GET, Hindsight recall and document listing answer 200."""
    services = inprocess.services
    memory, _ = services.journal.insert(
        team="team-a",
        agent_id="legacy-bank",
        text="The walrus kites were stored in hangar nine.",
        run_id="legacy-doc",
        tags=["legacy"],
        metadata=STORED,
        idempotency_key=None,
        budget_s=60.0,
    )
    client = inprocess.client()
    export = client.get("/v1/export")
    assert export.status_code == 200
    lines = [_strict(line) for line in export.text.splitlines() if line.strip()]
    mine = next(line for line in lines if line["id"] == memory.id)
    want = {
        "s": REPLACEMENT,
        "n": None,
        "inf": [None, None],
        "z": f"a{REPLACEMENT}b",
        f"{REPLACEMENT}k": {"deep": [f"x{REPLACEMENT}", 1.5]},
        "hindsight": {
            "context": f"ctx{REPLACEMENT}",
            "metadata": {"k": f"v{REPLACEMENT}"},
            "document_id": "legacy-doc",
        },
    }
    assert mine["metadata"] == want

    got = client.get(f"/v1/memories/{memory.id}")
    assert got.status_code == 200 and got.json()["metadata"] == want, got.text
    docs = client.get("/v1/default/banks/legacy-bank/documents")
    assert docs.status_code == 200, docs.text
    assert docs.json()["items"][0]["document_metadata"] == {"context": f"ctx{REPLACEMENT}", "k": f"v{REPLACEMENT}"}
    found = client.post("/v1/default/banks/legacy-bank/memories/recall", json={"query": "walrus kites hangar"})
    assert found.status_code == 200, found.text
    assert any(r["context"] == f"ctx{REPLACEMENT}" for r in found.json()["results"]), found.json()

    body = "".join(json.dumps(line) + "\n" for line in lines)
    back = inprocess.client("key-b").post("/v1/import", content=body.encode())
    assert back.status_code == 200 and back.json()["failed"] == 0, back.json()
    assert back.json()["imported"] == len(lines)


def test_repair_leaves_valid_values_alone_and_keeps_order() -> None:
    value = {"b": [1, 2.5, "ok", {"x": None, "y": True}], "a": "emoji 😀", "K": []}
    assert repaired(value) == value and list(repaired(value)) == ["b", "a", "K"]


@pytest.mark.parametrize("query", ["q=Plover%00x", "agent_id=a%00b", "tag=t%00"])
def test_the_consoles_search_and_filters_hold_the_same_boundary(inprocess, query: str) -> None:
    """The console's search reaches recall without the API's models: NUL is explained on the page, as the API
    explains it."""
    from tests.test_console import login

    page = login(inprocess, "key-a").get(f"/ui/memories?{query}")
    assert page.status_code == 422 and "NUL" in page.text, page.text[-600:]
