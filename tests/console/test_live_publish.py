"""Publishing status changes through the real Redis channel layer: what a tick's publish sends.

A tick changes thousands of jobs in one commit: the jobs group gets them in batches, and only
the job groups someone listens to are sent to.
"""

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings as django_settings
from django.utils import timezone
from redis import Redis

from jobs import broadcast

PREFIX = "sf-test-live-publish"


@pytest.fixture
def redis_layer(settings):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [django_settings.REDIS_URL], "prefix": PREFIX},
        }
    }
    # Not layer.flush(): it closes the connections of every event loop, live's sender included.
    clear_keys()
    yield get_channel_layer()
    clear_keys()


def clear_keys() -> None:
    redis = Redis.from_url(django_settings.REDIS_URL)
    if keys := redis.keys(f"{PREFIX}*"):
        redis.delete(*keys)


def statuses(n: int, team: int = 1) -> list[dict]:
    now = timezone.now()
    return [
        broadcast.status_message(i, team, "SUBMITTED", "PENDING", "launched", now) for i in range(n)
    ]


def test_the_jobs_group_gets_a_ticks_changes_in_batches_in_order(redis_layer, monkeypatch):
    async def scenario() -> list[dict]:
        channel = await redis_layer.new_channel()
        await redis_layer.group_add(broadcast.JOBS_GROUP, channel)
        await broadcast._group_send_all(redis_layer, sends)
        return [await redis_layer.receive(channel) for _ in range(3)]

    messages = statuses(broadcast.STATUS_BATCH * 2 + 1)
    captured: list = []
    monkeypatch.setattr(broadcast, "_send_on_commit", captured.append)
    broadcast.publish_statuses(messages)
    (sends,) = captured
    received = async_to_sync(scenario)()
    assert [m["type"] for m in received] == ["job.statuses"] * 3
    assert [s for m in received for s in m["statuses"]] == messages


def test_only_job_groups_with_a_member_are_sent_to(redis_layer):
    channel = async_to_sync(redis_layer.new_channel)()
    async_to_sync(redis_layer.group_add)(broadcast.job_group(7), channel)
    groups = {broadcast.job_group(i) for i in range(10)}
    assert async_to_sync(broadcast._listened)(redis_layer, groups) == {broadcast.job_group(7)}

    broadcast._send_now(
        [(broadcast.job_group(i), message) for i, message in enumerate(statuses(10))]
    )
    message = async_to_sync(redis_layer.receive)(channel)
    assert (message["type"], message["job"]) == ("job.status", 7)
