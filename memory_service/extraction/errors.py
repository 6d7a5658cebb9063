"""One hierarchy for everything that can go wrong between us and the model."""

from __future__ import annotations


class ExtractionError(Exception):
    """An attempt failed; `raw_reply` keeps what the model said, for inspection."""

    retryable = True

    def __init__(
        self, message: str, *, raw_reply: str | None = None, timings: dict | None = None, report: dict | None = None
    ) -> None:
        super().__init__(message)
        self.raw_reply = raw_reply
        self.timings = timings
        self.report = report  # what the attempt got through before failing (chunks, rejected facts)


class LlmUnavailable(ExtractionError):
    """Could not connect, connection dropped, or the server answered 5xx."""


class LlmTimeout(ExtractionError):
    """The job's budget ran out before the model answered (the request was cancelled).

    `smallest_piece` (its tokens) is set when the piece could not be split further: only time helps then,
    so the worker waits for the machine to be less busy instead of spending an attempt.
    """

    def __init__(
        self,
        message: str,
        *,
        raw_reply: str | None = None,
        timings: dict | None = None,
        report: dict | None = None,
        smallest_piece: int | None = None,
    ) -> None:
        super().__init__(message, raw_reply=raw_reply, timings=timings, report=report)
        self.smallest_piece = smallest_piece


class ContextOverflow(ExtractionError):
    """The prompt did not fit the server's context even after sizing."""


class BadReply(ExtractionError):
    """The model answered, but not with valid facts JSON (tool-call text, prose, truncated JSON...)."""


class TruncatedReply(BadReply):
    """The reply was cut at the output cap; `facts` holds the complete items before the cut (maybe none)."""

    def __init__(self, message: str, *, facts: list[str], raw_reply: str | None = None) -> None:
        super().__init__(message, raw_reply=raw_reply)
        self.facts = facts


class LoopedReply(TruncatedReply):
    """The reply fell into a repetition loop and was stopped on the stream; `facts` holds the complete items
    before the loop. Not slowness, and not spent as an attempt while a smaller piece can be asked instead."""

    def __init__(self, message: str, *, facts: list[str], raw_reply: str | None = None, span: str = "") -> None:
        super().__init__(message, facts=facts, raw_reply=raw_reply)
        self.span = span


class CutBySpeed(LlmTimeout):
    """The reply was cut, before any complete fact, at an output cap lowered to what the measured speed writes
    within the budget: slowness like a timeout (the job waits, no attempt spent), not a bad reply.

    `sooner` is set when this very call measured a speed that now affords a larger cap (the machine got faster):
    the job resumes at once instead of waiting.
    """

    def __init__(self, message: str, *, cause: TruncatedReply, cap: int, smallest_piece: int, sooner: bool) -> None:
        super().__init__(
            message,
            raw_reply=cause.raw_reply,
            timings=cause.timings,
            report=cause.report,
            smallest_piece=smallest_piece,
        )
        self.cap = cap
        self.sooner = sooner


class TooSlow(ExtractionError):
    """A call ran out of time (or of output cap sized to the time) on a chunk that can still be split.

    Not an error of the model: the machine is slower than measured. The job is
    deferred without spending an attempt and resumes with smaller chunks.
    """

    def __init__(self, message: str, *, cause: ExtractionError, chunk_tokens: int) -> None:
        super().__init__(message, raw_reply=cause.raw_reply, timings=cause.timings, report=cause.report)
        self.chunk_tokens = chunk_tokens
