"""The scheduler kick, coalesced through a real Redis: a burst of kicks sends one tick at once and
one trailing tick, and every kick still has a tick that starts after it."""

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
    conn.delete(kick.LEAD_KEY, kick.TRAIL_KEY)
    ticks: list[tuple[float, float | None]] = []
    start = time.monotonic()

    def send_task(name, retry=True, countdown=None):
        assert name == kick.SCHEDULE_TICK
        ticks.append((time.monotonic() - start, countdown))

    monkeypatch.setattr(current_app, "send_task", send_task)
    yield ticks
    conn.delete(kick.LEAD_KEY, kick.TRAIL_KEY)


def test_a_burst_of_kicks_sends_one_tick_now_and_one_trailing_tick(sent):
    for _ in range(100):
        kick.scheduler()
    assert [countdown for _, countdown in sent] == [None, kick.TRAIL_S]


def test_every_kick_has_a_tick_that_starts_after_it(sent):
    kicks = []
    deadline = time.monotonic() + 1.2
    start = time.monotonic()
    while time.monotonic() < deadline:
        kicks.append(time.monotonic() - start)
        kick.scheduler()
        time.sleep(0.01)
    starts = sorted(at + (countdown or 0.0) for at, countdown in sent)
    uncovered = [at for at in kicks if not any(s >= at for s in starts)]
    late = [at for at in kicks if min(s for s in starts if s >= at) - at > kick.TRAIL_S + 0.05]
    assert (uncovered, late) == ([], [])
    # ~100 kicks in 1.2 s: one tick at once per LEAD_MS and one trailing per TRAIL_KEY_MS.
    assert 3 <= len(sent) <= 8, sent


def test_a_kick_after_a_quiet_spell_is_sent_at_once(sent):
    kick.scheduler()
    time.sleep((kick.LEAD_MS + 50) / 1000)
    kick.scheduler()
    assert [countdown for _, countdown in sent] == [None, None]


def test_without_redis_a_kick_is_only_a_warning(settings, monkeypatch, caplog):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    monkeypatch.setattr(current_app, "send_task", lambda *a, **k: pytest.fail("sent"))
    kick.scheduler()
    assert "beat's next tick will admit the job" in caplog.text
