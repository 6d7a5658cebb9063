"""Answers, not only evidence: a reader model answers each question from what recall put within a budget.

The reader gets the context lines that fit in `--reader-budget` tokens (budget.py) and answers in a short
phrase; the answer is scored against LoCoMo's gold answer by token F1, LoCoMo's own metric
(task_eval/evaluation.py): lowercase, commas, punctuation and the words a/an/the/and dropped, token-level
F1; multi-hop (category 1) gold answers are comma-separated parts, each scored by its best-matching part
of the answer and averaged; open-domain (3) keeps the gold answer before its first ";". Unlike LoCoMo's
code there is no Porter stemming (no NLTK here), so an inflected word ("runs" / "run") does not match:
figures are a little below what the original script gives. Adversarial questions (category 5) are not
asked at all (testbed/locomo_data.py's SKIP_CATEGORIES), so no "not mentioned" rule is needed.

With a judge (`--judge-url`), the share it calls CORRECT (J), the metric published systems report; its
prompt is JUDGE_PROMPT. Both endpoints are any OpenAI-compatible /v1/chat/completions, at temperature 0.
"""

from __future__ import annotations

import re
import string
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from ..testbed.locomo_data import Conversation, Question
from ..testbed.locomo_metrics import aggregate
from .budget import BudgetRun, TokenCounter

READ_MODES = ("default", "passages", "embedding_baseline")  # what the reader answers from
READER_SYSTEM = (
    "You answer questions about a long conversation, using only the memories given. Each memory line starts "
    "with [date agent]. Answer with a short phrase (a name, a date, a few words), no explanation. Resolve "
    'relative dates ("yesterday", "last week") against the date of the line. If the memories do not say, '
    "answer: not mentioned."
)
READER_USER = "Memories:\n{context}\n\nQuestion: {question}\nShort answer:"
JUDGE_PROMPT = (
    "You grade an answer to a question about a conversation.\n"
    "Question: {question}\nGold answer: {gold}\nAnswer given: {answer}\n"
    "The answer is CORRECT if it says the same thing as the gold answer: the same person, thing, place or "
    "date, in any wording; a date may be more or less detailed if it is the same time. Otherwise it is "
    "WRONG. Reply with one word: CORRECT or WRONG."
)
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> list[str]:
    """LoCoMo's normalisation, as tokens: lowercase, commas and punctuation out, a/an/the/and out."""
    text = text.replace(",", "").lower().translate(_PUNCTUATION)
    return _ARTICLES.sub(" ", text).split()


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 of two answers after `normalize` (1.0 when the same words, 0.0 when none shared)."""
    predicted, wanted = normalize(prediction), normalize(gold)
    common = sum((Counter(predicted) & Counter(wanted)).values())
    if not common:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def answer_f1(prediction: str, gold: str, category: int) -> float:
    """F1 as LoCoMo scores a category: multi-hop by parts, open-domain by the gold answer's first reading."""
    if category == 1:
        parts = [p for p in gold.split(",") if p.strip()] or [gold]
        answers = [p for p in prediction.split(",") if p.strip()] or [prediction]
        return sum(max(token_f1(a, p) for a in answers) for p in parts) / len(parts)
    if category == 3:
        gold = gold.split(";")[0]
    return token_f1(prediction, gold)


@dataclass
class Endpoint:
    """An OpenAI-compatible chat endpoint and what the report calls it."""

    url: str
    label: str
    model: str | None = None  # the `model` field, when the endpoint needs one

    def chat(self, client: httpx.Client, messages: list[dict[str, str]], max_tokens: int) -> str:
        body: dict[str, Any] = {"messages": messages, "temperature": 0, "max_tokens": max_tokens}
        if self.model:
            body["model"] = self.model
        base = self.url.rstrip("/").removesuffix("/v1")
        response = client.post(base + "/v1/chat/completions", json=body)
        response.raise_for_status()
        return str(response.json()["choices"][0]["message"].get("content") or "").strip()


def read_all(
    rows: dict[str, list[dict[str, Any]]],
    questions: dict[tuple[str, int], Question],
    reader: Endpoint,
    judge: Endpoint | None,
    limit: int | None,
    log: Any = print,
) -> dict[str, Any]:
    """Each mode's first `limit` questions answered by the reader from its budgeted context, then scored."""
    out: dict[str, Any] = {}
    with httpx.Client(timeout=600.0, trust_env=False) as client:
        for mode in READ_MODES:
            started = time.monotonic()
            scored: list[dict[str, Any]] = []
            for row in rows.get(mode, [])[:limit]:
                scored.append(_read_one(client, row, questions[(row["sample_id"], row["q"])], reader, judge))
            seconds = time.monotonic() - started
            out[mode] = {
                **aggregate(scored),
                "seconds": round(seconds, 1),
                "samples": scored[:5],
            }
            log(f"reader on {mode}: F1 {out[mode]['overall'].get('f1')} over {len(scored)} questions, {seconds:.0f}s")
    return out


def _read_one(
    client: httpx.Client, row: dict[str, Any], asked: Question, reader: Endpoint, judge: Endpoint | None
) -> dict[str, Any]:
    question, gold = asked.question, asked.answer
    user = READER_USER.format(context=row.get("reader_context") or "(none)", question=question)
    answer = reader.chat(client, [{"role": "system", "content": READER_SYSTEM}, {"role": "user", "content": user}], 48)
    answer = answer.splitlines()[0].strip() if answer else ""
    scores = {"f1": answer_f1(answer, gold, row["category"])}
    if judge is not None:
        verdict = judge.chat(
            client, [{"role": "user", "content": JUDGE_PROMPT.format(question=question, gold=gold, answer=answer)}], 8
        )
        scores["J"] = 1.0 if verdict.strip().upper().startswith("CORRECT") else 0.0
    return {
        "q": row["q"],
        "category": row["category"],
        "question": question,
        "gold": gold,
        "answer": answer,
        "scores": scores,
    }


@dataclass
class _Options:
    """The eval's answer options (options.add_answer_arguments); a caller's Namespace without them (its own,
    not the parser's) gets budgeted recall and no reader: a reader is a long benchmark, started only when asked."""

    no_reader: bool = True
    reader_url: str | None = None
    reader_model: str | None = None  # own llama-server: this model, else `large`; an endpoint: its `model`
    reader_threads: int | None = None
    reader_budget: int = 512
    reader_limit: int | None = None
    judge_url: str | None = None
    judge_model: str | None = None

    @classmethod
    def of(cls, args: Any) -> _Options:
        return cls(**{name: getattr(args, name) for name in cls.__dataclass_fields__ if hasattr(args, name)})


def setup(args: Any, ready: dict[str, Any], log: Any = print) -> BudgetRun:
    """The run's budget and reader from the options: the tokenizer is --tokenizer-url, else the service's
    own model server (/ready); the reader --reader-url, else a llama-server of --reader-model started here
    when the answers are due (after extraction, so it never competes with it) and stopped after them."""
    url = getattr(args, "tokenizer_url", None) or (ready.get("model_server") or {}).get("url")
    if not url or "***" in url:
        return BudgetRun(None, note="no tokenizer: the service named no model server (give --tokenizer-url)")
    counter: TokenCounter | None = TokenCounter(url)
    why = counter.check() if counter is not None else None
    if why and counter is not None:
        counter.close()
        counter = None
    options = _Options.of(args)
    run = BudgetRun(counter, note=why, reader_budget=options.reader_budget)
    if options.no_reader:
        return run
    own = not options.reader_url
    reader = Endpoint(
        options.reader_url or "",
        f"{options.reader_model or 'large'}: own llama-server on this machine"
        if own
        else f"{options.reader_model or 'model'} at {options.reader_url}",
        None if own else options.reader_model,
    )
    judge = (
        Endpoint(options.judge_url, f"{options.judge_model or 'model'} at {options.judge_url}", options.judge_model)
        if options.judge_url
        else None
    )
    run.about = {
        "reader": reader.label,
        "judge": judge.label if judge else None,
        "reader_limit": options.reader_limit,
        "reader_prompt": [READER_SYSTEM, READER_USER],
        "judge_prompt": JUDGE_PROMPT if judge else None,
        "f1": "LoCoMo token F1 (normalised; multi-hop by comma parts; open-domain: gold before ';'), no stemming",
    }

    def answers(rows: dict[str, list[dict[str, Any]]], conversations: list[Conversation]) -> dict[str, Any]:
        questions = {(c.sample_id, q.index): q for c in conversations for q in c.questions}
        server = None
        try:
            if own:
                from ..testbed.service_runner import start_llama

                log(f"starting the reader: {options.reader_model or 'large'} on its own llama-server")
                server = start_llama(options.reader_model or "large", threads=options.reader_threads)
                reader.url = server.url
            return read_all(rows, questions, reader, judge, options.reader_limit, log)
        except Exception as exc:  # the recall figures stand without the answers: say why there are none
            log(f"reader failed: {type(exc).__name__}: {exc}")
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            if server is not None:
                server.stop()

    run.answers = answers
    return run
