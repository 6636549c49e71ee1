"""Template filters of the console: times and durations as every page shows them.

`utc_time` is the one place that marks up a moment: a <time> element whose `datetime` is ISO
8601 and whose `title` (the hover) is the absolute UTC time; static/js/time.js turns its text
into a relative time ("3 min ago") and keeps it current. `elapsed` writes a duration as Slurm's
`sacct` Elapsed column does: "00:04:12", "1-02:03:04".
"""

import datetime as dt

from django import template
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html

register = template.Library()


def _moment(value) -> dt.datetime | None:
    if isinstance(value, str):
        value = parse_datetime(value)
    if not isinstance(value, dt.datetime):
        return None
    return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)


@register.filter
def utc(value) -> str:
    """A moment as text, "2026-12-03 08:00:00 UTC"; "" for None."""
    moment = _moment(value)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment else ""


@register.filter
def utc_time(value) -> str:
    """A moment as <time datetime="ISO" title="… UTC">… UTC</time>; "" for None."""
    moment = _moment(value)
    if moment is None:
        return ""
    text = utc(moment)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', moment.isoformat(timespec="seconds"), text, text
    )


@register.filter
def elapsed(seconds) -> str:
    """Seconds as [D-]HH:MM:SS, rounded down; "—" for None."""
    if seconds is None:
        return "—"
    left = max(0, int(seconds))
    days, left = divmod(left, 86400)
    hours, left = divmod(left, 3600)
    minutes, secs = divmod(left, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


@register.filter
def gpu_hours(gpu_seconds) -> str:
    """GPU-seconds as GPU-hours, "1.25"; three decimals under one hour, so that a short run
    does not read as nothing."""
    hours = float(gpu_seconds or 0) / 3600
    return f"{hours:.2f}" if hours >= 1 else f"{hours:.3f}"


@register.filter
def iso(value) -> str:
    """A moment as ISO 8601 in UTC to the millisecond (what JavaScript's Date parses); "" for
    None."""
    moment = _moment(value)
    return moment.isoformat(timespec="milliseconds") if moment else ""
