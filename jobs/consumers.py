"""Websocket consumers for console pages. They only subscribe and forward (STYLE.md rule 7):
payloads are built by `jobs.live` where the events are written.
"""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from jobs import live, services
from jobs.models import Membership

# Application close codes (4000-4999). The socket is accepted before closing with them: a
# handshake refused outright reaches the browser as a bare 1006, and a page could not tell
# "sign in again" or "not yours" from a network blip worth reconnecting after.
CLOSE_SIGNED_OUT = 4401
CLOSE_NOT_FOUND = 4404


class JobConsumer(AsyncJsonWebsocketConsumer):
    """`ws/jobs/<id>/`: a job page's log batches and status changes.

    Also in the user's group: when their memberships change it checks the job again and
    closes with 4404 once they may no longer see it.
    """

    groups_joined: tuple[str, ...] = ()

    async def connect(self) -> None:
        user = self.scope.get("user")
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_SIGNED_OUT)
        elif not await _can_see(user, job_id):
            await self.close(code=CLOSE_NOT_FOUND)
        else:
            self.groups_joined = (live.job_group(job_id), live.user_group(user.pk))
            for group in self.groups_joined:
                await self.channel_layer.group_add(group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        await _leave(self, self.groups_joined)
        self.groups_joined = ()

    async def membership_changed(self, message: dict) -> None:
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        if not await _can_see(self.scope["user"], job_id):
            await _leave(self, self.groups_joined)
            self.groups_joined = ()
            await self.close(code=CLOSE_NOT_FOUND)

    async def job_lines(self, message: dict) -> None:
        await self.send_json(message)

    async def job_metrics(self, message: dict) -> None:
        await self.send_json(message)

    async def job_status(self, message: dict) -> None:
        await self.send_json(message)


class JobListConsumer(AsyncJsonWebsocketConsumer):
    """`ws/jobs/`: status changes of the jobs of the user's teams (every job for staff)."""

    teams: frozenset[int] | None = frozenset()  # None: all teams
    groups_joined: tuple[str, ...] = ()

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_SIGNED_OUT)
            return
        self.teams = None if user.is_staff else await _team_ids(user)
        self.groups_joined = (live.JOBS_GROUP, live.user_group(user.pk))
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        await _leave(self, self.groups_joined)

    async def membership_changed(self, message: dict) -> None:
        user = self.scope["user"]
        self.teams = None if user.is_staff else await _team_ids(user)

    async def job_statuses(self, message: dict) -> None:
        for status in message["statuses"]:
            if self.teams is None or status["team"] in self.teams:
                await self.send_json(status)


async def _leave(consumer: AsyncJsonWebsocketConsumer, groups: tuple[str, ...]) -> None:
    for group in groups:
        await consumer.channel_layer.group_discard(group, consumer.channel_name)


@database_sync_to_async
def _can_see(user, job_id: int) -> bool:
    return services.visible_jobs(user).filter(pk=job_id).exists()


@database_sync_to_async
def _team_ids(user) -> frozenset[int]:
    return frozenset(Membership.objects.filter(user=user).values_list("team_id", flat=True))
