"""Weekly schedule windows: parse ``mon-fri 20:00-08:00, sat-sun`` and answer open/next-opening.

An item is a day or day range, optionally followed by a time range; no time range means the
whole day. A time range that ends before it starts runs overnight into the next day.
"""

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
_WEEK = 7 * 24 * 60


class WindowSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Window:
    name: str
    tz: ZoneInfo
    # (start, end) in minutes from Monday 00:00 local time; end may pass the week's end.
    spans: tuple[tuple[int, int], ...]

    def is_open(self, at: dt.datetime) -> bool:
        minute = _week_minute(at.astimezone(self.tz))
        return any(s <= m < e for s, e in self.spans for m in (minute, minute + _WEEK))

    def next_opening(self, at: dt.datetime) -> dt.datetime:
        local = at.astimezone(self.tz)
        minute = _week_minute(local)
        ahead = min((s - minute) % _WEEK for s, _ in self.spans)
        opening = local.replace(second=0, microsecond=0) + dt.timedelta(minutes=ahead)
        return opening.astimezone(self.tz)

    def describe_wait(self, at: dt.datetime) -> str:
        opens = self.next_opening(at)
        return f"waiting for window {self.name} (opens {opens:%a %H:%M} {opens.tzname()})"


def parse_window(spec: str, timezone: str = "UTC", name: str = "window") -> Window:
    try:
        tz = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise WindowSpecError(f"unknown time zone {timezone!r}") from exc
    spans: list[tuple[int, int]] = []
    for item in (part.strip().lower() for part in spec.split(",")):
        if not item:
            continue
        days_part, _, time_part = item.partition(" ")
        start, end = _parse_times(time_part.strip(), item)
        for day in _parse_days(days_part, item):
            spans.append((day * 1440 + start, day * 1440 + end))
    if not spans:
        raise WindowSpecError("a window needs at least one item, e.g. 'mon-fri 20:00-08:00'")
    return Window(name, tz, tuple(spans))


def _parse_days(text: str, item: str) -> list[int]:
    first, _, last = text.partition("-")
    if first not in DAYS or (last and last not in DAYS):
        raise WindowSpecError(f"{item!r}: days are mon..sun, e.g. 'mon-fri'")
    a, b = DAYS.index(first), DAYS.index(last or first)
    return [d % 7 for d in range(a, b + 1 if b >= a else b + 8)]


def _parse_times(text: str, item: str) -> tuple[int, int]:
    if not text:
        return 0, 1440
    try:
        start_s, end_s = text.split("-")
        start, end = _minutes(start_s), _minutes(end_s)
    except ValueError as exc:
        raise WindowSpecError(f"{item!r}: times look like 20:00-08:00") from exc
    if start == end:
        raise WindowSpecError(f"{item!r}: a window cannot start and end at the same time")
    return start, end if end > start else end + 1440


def _minutes(hhmm: str) -> int:
    hours, minutes = hhmm.strip().split(":")
    value = int(hours) * 60 + int(minutes)
    if not (0 <= int(minutes) < 60 and 0 <= value <= 1440):
        raise ValueError(hhmm)
    return value


def _week_minute(local: dt.datetime) -> int:
    return local.weekday() * 1440 + local.hour * 60 + local.minute
