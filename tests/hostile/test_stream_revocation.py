"""Issue 12, point 9: a stream lasts only as long as the right to read it.

Removing a member by any path, deactivating them or signing them out closes their job pages
and takes the team's jobs off their list within seconds. The signal tests run with the
consumers' periodic re-check far away (60 s), so only the signals can close in time; the
safety-net tests take away access where no signal fires and rely on the re-check alone.
"""

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.utils import timezone

from jobs.ledger.transitions import transition
from jobs.models import Membership
from jobs.states import JobStatus
from tests.factories import queued_job
from tests.sockets import session_of, signed_in, socket

SOON_S = 3.0  # "within a few seconds"


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture(autouse=True)
def signals_only(settings):
    settings.SF_WS_RECHECK_S = 60


@pytest.fixture
def safety_net(settings):
    settings.SF_WS_RECHECK_S = 0.3


@pytest.fixture
def vic(make_user, team):
    return make_user("vic", team)


@pytest.fixture
def job(team, alice):
    return queued_job(team, alice)


async def closed_with(communicator, timeout: float = SOON_S) -> int:
    answer = await communicator.receive_output(timeout)
    assert answer["type"] == "websocket.close", answer
    return answer["code"]


async def opened(*communicators) -> None:
    for communicator in communicators:
        assert (await communicator.connect())[0]
        assert await communicator.receive_nothing(0.1)  # accepted and not closed


def revoked_streams(session: str, job, take_away, settle_s: float = 0) -> tuple[int, bool]:
    """Open vic's job page and list, `take_away()` his access, then (`settle_s` after the page
    closed) change the job's status: (the page's close code, whether the list heard it)."""

    async def scenario() -> tuple[int, bool]:
        page, listing = socket(f"/ws/jobs/{job.pk}/", session), socket("/ws/jobs/", session)
        await opened(page, listing)
        await database_sync_to_async(take_away)()
        code = await closed_with(page)
        await asyncio.sleep(settle_s)
        await database_sync_to_async(transition)(
            job.pk, JobStatus.SUBMITTED, reason="quota reserved", actor="scheduler"
        )
        output = await listing.receive_output(1) if not await listing.receive_nothing(1) else None
        await listing.disconnect()
        return code, output is not None and output["type"] == "websocket.send"

    return async_to_sync(scenario)()


def admin_team_form(staff: User, team) -> tuple[Client, str, dict]:
    """The Django admin's change form of the team as a browser would post it back unchanged."""
    client = signed_in(staff)
    url = f"/admin/jobs/team/{team.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    forms = [page.context["adminform"].form]
    for inline in page.context["inline_admin_formsets"]:
        forms += [inline.formset.management_form, *inline.formset.forms]
    data: dict = {}
    for form in forms:
        for name in form.fields:
            value = form[name].value()
            if value is True:
                data[form.add_prefix(name)] = "on"
            elif value is not None and value is not False:
                data[form.add_prefix(name)] = value
    return client, url, data


# -- by signal, after commit ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_member_removed_in_the_django_admin_loses_the_teams_streams(team, vic, job):
    staff = User.objects.create_superuser("root", password="pw")
    client, url, data = admin_team_form(staff, team)
    prefix = next(
        key.removesuffix("-user")
        for key, value in data.items()
        if key.endswith("-user") and value == vic.pk
    )
    data[f"{prefix}-DELETE"] = "on"

    def remove_in_admin() -> None:
        answer = client.post(url, data)
        assert answer.status_code == 302, answer.context and answer.context["errors"]

    code, heard = revoked_streams(session_of(vic), job, remove_in_admin)
    assert not Membership.objects.filter(user=vic).exists()
    assert code == 4404
    assert not heard


@pytest.mark.django_db(transaction=True)
def test_deleting_the_membership_row_any_way_closes_the_page(team, vic, job):
    code, heard = revoked_streams(
        session_of(vic), job, lambda: Membership.objects.filter(user=vic, team=team).delete()
    )
    assert (code, heard) == (4404, False)


@pytest.mark.django_db(transaction=True)
def test_a_deactivated_user_is_signed_out_of_every_stream(vic, job):
    def deactivate() -> None:
        vic.is_active = False
        vic.save()

    session = session_of(vic)

    async def scenario() -> list[int]:
        page, listing = socket(f"/ws/jobs/{job.pk}/", session), socket("/ws/jobs/", session)
        await opened(page, listing)
        await database_sync_to_async(deactivate)()
        return [await closed_with(page), await closed_with(listing)]

    assert async_to_sync(scenario)() == [4401, 4401]


@pytest.mark.django_db(transaction=True)
def test_signing_out_closes_the_streams_that_session_opened(vic, job):
    browser = signed_in(vic)
    session = browser.cookies["sessionid"].value
    elsewhere = session_of(vic)  # another browser, still signed in

    async def scenario() -> None:
        page, listing = socket(f"/ws/jobs/{job.pk}/", session), socket("/ws/jobs/", session)
        other = socket(f"/ws/jobs/{job.pk}/", elsewhere)
        await opened(page, listing, other)
        answer = await database_sync_to_async(browser.post)("/accounts/logout/")
        assert answer.status_code in (200, 302)
        assert [await closed_with(page), await closed_with(listing)] == [4401, 4401]
        assert await other.receive_nothing(0.5)
        await other.disconnect()

    async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_a_member_made_viewer_keeps_reading(team, vic, job):
    def make_viewer() -> None:
        membership = Membership.objects.get(user=vic, team=team)
        membership.role = Membership.Role.VIEWER
        membership.save()

    session = session_of(vic)

    async def scenario() -> None:
        page = socket(f"/ws/jobs/{job.pk}/", session)
        await opened(page)
        await database_sync_to_async(make_viewer)()
        assert await page.receive_nothing(1)
        await database_sync_to_async(transition)(
            job.pk, JobStatus.SUBMITTED, reason="quota reserved", actor="scheduler"
        )
        assert (await page.receive_json_from())["status"] == "SUBMITTED"
        await page.disconnect()

    async_to_sync(scenario)()


# -- the periodic re-check, where no signal fires ------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_membership_deleted_in_sql_closes_the_page_by_the_next_recheck(
    safety_net, team, vic, job
):
    def delete_in_sql() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {Membership._meta.db_table} WHERE user_id = %s", [vic.pk])

    # Each consumer re-checks on its own clock: give the list's one round after the page's.
    code, heard = revoked_streams(session_of(vic), job, delete_in_sql, settle_s=0.6)
    assert (code, heard) == (4404, False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "take_away",
    [
        lambda vic: Session.objects.all().delete(),
        lambda vic: Session.objects.update(expire_date=timezone.now()),
        lambda vic: User.objects.filter(pk=vic.pk).update(is_active=False),
        lambda vic: User.objects.filter(pk=vic.pk).update(password="changed elsewhere"),
    ],
    ids=["session deleted", "session expired", "deactivated in SQL", "password changed in SQL"],
)
def test_a_session_that_no_longer_signs_in_closes_by_the_next_recheck(
    safety_net, vic, job, take_away
):
    session = session_of(vic)

    async def scenario() -> list[int]:
        page, listing = socket(f"/ws/jobs/{job.pk}/", session), socket("/ws/jobs/", session)
        await opened(page, listing)
        await database_sync_to_async(take_away)(vic)
        return [await closed_with(page), await closed_with(listing)]

    assert async_to_sync(scenario)() == [4401, 4401]


@pytest.mark.django_db(transaction=True)
def test_an_open_stream_of_a_member_in_good_standing_stays_open(safety_net, vic, job):
    session = session_of(vic)

    async def scenario() -> None:
        page = socket(f"/ws/jobs/{job.pk}/", session)
        await opened(page)
        assert await page.receive_nothing(1.2)  # four re-checks
        await page.disconnect()

    async_to_sync(scenario)()


@pytest.fixture
def redis_layer(settings):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [settings.REDIS_URL], "prefix": "sf-test-revocation"},
        }
    }


@pytest.mark.django_db(transaction=True)
def test_the_close_travels_through_the_redis_layer_of_a_deployment(redis_layer, team, vic, job):
    code, heard = revoked_streams(
        session_of(vic), job, lambda: Membership.objects.filter(user=vic, team=team).delete()
    )
    assert (code, heard) == (4404, False)
