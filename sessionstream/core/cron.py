"""A small, pure cron evaluator: when a schedule fires next, in a time zone.

Standard five fields, `minute hour day-of-month month day-of-week`, each a `*`, a number, a
range `a-b`, any of those with a step `/n`, or a comma list of them; months and weekdays by
number or by their three-letter English names (`jan`..`dec`, `sun`..`sat`, any case);
weekday 0 and 7 are Sunday. As in Vixie cron, when both day fields are restricted (neither
starts with `*`) a day matches if either does; otherwise both must. Not supported: seconds,
years, `@hourly`-style nicknames, `L`, `W`, `#`, `?` (each is refused with a reason).

Wall-clock times are read in an IANA time zone (`zoneinfo`). Around a change of offset:

* a local time the change skips (02:30 when clocks jump from 02:00 to 03:00) fires once,
  the gap's length later by the wall clock (03:30; the instant the zone's old offset gives);
* a local time the change repeats (01:30 when clocks go back from 02:00 to 01:00) fires
  once, at its first occurrence; the repeated hour fires nothing again.

The answer depends only on the expression, the zone's rules and the instant: the same tz
database gives the same firing times on every replay (docs/protocol.md#schedules).
"""

from __future__ import annotations

import datetime as _dt
import zoneinfo
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from sessionstream.errors import SessionstreamError

__all__ = ["CronError", "CronExpr", "next_fire", "parse_cron", "zone"]

#: how many days ahead a search looks before it calls the expression one that never fires
#: (eight years: every weekday falls on every date of a leap day's cycle within them)
_HORIZON_DAYS: Final = 8 * 366

_MONTHS: Final = [
    "jan",
    "feb",
    "mar",
    "apr",
    "may",
    "jun",
    "jul",
    "aug",
    "sep",
    "oct",
    "nov",
    "dec",
]
_DAYS: Final = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]

_UTC: Final = _dt.UTC


class CronError(SessionstreamError, ValueError):
    """An expression or a time zone that cannot be used, with the reason."""


@dataclass(frozen=True)
class CronExpr:
    """A parsed expression: the allowed values of each field."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6 = Saturday
    #: both day fields restricted: a day matches if either does (Vixie cron's rule)
    either_day: bool

    def day_matches(self, d: _dt.date) -> bool:
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        return (dom or dow) if self.either_day else (dom and dow)


def _value(word: str, lo: int, hi: int, names: list[str] | None, what: str) -> int:
    w = word.lower()
    if names is not None and w in names:
        return names.index(w) + (1 if what == "month" else 0)
    if not w.isdigit() or len(w) > 4:
        raise CronError(f"{what} field: {word!r} is not a number" + (" or a name" if names else ""))
    v = int(w)
    if not lo <= v <= hi:
        raise CronError(f"{what} field: {v} is outside {lo}-{hi}")
    return v


def _field(text: str, lo: int, hi: int, what: str, names: list[str] | None = None) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{what} field: an empty item in {text!r}")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or len(step_text) > 4 or int(step_text) == 0:
                raise CronError(f"{what} field: step {step_text!r} is not a positive number")
            step = int(step_text)
        if base == "*":
            start, end = lo, hi
        elif "-" in base:
            a, _, b = base.partition("-")
            start, end = _value(a, lo, hi, names, what), _value(b, lo, hi, names, what)
            if start > end:
                raise CronError(f"{what} field: range {base!r} runs backwards")
        else:
            start = _value(base, lo, hi, names, what)
            end = hi if slash else start
        out.update(range(start, end + 1, step))
    return out


def parse_cron(text: str) -> CronExpr:
    """The expression, or `CronError` saying what is wrong with it."""
    if len(text) > 200:
        raise CronError("a cron expression is at most 200 characters")
    fields = text.split()
    if text.strip().startswith("@"):
        raise CronError(f"{text.strip()!r}: nicknames are not supported, write the five fields")
    if len(fields) != 5:
        raise CronError(
            f"{len(fields)} fields: a cron expression has five "
            "(minute hour day-of-month month day-of-week)"
        )
    for f in fields:
        for ch in f:
            if not (ch.isascii() and (ch.isalnum() or ch in "*,-/")):
                raise CronError(f"{f!r}: {ch!r} is not supported (numbers, names, * , - / only)")
    minute, hour, dom, month, dow = fields
    weekdays = _field(dow, 0, 7, "day-of-week", _DAYS)
    if 7 in weekdays:
        weekdays = (weekdays - {7}) | {0}
    expr = CronExpr(
        text=" ".join(fields),
        minutes=tuple(sorted(_field(minute, 0, 59, "minute"))),
        hours=tuple(sorted(_field(hour, 0, 23, "hour"))),
        days=frozenset(_field(dom, 1, 31, "day-of-month")),
        months=frozenset(_field(month, 1, 12, "month", _MONTHS)),
        weekdays=frozenset(weekdays),
        either_day=not dom.startswith("*") and not dow.startswith("*"),
    )
    if not any(
        expr.day_matches(_dt.date(2024, 1, 1) + _dt.timedelta(days=i)) for i in range(_HORIZON_DAYS)
    ):
        raise CronError(f"{expr.text!r} names no day that exists (e.g. 30 February)")
    return expr


@lru_cache(maxsize=256)
def zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone `name` from the tz database, or `CronError` if there is none."""
    if not name or len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
        raise CronError(f"unknown time zone {name!r}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as e:
        raise CronError(f"unknown time zone {name!r}") from e


def _instant(wall: _dt.datetime, tz: zoneinfo.ZoneInfo) -> int:
    """Epoch ms of a wall time in `tz`: the first occurrence of a repeated time, the old
    offset's reading of a skipped one (fold=0, PEP 495)."""
    return int(wall.replace(tzinfo=tz, fold=0).timestamp()) * 1000


def next_fire(expr: CronExpr, tz_name: str, after_ms: int) -> int | None:
    """The first firing strictly after `after_ms` (epoch ms), at a whole minute; None if
    there is none within the search horizon (an expression `parse_cron` accepted always has
    one)."""
    tz = zone(tz_name)
    local = _dt.datetime.fromtimestamp(after_ms // 1000, _UTC).astimezone(tz)
    start = local.replace(tzinfo=None, second=0, microsecond=0, fold=0)
    day = start.date()
    for _ in range(_HORIZON_DAYS):
        if expr.day_matches(day):
            for h in expr.hours:
                for m in expr.minutes:
                    wall = _dt.datetime(day.year, day.month, day.day, h, m)
                    if wall < start:
                        continue
                    at = _instant(wall, tz)
                    if at > after_ms:
                        return at
        day += _dt.timedelta(days=1)
    return None
