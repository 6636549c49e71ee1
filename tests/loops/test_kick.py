"""The scheduler kick, coalesced through a real Redis: a burst of kicks sends one tick at once and
then one trailing tick per pace, every kick still has a tick that starts after it, and the
window follows what a tick costs. Beat's ticks go through the same window: alone they run, under
a stream of kicks they add none."""

import time

import pytest
from celery import current_app

from jobs import kick
from jobs.redis_client import client


@pytest.fixture
def sent(settings, monkeypatch):
    """The ticks the kicks send, as (seconds after the first kick, countdown), with the kick's
    keys cleared before and after in the tests' Redis database."""
    conn = client(settings.REDIS_URL)
    keys = (kick.LEAD_KEY, kick.TRAIL_KEY, kick.PACE_KEY)
    conn.delete(*keys)
    ticks: list[tuple[float, float | None]] = []
    start = time.monotonic()

    def send_task(name, retry=True, countdown=None):
        assert name == kick.SCHEDULE_TICK
        ticks.append((time.monotonic() - start, countdown))

    monkeypatch.setattr(current_app, "send_task", send_task)
    yield ticks
    conn.delete(*keys)


def trail_s(pace_ms: int) -> float:
    return pace_ms / 1000 + kick.TRAIL_MARGIN_S


def countdowns(sent: list, pace_ms: int) -> list:
    """The ticks' countdowns, "trail" for one a pace after the first kick: it runs when the lead
    key would have expired, a few milliseconds short of the pace after that kick."""
    late = trail_s(pace_ms)
    return [c if c is None or not late - 0.05 <= c <= late else "trail" for _, c in sent]


def test_a_burst_of_kicks_sends_one_tick_now_and_one_trailing_tick(sent):
    for _ in range(100):
        kick.scheduler()
    assert countdowns(sent, kick.MIN_PACE_MS) == [None, "trail"]


def kick_for(seconds: float, sent: list) -> list[float]:
    """Kick every 10 ms for `seconds`; check each kick has a tick starting after it within the
    pace and the margin; the kicks' times."""
    kicks = []
    deadline = time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < deadline:
        kicks.append(time.monotonic() - start)
        kick.scheduler()
        time.sleep(0.01)
    return kicks


def lateness(kicks: list[float], sent: list) -> tuple[list, float]:
    """Kicks no tick starts after, and the longest wait of a kick for the next tick's start."""
    starts = sorted(at + (countdown or 0.0) for at, countdown in sent)
    uncovered = [at for at in kicks if not any(s >= at for s in starts)]
    waits = [min(s for s in starts if s >= at) - at for at in kicks if at not in uncovered]
    return uncovered, max(waits)


def test_every_kick_has_a_tick_that_starts_after_it(sent):
    kicks = kick_for(1.2, sent)
    uncovered, longest = lateness(kicks, sent)
    assert uncovered == [] and longest <= trail_s(kick.MIN_PACE_MS) + 0.05
    # ~100 kicks in 1.2 s: one tick at once, then one trailing tick per pace of 500 ms (at 0.5,
    # 1.0 and 1.5 s), not one at once and one trailing per pace (six).
    assert 3 <= len(sent) <= 4, sent
    assert [countdown is None for _, countdown in sent].count(True) == 1, sent


def test_a_slow_tick_widens_the_window_and_every_kick_is_still_covered(sent):
    kick.record_tick(0.05)  # a 50 ms tick: a pace of 1 s
    kicks = kick_for(2.1, sent)
    uncovered, longest = lateness(kicks, sent)
    assert uncovered == [] and longest <= trail_s(1000) + 0.05
    assert countdowns(sent, 1000)[:2] == [None, "trail"]
    # ~200 kicks in 2.1 s: one tick at once, then one a second (at 1, 2 and 3 s)
    assert 3 <= len(sent) <= 4, sent


@pytest.mark.parametrize(
    ("tick_s", "pace_ms"),
    [(0.001, kick.MIN_PACE_MS), (0.04, 800), (0.5, kick.MAX_PACE_MS), (30, kick.MAX_PACE_MS)],
)
def test_the_pace_is_twenty_ticks_long_within_its_bounds(sent, settings, tick_s, pace_ms):
    kick.record_tick(tick_s)
    assert int(client(settings.REDIS_URL).get(kick.PACE_KEY)) == pace_ms
    kick.scheduler()
    kick.scheduler()
    assert countdowns(sent, pace_ms) == [None, "trail"]


def test_a_kick_after_a_quiet_spell_is_sent_at_once(sent):
    kick.scheduler()
    time.sleep((kick.MIN_PACE_MS + 50) / 1000)
    kick.scheduler()
    assert [countdown for _, countdown in sent] == [None, None]


def test_beats_tick_runs_after_a_quiet_spell_and_is_covered_within_the_pace(sent):
    assert kick.beat_tick_due() and sent == []  # nothing ticked lately: it runs
    kick.scheduler()  # a submit right after: the trailing tick starts after it
    assert countdowns(sent, kick.MIN_PACE_MS) == ["trail"]
    assert not kick.beat_tick_due()  # beat's next tick, within the pace: that tick covers it
    assert len(sent) == 1
    time.sleep(trail_s(kick.MIN_PACE_MS) + kick.MIN_PACE_MS / 1000)
    assert kick.beat_tick_due()


def test_under_a_stream_of_kicks_beats_ticks_add_none(sent):
    beats: list[float] = []
    start = time.monotonic()
    kicks = []
    while time.monotonic() < start + 1.2:
        now = time.monotonic() - start
        if not beats or now - beats[-1] >= 0.3:  # beat, faster than the pace
            beats.append(now)
            if kick.beat_tick_due():
                sent.append((now, None))  # it runs in place
        kicks.append(now)
        kick.scheduler()
        time.sleep(0.01)
    uncovered, longest = lateness(kicks + beats, sent)
    assert uncovered == [] and longest <= trail_s(kick.MIN_PACE_MS) + 0.05
    # One tick at once (beat's), then one per pace of 500 ms, as for the kicks alone: not
    # another for each of beat's four.
    assert 3 <= len(sent) <= 4, sent


def test_without_redis_a_kick_is_only_a_warning(settings, monkeypatch, caplog):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    monkeypatch.setattr(current_app, "send_task", lambda *a, **k: pytest.fail("sent"))
    kick.scheduler()
    assert "beat's next tick will admit the job" in caplog.text
    kick.record_tick(0.1)
    assert "could not record the scheduler's pace" in caplog.text
    assert kick.beat_tick_due()  # beat's tick runs without the window
    assert "could not coalesce beat's tick with the kicks" in caplog.text
