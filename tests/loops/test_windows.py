"""Schedule windows: parsing, open/closed across midnight and the week's end, next opening."""

import datetime as dt

import pytest

from jobs.windows import WindowSpecError, parse_window

UTC = dt.UTC


def at(day: int, hour: int, minute: int = 0) -> dt.datetime:
    """Day 0 is Monday 2026-11-30."""
    return dt.datetime(2026, 11, 30, hour, minute, tzinfo=UTC) + dt.timedelta(days=day)


NIGHTS = parse_window("mon-fri 20:00-08:00, sat-sun", "UTC", "nights")


@pytest.mark.parametrize(
    ("when", "is_open"),
    [
        (at(0, 12), False),
        (at(0, 20), True),
        (at(1, 7, 59), True),
        (at(1, 8), False),
        (at(4, 23), True),
        (at(5, 12), True),
        (at(6, 23, 59), True),
    ],
)
def test_overnight_window_is_open_exactly_when_promised(when, is_open):
    assert NIGHTS.is_open(when) is is_open


def test_friday_night_runs_into_the_weekend_and_sunday_wraps_to_monday_morning():
    sunday_only = parse_window("sun 22:00-06:00")
    assert sunday_only.is_open(at(7, 5))  # next Monday 05:00, across the week boundary
    assert not sunday_only.is_open(at(7, 6))


def test_next_opening_is_reported_in_the_window_time_zone():
    berlin = parse_window("mon-fri 20:00-08:00", "Europe/Berlin", "nights")
    assert berlin.describe_wait(at(0, 12)) == "waiting for window nights (opens Mon 20:00 CET)"


@pytest.mark.parametrize(
    "spec", ["", "funday", "mon 25:00-26:00", "mon 10:00-10:00", "mon 10-12", "mon-xyz"]
)
def test_bad_specs_are_refused_with_a_sentence(spec):
    with pytest.raises(WindowSpecError):
        parse_window(spec)


def test_unknown_time_zone_is_refused():
    with pytest.raises(WindowSpecError, match="time zone"):
        parse_window("mon", "Mars/Olympus")
