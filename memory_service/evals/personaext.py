"""PersonaExt extraction eval through the real API: does extraction keep the persona fact an utterance states?

Each utterance is saved with POST /v1/remember (wait_s, so the answer comes
after extraction); GET /v1/memories/{id} gives the stored facts, the rejected
ones and the extraction report. An utterance counts as found when its gold
tail phrase (e.g. "coffee" in "i like wine and coffee") appears, normalised and
case-insensitive, as a whole phrase in one of its facts. Also: facts per
utterance, stored / proposed (grounding and dedup together), and facts made
from utterances without a gold fact when the file has such lines.

    memory-service eval --data dev.jsonl --out DIR [--limit 200] [--url URL --api-key KEY]
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import sys
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..client.service import service_client
from ..testbed.results import pyplot, write_figure
from ..testbed.stats import percentile

DEFAULT_LIMIT = 200
WAIT_S = 60.0
AGENT_ID = "personaext"
_WORD = re.compile(r"[0-9a-z]+")
_NO_SPACE_BEFORE = re.compile(r" ([.,!?;:%)]|'s|'m|'re|'ve|'d|'ll|n't)(?=\s|$)")


@dataclass
class Utterance:
    index: int
    text: str
    head: str | None
    tail: str | None
    label: str | None


def detokenize(tokens: list[str]) -> str:
    """PersonaChat tokens back to plain text ("i like wine ." -> "i like wine.")."""
    return _NO_SPACE_BEFORE.sub(r"\1", " ".join(tokens)).replace("( ", "(")


def norm(text: str) -> str:
    """Lower-case words only: the comparison ignores case, punctuation and spacing."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).lower()))


def _stem(word: str) -> str:
    for suffix in ("ies", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def phrase_in(phrase: str, text: str) -> bool:
    """Whole-phrase containment after normalisation."""
    p, t = norm(phrase), norm(text)
    return bool(p) and f" {p} " in f" {t} "


def phrase_in_lenient(phrase: str, text: str) -> bool:
    """Every word of the phrase in the text, crude plural stemming (\"teas\" ~ \"tea\")."""
    words = {_stem(w) for w in norm(text).split()}
    wanted = [_stem(w) for w in norm(phrase).split()]
    return bool(wanted) and all(w in words for w in wanted)


def parse_line(index: int, row: dict[str, Any]) -> Utterance:
    triplets = row.get("triplets") or []
    if not triplets:
        return Utterance(index, detokenize(row.get("tokens") or []), None, None, None)
    t = triplets[0]
    tokens = t["tokens"]
    pick = lambda idx: " ".join(tokens[i] for i in idx) if idx else None  # noqa: E731
    return Utterance(index, detokenize(tokens), pick(t.get("head")), pick(t.get("tail")), t.get("label"))


def load(path: Path, limit: int | None = DEFAULT_LIMIT) -> list[Utterance]:
    rows = []
    with open(path) as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
            if limit and len(rows) >= limit:
                break
    return [parse_line(i, r) for i, r in enumerate(rows)]


def is_personaext(path: Path) -> bool:
    if path.suffix != ".jsonl":
        return False
    with open(path) as fh:
        first = fh.readline()
    return '"triplets"' in first or '"tokens"' in first


def _log(message: str) -> None:
    print(f"[personaext] {message}", file=sys.stderr, flush=True)


def _save_and_wait(client: httpx.Client, utt: Utterance) -> tuple[dict[str, Any], float]:
    key = "personaext:" + hashlib.sha256(f"{utt.index}:{utt.text}".encode()).hexdigest()[:24]
    started = time.perf_counter()
    response = client.post(
        "/v1/remember", json={"text": utt.text, "agent_id": AGENT_ID, "wait_s": WAIT_S, "idempotency_key": key}
    )
    if response.status_code >= 400:
        raise RuntimeError(f"/v1/remember answered {response.status_code}: {response.text[:300]}")
    memory_id = response.json()["id"]
    deadline = time.monotonic() + 300
    while True:
        body = client.get(f"/v1/memories/{memory_id}").json()
        if body.get("status") in ("done", "failed") or time.monotonic() > deadline:
            return body, time.perf_counter() - started
        time.sleep(0.2)


def run(utterances: list[Utterance], *, url: str, key: str | None) -> dict[str, Any]:
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with service_client(url, key, timeout=WAIT_S + 60) as client:
        for n, utt in enumerate(utterances, start=1):
            body, wall = _save_and_wait(client, utt)
            rows.append(score_utterance(utt, body, wall))
            if n % 10 == 0 or n == len(utterances):
                found = sum(r["tail_in_facts"] for r in rows)
                _log(f"{n}/{len(utterances)} utterances, tail found {found}/{n}, {time.monotonic() - started:.0f}s")
    return {
        "dataset": "personaext",
        **summarize(rows),
        "rows": rows,
        "timing_s": {"total": round(time.monotonic() - started, 1)},
        "settings": {
            "wait_s": WAIT_S,
            "match": "gold tail phrase, normalised, whole phrase in one fact",
            "agent_id": AGENT_ID,
            "one team for all utterances (dedup across them applies)": True,
        },
    }


def score_utterance(utt: Utterance, body: dict[str, Any], wall: float) -> dict[str, Any]:
    """One utterance's row: what the service stored for it, and whether its gold tail is in those facts."""
    facts = [f["text"] for f in body.get("facts") or []]
    rejected = [r.get("text", "") for r in body.get("rejected_facts") or []]
    report = body.get("extraction") or {}
    # facts the service added in code (sentences no model fact covered): an utterance's own sentence
    # holds its tail phrase by construction, so the model's extraction is also scored without them
    added = set((report.get("completed") or {}).get("added_facts") or [])
    model_facts = [f for f in facts if f not in added]
    tail = utt.tail or ""
    return {
        "index": utt.index,
        "text": utt.text,
        "label": utt.label,
        "tail": utt.tail,
        "status": body.get("status"),
        "facts": facts,
        "rejected": rejected,
        "reject_reasons": [r.get("reason", "") for r in body.get("rejected_facts") or []],
        "proposed": int(report.get("proposed") or 0),
        "stored": int(report.get("stored") or 0),
        "merged": int(report.get("merged") or 0),
        "predicted_n": (body.get("timings") or {}).get("predicted_n"),
        "wall_s": round(wall, 3),
        "tail_in_facts": bool(tail) and any(phrase_in(tail, f) for f in facts),
        "tail_in_facts_lenient": bool(tail) and any(phrase_in_lenient(tail, f) for f in facts),
        "tail_in_model_facts": bool(tail) and any(phrase_in(tail, f) for f in model_facts),
        "added": len(facts) - len(model_facts),
        "tail_in_proposed": bool(tail) and any(phrase_in(tail, f) for f in facts + rejected),
        "skipped": report.get("skipped"),
        "calls": len(report.get("calls") or []),
        "echoes": sum(1 for f in facts if token_jaccard(f, utt.text) >= ECHO_JACCARD),
        "multi_clause": bool(MULTI_CLAUSE.search(utt.text.strip())),
    }


ECHO_JACCARD = 0.8
# more than one clause: two sentences, a semicolon, or a comma before and/but/so/while
MULTI_CLAUSE = re.compile(r"[.!?;]\s+\S|,\s+(?:and|but|so|while)\s")


def token_jaccard(a: str, b: str) -> float:
    left, right = set(norm(a).split()), set(norm(b).split())
    return len(left & right) / len(left | right) if left and right else 0.0


def echo_share(rows: list[dict[str, Any]]) -> float | None:
    facts = sum(len(r["facts"]) for r in rows)
    return round(sum(r.get("echoes", 0) for r in rows) / facts, 4) if facts else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Metrics over per-utterance rows (also used by the smoke test on hand-made rows)."""
    gold = [r for r in rows if r.get("tail")]
    no_gold = [r for r in rows if not r.get("tail")]
    proposed = sum(r["proposed"] for r in rows)
    stored = sum(r["stored"] for r in rows)
    kept = sum(r["stored"] + r["merged"] for r in rows)

    def share(subset: list[dict[str, Any]], key: str) -> float | None:
        return round(sum(bool(r[key]) for r in subset) / len(subset), 4) if subset else None

    per_label: dict[str, dict[str, Any]] = {}
    for label, count in Counter(r["label"] for r in gold).most_common():
        subset = [r for r in gold if r["label"] == label]
        per_label[str(label)] = {"n": count, "tail_found": share(subset, "tail_in_facts")}
    walls = [r["wall_s"] for r in rows]
    predicted = [float(r["predicted_n"]) for r in rows if r.get("predicted_n") is not None]
    metrics = {
        "utterances": len(rows),
        "with_gold_fact": len(gold),
        "tail_found_in_stored_facts": share(gold, "tail_in_facts"),
        "tail_found_in_stored_facts_lenient": share(gold, "tail_in_facts_lenient"),
        "tail_found_in_proposed_facts": share(gold, "tail_in_proposed"),
        # the model's own facts only, without the sentences the service added in code (MEMORY_EXTRACT_COMPLETE)
        "tail_found_in_model_facts": share(gold, "tail_in_model_facts")
        if all("tail_in_model_facts" in r for r in gold)
        else None,
        "facts_added_in_code_per_utterance_mean": round(statistics.fmean(r.get("added", 0) for r in rows), 3)
        if rows
        else None,
        "facts_per_utterance_mean": round(statistics.fmean(len(r["facts"]) for r in rows), 3) if rows else None,
        "facts_per_utterance_median": statistics.median(len(r["facts"]) for r in rows) if rows else None,
        "utterances_with_no_fact": sum(1 for r in rows if not r["facts"]),
        "proposed_per_utterance_mean": round(proposed / len(rows), 3) if rows else None,
        "stored_over_proposed": round(stored / proposed, 4) if proposed else None,
        "kept_over_proposed": round(kept / proposed, 4) if proposed else None,
        "reject_reasons": dict(
            Counter(
                re.sub(r"\d+%?", "N", reason.split(":")[0].split("(")[0]).strip()
                for r in rows
                for reason in r["reject_reasons"]
            )
        ),
        "no_gold_utterances": len(no_gold),
        "facts_from_no_gold_utterances": (
            sum(len(r["facts"]) for r in no_gold) if no_gold else "n/a: every line of this file has a gold triplet"
        ),
        "status": dict(Counter(r["status"] for r in rows)),
        "wall_s_p50": percentile(walls, 50),
        "wall_s_p95": percentile(walls, 95),
        "predicted_tokens_median": statistics.median(predicted) if predicted else None,
        # a "fact" that is the utterance again (token Jaccard >= 0.8) adds nothing to the raw text
        "echo_share": echo_share(rows),
        # the same, over utterances of more than one clause: there a fact equal to the input holds several claims
        "echo_share_multi_clause": echo_share([r for r in rows if r.get("multi_clause")]),
        "model_calls": sum(r.get("calls", 0) for r in rows),
        "model_calls_skipped_small_talk": sum(1 for r in rows if r.get("skipped")),
    }
    misses = [
        {"text": r["text"], "tail": r["tail"], "facts": r["facts"], "rejected": r["rejected"]}
        for r in gold
        if not r["tail_in_facts"]
    ][:15]
    hits = [{"text": r["text"], "tail": r["tail"], "facts": r["facts"]} for r in gold if r["tail_in_facts"]][:5]
    return {"metrics": metrics, "per_label": per_label, "examples": {"missed": misses, "found": hits}}


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    m = result["metrics"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [
        "tail_found_in_stored_facts",
        "tail_found_in_stored_facts_lenient",
        "tail_found_in_proposed_facts",
        "stored_over_proposed",
        "kept_over_proposed",
    ]
    left.barh([n.replace("_", " ") for n in names], [m.get(n) or 0 for n in names])
    left.set_xlim(0, 1)
    left.set_title(f"PersonaExt extraction ({m['utterances']} utterances)")
    labels = [(k, v) for k, v in result["per_label"].items() if v["n"] >= 5][:12]
    right.barh([f"{k} (n={v['n']})" for k, v in labels], [v["tail_found"] or 0 for _, v in labels])
    right.set_xlim(0, 1)
    right.set_title("tail found in stored facts, per relation")
    write_figure(fig, path)
