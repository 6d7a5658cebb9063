"""The command line's one error handler: what went wrong, in a sentence that names the URL, file or flag, and
what to do; the exit codes every command shares.

A traceback helps the person who wrote the code, not the one who typed the command: `main` catches what a
command lets through, prints `explain`'s message on stderr and exits with its code; `--debug` prints the
traceback first. Kept light (httpx, argparse): every command imports it.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import httpx

from ..config import ConfigError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

EXIT_CODES = """exit codes:
  0    done
  1    failed: the service answered an error, could not be reached, a file could not be read or written,
       or an import had lines that failed (even some)
  2    usage or configuration error: a bad flag or value, a bad MEMORY_* variable
  130  interrupted (Ctrl-C)
  `limits` speaks to scripts: 0 ok / allowed / first time, 1 denied / already handled / not found,
  2 any other error (see `memory-service limits handled --help` for --check)

--json (before or after the command) prints machine-readable JSON on stdout; errors always go to stderr.
--debug shows the traceback behind an error."""

START_HINT = "start it (`./scripts/serve.sh` or `memory-service serve`), or pass --url (env MEMORY_URL)"

# what a person can do about an HTTP error, by status
HINTS = {
    401: "pass --api-key (env MEMORY_API_KEY); an admin makes keys with `memory-service keys create`",
    403: "this key's role does not allow it: use a key with the role the command needs (`memory-service keys list`)",
    429: "a limit was reached: wait, or raise it with `memory-service limits set`",
    503: "the service is not ready yet: see `curl <url>/ready`, or try again shortly",
}
# a 403 for a key pinned to an agent is about that agent, not the key's role
PINNED = "is pinned to agent_id"
PINNED_HINT = (
    "a key pinned to an agent sees and changes only that agent's memories: leave out --agent-id (it is "
    "implied), or use a key not pinned to an agent"
)


class CommandFailed(Exception):
    """A failure the command has put into words; `main` prints `message` on stderr and exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message, self.code = message, code


class ServiceAnswered(CommandFailed):
    """The service answered with an HTTP error: its `detail` is the message, with a hint for the common ones."""

    def __init__(self, response: httpx.Response) -> None:
        self.response, self.body = response, _body(response)
        detail = self.body.get("detail") if isinstance(self.body, dict) else None
        status = f"{response.status_code} {response.reason_phrase}".strip()
        if isinstance(detail, str):  # the CLI's flags carry the query parameters' names: name the flag
            detail = re.sub(r"\bquery\.([a-z_]+)", lambda m: "--" + m.group(1).replace("_", "-"), detail)
        message = f"the service answered {status}: {detail or response.text.strip()[:300] or '(no detail)'}"
        pinned = response.status_code == 403 and isinstance(detail, str) and PINNED in detail
        hint = PINNED_HINT if pinned else HINTS.get(response.status_code)
        super().__init__(f"{message}\n  {hint}" if hint else message)


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"error": response.reason_phrase, "detail": response.text}


def checked(response: httpx.Response) -> httpx.Response:
    """The response when it is not an HTTP error; `ServiceAnswered` otherwise (read it first if streamed)."""
    if response.status_code >= 400:
        response.read()
        raise ServiceAnswered(response)
    return response


def explain(exc: BaseException, args: argparse.Namespace) -> tuple[str, int] | None:
    """The message and exit code for an error a command let through; None for one no person caused (a bug),
    which keeps its traceback."""
    url = getattr(args, "url", None)
    if isinstance(exc, CommandFailed):
        return exc.message, exc.code
    if isinstance(exc, ConfigError):
        return f"configuration error: {exc}", EXIT_USAGE
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return f"--url {url!r} is not a service URL: give one such as http://127.0.0.1:8700 ({exc})", EXIT_USAGE
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return f"cannot reach the memory service at {url} ({_reason(exc)})\n  {START_HINT}", EXIT_FAILED
    if isinstance(exc, httpx.TimeoutException):
        return f"the memory service at {url} did not answer in time ({_reason(exc)})", EXIT_FAILED
    if isinstance(exc, httpx.TransportError):
        return f"the connection to the memory service at {url} failed ({_reason(exc)})", EXIT_FAILED
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"cannot open {exc.filename}: {exc.strerror or exc}", EXIT_FAILED
    return None


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
