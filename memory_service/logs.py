"""Log output of `serve`: plain text for a terminal, or one JSON object per line for a log pipeline.

Every record logged while a request is handled carries that request's id (the one returned in
`X-Request-ID`), so a line can be matched to the answer a caller quotes. The id travels in a
contextvar, which asyncio tasks and the threads that `to_thread` and the threadpool run inherit.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "memory_service.access"

# what every LogRecord has; anything else on a record was passed as `extra` and goes into the JSON
# (but uvicorn's `color_message`, the message again with terminal colours)
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "request_id",
    "color_message",
}


class RequestIdFilter(logging.Filter):
    """Stamps the current request's id on each record (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, request id, extras, exception."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            body["request_id"] = request_id
        body.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            body["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            body["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(body, default=str, ensure_ascii=False)


def configure(log_format: Literal["text", "json"], level: str = "INFO") -> None:
    """Route every logger through one stderr handler in the chosen format (replaces earlier set-up)."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
