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
    """`ws/jobs/<id>/`: a job page's log batches and status changes."""

    group = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_SIGNED_OUT)
        elif not await _can_see(user, job_id):
            await self.close(code=CLOSE_NOT_FOUND)
        else:
            self.group = live.job_group(job_id)
            await self.channel_layer.group_add(self.group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def job_lines(self, message: dict) -> None:
        await self.send_json(message)

    async def job_metrics(self, message: dict) -> None:
        await self.send_json(message)

    async def job_status(self, message: dict) -> None:
        await self.send_json(message)


class JobListConsumer(AsyncJsonWebsocketConsumer):
    """`ws/jobs/`: status changes of the jobs of the user's teams (every job for staff)."""

    teams: frozenset[int] | None = frozenset()  # None: all teams
    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_SIGNED_OUT)
            return
        self.teams = None if user.is_staff else await _team_ids(user)
        await self.channel_layer.group_add(live.JOBS_GROUP, self.channel_name)
        self.joined = True

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(live.JOBS_GROUP, self.channel_name)

    async def job_status(self, message: dict) -> None:
        if self.teams is None or message["team"] in self.teams:
            await self.send_json(message)


@database_sync_to_async
def _can_see(user, job_id: int) -> bool:
    return services.visible_jobs(user).filter(pk=job_id).exists()


@database_sync_to_async
def _team_ids(user) -> frozenset[int]:
    return frozenset(Membership.objects.filter(user=user).values_list("team_id", flat=True))
