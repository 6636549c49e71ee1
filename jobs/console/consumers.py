"""Websocket consumers for console pages. They only subscribe and forward (STYLE.md rule 7):
payloads are built by `jobs.broadcast` where the events are written.

A stream lasts only as long as the right to read it. Both consumers are in their user's group,
where `jobs.signals` says after commit that a membership, the user or a session changed, and
they check again at once; and every `SF_WS_RECHECK_S` seconds they check anyway, for what no
signal sees (a row deleted in SQL, a session that expired or was deleted).
"""

import asyncio
import logging
import random
from importlib import import_module

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, load_backend
from django.contrib.auth.models import User
from django.utils.crypto import constant_time_compare

from jobs import broadcast
from jobs.models import Membership
from jobs.reads.visible import visible_jobs

log = logging.getLogger(__name__)

# Application close codes (4000-4999). The socket is accepted before closing with them: a
# handshake refused outright reaches the browser as a bare 1006, and a page could not tell
# "sign in again" or "not yours" from a network blip worth reconnecting after.
CLOSE_SIGNED_OUT = 4401
CLOSE_NOT_FOUND = 4404
RECHECK_S = 5.0  # unless settings.SF_WS_RECHECK_S says otherwise


class _AuthorisedStream(AsyncJsonWebsocketConsumer):
    """What both streams share: signed in to open, and closed once that no longer holds."""

    groups_joined: tuple[str, ...] = ()
    user_id: int | None = None
    session: str = ""  # broadcast.session_digest of the session that opened it
    recheck_task: asyncio.Task | None = None
    closed: bool = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_SIGNED_OUT)
        elif code := await database_sync_to_async(self.refusal)(user):
            await self.close(code=code)
        else:
            self.user_id = user.pk
            self.session = broadcast.session_digest(self.scope["session"].session_key)
            self.groups_joined = (*self.streamed_groups(), broadcast.user_group(user.pk))
            for group in self.groups_joined:
                await self.channel_layer.group_add(group, self.channel_name)
            seconds = float(getattr(settings, "SF_WS_RECHECK_S", RECHECK_S))
            self.recheck_task = asyncio.create_task(self.recheck_every(seconds))

    async def disconnect(self, code: int) -> None:
        self.closed = True
        if self.recheck_task is not None and self.recheck_task is not asyncio.current_task():
            self.recheck_task.cancel()
        await _leave(self, self.groups_joined)
        self.groups_joined = ()

    def refusal(self, user: User) -> int | None:
        """The close code if this user may not have this stream (now), else None. Reads the
        database: called in its thread."""
        raise NotImplementedError

    def streamed_groups(self) -> tuple[str, ...]:
        raise NotImplementedError

    async def membership_changed(self, message: dict) -> None:
        await self.recheck()

    async def user_changed(self, message: dict) -> None:
        await self.recheck()

    async def session_ended(self, message: dict) -> None:
        # Matched by session, not by a fresh read: the sign-out deletes it just after sending.
        if message["session"] == self.session:
            await self.end(CLOSE_SIGNED_OUT)

    async def recheck(self) -> None:
        if code := await database_sync_to_async(self.refusal_now)():
            await self.end(code)

    def refusal_now(self) -> int | None:
        """`refusal` for the session's user as the next request would see it: one trip to the
        database thread, shared with every request of the process."""
        user = _signed_in_user(self.scope["session"].session_key)
        if user is None or user.pk != self.user_id:
            return CLOSE_SIGNED_OUT
        return self.refusal(user)

    async def recheck_every(self, seconds: float) -> None:
        while not self.closed:
            # Spread: the pages that reconnected together after a restart check apart.
            await asyncio.sleep(seconds * random.uniform(0.8, 1.2))
            try:
                await self.recheck()
            except Exception:  # the database away for a moment: try again next round
                log.exception("websocket re-check failed; trying again in %s s", seconds)

    async def end(self, code: int) -> None:
        if self.closed:
            return
        await self.disconnect(code)
        await self.close(code=code)


class JobConsumer(_AuthorisedStream):
    """`ws/jobs/<id>/`: a job page's log batches and status changes; 4404 once not theirs."""

    def refusal(self, user: User) -> int | None:
        visible = visible_jobs(user).filter(pk=self.job_id).exists()
        return None if visible else CLOSE_NOT_FOUND

    def streamed_groups(self) -> tuple[str, ...]:
        return (broadcast.job_group(self.job_id),)

    @property
    def job_id(self) -> int:
        return self.scope["url_route"]["kwargs"]["job_id"]

    async def job_lines(self, message: dict) -> None:
        await self.send_json(message)

    async def job_metrics(self, message: dict) -> None:
        await self.send_json(message)

    async def job_status(self, message: dict) -> None:
        await self.send_json(message)


class JobListConsumer(_AuthorisedStream):
    """`ws/jobs/`: status changes of the jobs of the user's teams (every job for staff).

    Leaving a team does not close it (the user may be in others): that team's jobs stop.
    """

    teams: frozenset[int] | None = frozenset()  # None: all teams

    def refusal(self, user: User) -> int | None:
        teams = Membership.objects.filter(user=user).values_list("team_id", flat=True)
        self.teams = None if user.is_staff else frozenset(teams)
        return None

    def streamed_groups(self) -> tuple[str, ...]:
        return (broadcast.JOBS_GROUP,)

    async def job_statuses(self, message: dict) -> None:
        for status in message["statuses"]:
            if self.teams is None or status["team"] in self.teams:
                await self.send_json(status)


async def _leave(consumer: AsyncJsonWebsocketConsumer, groups: tuple[str, ...]) -> None:
    for group in groups:
        await consumer.channel_layer.group_discard(group, consumer.channel_name)


def _signed_in_user(session_key: str | None) -> User | None:
    """The session's user as the next request would see it: None once the session is gone or
    expired, the user inactive or deleted, or their password changed since sign-in.

    Read from a fresh store (the scope's caches what it loaded at connect), and never written:
    unlike `django.contrib.auth.get_user` this does not flush or cycle anyone's session.
    """
    if not session_key:
        return None
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    backend_path = session.get(BACKEND_SESSION_KEY)
    if session.get(SESSION_KEY) is None or backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    user = load_backend(backend_path).get_user(User._meta.pk.to_python(session[SESSION_KEY]))
    if user is None:  # ModelBackend gives None for an inactive user too
        return None
    stored = session.get(HASH_SESSION_KEY)
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    verified = bool(stored) and any(constant_time_compare(stored, known) for known in hashes)
    return user if verified else None
