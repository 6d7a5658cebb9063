"""After the model: what code adds to its facts (coverage, dates) and what the job's report says of it.

Kept beside the extraction step, not inside the worker's loop: the worker only decides when a job runs
and where its outcome goes; what becomes of the model's facts before dedup is decided here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

from ..extraction.conflicts import resolve_conflicts
from ..extraction.coverage import Asked, GapsFilled, fill_in_gaps
from ..extraction.dates import occurred, resolve_facts
from ..extraction.extractor import ExtractionResult
from ..extraction.grounding import GroundedFact
from ..extraction.prompt import PROMPT_VERSION
from ..storage.journal import Memory


@dataclass
class Postprocessed:
    """The facts to decide on, and the job's report so far (dedup adds its counts)."""

    facts: list[GroundedFact]
    report: dict[str, Any]


def skipped_report(reason: str) -> dict[str, Any]:
    """The report of a text the gate let through without a model call (small talk)."""
    return {
        "skipped": reason,
        "prompt_version": PROMPT_VERSION,
        "chunks": 0,
        "calls": [],
        "proposed": 0,
        "stored": 0,
        "merged": 0,
        "superseded": 0,
        "rejected": [],
    }


def day_of(job: Memory, zone: str) -> date:
    """The day the text was said: relative dates in its facts count from it (older journals: the save day)."""
    return date.fromisoformat(job.occurred_day or occurred(None, job.created_at, zone)[1])


def postprocess(result: ExtractionResult, job: Memory, *, fill: bool, asked: Asked | None, zone: str) -> Postprocessed:
    """Fill in what the model left out (when `fill`), date the facts, and say both on the report.

    `asked` is the question the save before this one ended on (None when there is none or it was not read).
    """
    facts = result.facts
    report = {**result.report}
    filled = None
    if fill:
        filled = fill_in_gaps(facts, job.text, asked)
        facts = filled.facts
    conflicts = resolve_conflicts(facts)  # two values of one attribute in one save: the later line wins
    facts = resolve_facts(conflicts.facts, day_of(job, zone))
    if conflicts.pairs:
        report["conflicts"] = conflicts.pairs
    if filled is not None:
        report["completed"] = _filled_report(filled, facts, len(result.facts))
    report.update(_deferrals_report(job))
    return Postprocessed(facts, report)


def _filled_report(filled: GapsFilled, facts: list[GroundedFact], from_model: int) -> dict[str, Any]:
    return {
        "speaker": filled.speaker,
        "first_person_rewritten": filled.rewritten,
        "sentences_added": filled.added,
        "answers_question_of": filled.answered_id,
        "speaker_named": filled.attributed,
        # which facts code added, not the model (they come after the model's): the evals tell them apart
        "added_facts": [f.text for f in facts[from_model:]],
    }


def _deferrals_report(job: Memory) -> dict[str, str]:
    """Why a job finished late, if it was deferred on the way."""
    if job.deferrals and (job.last_error or "").startswith("slower than measured"):
        return {
            "slow": f"finished after {job.deferrals} deferral(s): the model was slower than the "
            "budget allowed, so the text was split into smaller chunks"
        }
    if job.deferrals:  # not slowness: e.g. its llama-server died mid-request and another took it
        return {"deferred": f"finished after {job.deferrals} deferral(s); the last: {job.last_error}"}
    return {}
