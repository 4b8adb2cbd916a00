"""Cron expressions (pure functions): five fields, or six with the seconds first (Quartz, Spring).

croniter does the calendar arithmetic (months, weekdays, DST in the schedule's
time zone); this module only decides how an expression is read.
"""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

MAX_TICKS_PER_ROUND = 1000  # a catch_up of "all" after long downtime goes on next round


def check(expression: str) -> str | None:
    """Why the expression is not a cron we take (None: it is)."""
    fields = expression.split()
    if len(fields) not in (5, 6):
        return (f"cron {expression!r} has {len(fields)} fields: give five (minute hour day month weekday)"
                " or six with the seconds first")
    if not croniter.is_valid(expression, second_at_beginning=len(fields) == 6):
        return f"cron {expression!r} is not a valid cron expression"
    return None


def check_timezone(name: str) -> str | None:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"timezone {name!r} is not an IANA time zone name (e.g. UTC, Europe/Paris)"
    return None


def _iterator(expression: str, zone: str, start: datetime) -> croniter:
    local = start.astimezone(ZoneInfo(zone))
    return croniter(expression, local, second_at_beginning=len(expression.split()) == 6)


def next_after(expression: str, zone: str, moment: datetime) -> datetime:
    """The first tick strictly after `moment`, in UTC."""
    tick = _iterator(expression, zone, moment).get_next(datetime)
    return tick.astimezone(timezone.utc)


def ticks_through(expression: str, zone: str, first: datetime, until: datetime,
                  limit: int = MAX_TICKS_PER_ROUND) -> list[datetime]:
    """`first` (a tick) and the ticks after it up to `until` inclusive, at most `limit`."""
    ticks: list[datetime] = []
    tick = first
    while tick <= until and len(ticks) < limit:
        ticks.append(tick)
        tick = next_after(expression, zone, tick)
    return ticks
