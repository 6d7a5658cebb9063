"""The clock arithmetic of daily limits: microsecond timestamps and local days in a limit's timezone.

Counters are bucketed by the local date in the limit's own timezone, so "today" and "the next reset" must
follow that zone's DST changes exactly; timestamps are stored as integer microseconds since the epoch so both
SQL engines compare them exactly.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)


def utc_now() -> datetime:
    return datetime.now(UTC)


def to_us(moment: datetime) -> int:
    """An aware datetime as integer microseconds since the epoch (the stored form)."""
    return (moment - EPOCH) // ONE_US


def iso(us: int) -> str:
    """A stored microsecond timestamp as the ISO string the API shows."""
    return (EPOCH + timedelta(microseconds=us)).isoformat()


def local_day(moment: datetime, zone: ZoneInfo) -> date:
    return moment.astimezone(zone).date()


def next_midnight(day: date, zone: ZoneInfo) -> datetime:
    """First instant of the day after `day`, in `zone`, with its real offset.

    fold=0 maps a midnight skipped by DST to the transition instant (the new
    day's first moment) and a repeated midnight to its first occurrence.
    """
    wall = datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone)
    return wall.astimezone(UTC).astimezone(zone)
