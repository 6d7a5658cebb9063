"""What a limit name, zone, agent id, amount or handled key may be: the documented bounds and their checks.

The API's request models quote the same constants (one rule, stated once); the store checks again so a
direct caller (the CLI, a test) cannot write what the API would refuse.
"""

from __future__ import annotations

import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .ids import ID_RULE, MAX_ID_LEN, is_id

# Documented input bounds (README and OpenAPI quote these).
MAX_NAME_LEN = 128
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_DAILY_LIMIT = 10**9
MAX_AGENT_ID_LEN = MAX_ID_LEN
MAX_IDEMPOTENCY_KEY_LEN = 256
MAX_HANDLED_KEY_LEN = 2048
MAX_TTL_DAYS = 3650
MAX_HISTORY_DAYS = 366
MAX_AGENTS_SHOWN = 1000
_NAME_RE = re.compile(NAME_PATTERN)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

NAME_RULE = "1-128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit, without '..'"


class LimitError(Exception):
    """Base for errors the API maps to a 4xx."""


class InvalidInput(LimitError, ValueError):
    """A value is outside the documented bounds; nothing was changed."""


class LimitNotFound(LimitError, LookupError):
    """The team has no limit of that name."""


class IdempotencyConflict(LimitError):
    """An idempotency key was reused today with a different agent or amount."""


class ReservationNotFound(LimitError, LookupError):
    """No live reservation of that id in the caller's team (never made, finished or released already)."""


class ReservationConflict(LimitError):
    """A reservation whose lease ran out cannot be finished: another caller holds or finished its key."""


# ---------------------------------------------------------------- validation


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise InvalidInput(f"invalid limit name {str(name)[:40]!r}: use {NAME_RULE}")
    return name


# Files in the system zoneinfo directory that are not portable zone names:
# the host's own zone, and the leap-second ("right/") and duplicate trees.
_NOT_ZONES = ("localtime", "posixrules")
_NOT_ZONE_PREFIXES = ("/", ".", "posix/", "right/")


def check_timezone(tz: str) -> ZoneInfo:
    if (
        not isinstance(tz, str)
        or not 1 <= len(tz) <= 64
        or tz in _NOT_ZONES
        or tz.startswith(_NOT_ZONE_PREFIXES)
        or ".." in tz
    ):
        raise InvalidInput(f"unknown timezone {str(tz)[:64]!r}: use an IANA name such as Europe/Madrid")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(f"unknown timezone {tz!r}: use an IANA name such as Europe/Madrid") from None


def check_text(value: str, what: str, max_len: int) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= max_len:
        raise InvalidInput(f"{what} must be 1-{max_len} characters")
    if _CONTROL_RE.search(value):
        raise InvalidInput(f"{what} must not contain control characters")
    return value


def check_agent_id(value: str) -> str:
    """The API's own id rule, so a direct caller of the store cannot write ids the API would refuse."""
    if not is_id(value):
        raise InvalidInput(f"agent_id must be {ID_RULE}")
    return value


def check_int(value: int, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{what} must be an integer from {low} to {high}")
    return value
