"""`/metrics`: the exposition parses, its figures match the ledger, and only a credential (the
scrape token, a staff token) or a network an admin listed reads it."""

import datetime as dt
import re

import pytest
from django.test import Client
from django.utils import timezone

from jobs.actions.tokens import issue_token
from jobs.api.prometheus import gpu_seconds_by_team, render
from jobs.loops import tickstats
from jobs.models import ApiToken, Attempt, Cluster
from jobs.states import JobStatus
from jobs.tasks import reconcile_tick, schedule_tick
from metering.usage import job_gpu_seconds
from tests.factories import place, queued_job, with_attempt

S = JobStatus
NOW = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """Samples by (name, labels); fails on any line that is not valid exposition."""
    assert text.endswith("\n")
    typed: set[str] = set()
    samples = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in {"gauge", "counter", "histogram"}
            typed.add(name)
            continue
        if line.startswith("# HELP "):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, _, body, value = match.groups()
        labels = LABEL.findall(body or "")
        assert "".join(f'{k}="{v}"{sep}' for k, v, sep in labels) == (body or "")
        assert re.sub(r"_(bucket|sum|count)$", "", name) in typed or name in typed
        samples[(name, frozenset((k, v) for k, v, _ in labels))] = float(value)
    return samples


def value(samples, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def redis_db(settings):
    """A Redis database of the tests' own (13, on the suite's Redis server), emptied of
    Starforge's keys before and after."""
    settings.REDIS_URL = settings.REDIS_URL.rsplit("/", 1)[0] + "/13"
    conn = tickstats.client(settings.REDIS_URL)

    def clean() -> None:
        for prefix in (tickstats.KEY_PREFIX, tickstats.HIGH_WATER_PREFIX):
            for key in conn.scan_iter(prefix + "*"):
                conn.delete(key)

    clean()
    yield conn
    clean()


@pytest.fixture
def no_redis(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def staff(make_user, team):
    user = make_user("root", team)
    user.is_staff = True
    user.save()
    return user


def test_jobs_are_counted_by_status_and_team(redis_db, team, alice, make_team, make_user):
    other = make_team("nlp")
    bob = make_user("bob", other)
    for _ in range(3):
        queued_job(team, alice)
    place(queued_job(team, alice), S.FAILED)
    with_attempt(queued_job(other, bob, total_gpus=2), S.RUNNING, start_time=NOW)
    samples = parse(render(NOW))
    assert value(samples, "starforge_jobs", status="QUEUED", team="vision") == 3
    assert value(samples, "starforge_jobs", status="FAILED", team="vision") == 1
    assert value(samples, "starforge_jobs", status="RUNNING", team="nlp") == 1
    assert value(samples, "starforge_jobs", status="RUNNING", team="vision") == 0


def test_gpus_in_use_count_pending_and_running_jobs(redis_db, team, alice, local_cluster):
    other_cluster = Cluster.objects.create(name="gpu-farm", kind="noop", settings={"gpus": 64})
    with_attempt(queued_job(team, alice, total_gpus=2), S.PENDING)
    with_attempt(queued_job(team, alice, total_gpus=3), S.RUNNING, start_time=NOW)
    with_attempt(
        queued_job(team, alice, total_gpus=4, cluster=other_cluster), S.RUNNING, start_time=NOW
    )
    with_attempt(queued_job(team, alice, total_gpus=8), S.SUBMITTED)  # quota, but no GPUs yet
    place(queued_job(team, alice, total_gpus=16), S.QUEUED)
    samples = parse(render(NOW))
    assert value(samples, "starforge_gpus_in_use", team="vision", cluster="local") == 5
    assert value(samples, "starforge_gpus_in_use", team="vision", cluster="gpu-farm") == 4


def test_gpu_seconds_equal_metering_for_closed_and_running_attempts(
    redis_db, team, alice, make_team, make_user
):
    other = make_team("nlp")
    bob = make_user("bob", other)
    s = dt.timedelta(seconds=1)
    job = queued_job(team, alice, total_gpus=2)
    with_attempt(job, S.FAILED, start_time=NOW - 500.25 * s, end_time=NOW - 400 * s)
    with_attempt(job, S.RUNNING, start_time=NOW - 30.5 * s)
    with_attempt(
        queued_job(team, alice, total_gpus=4),
        S.SUCCEEDED,
        start_time=NOW - 90 * s,
        end_time=NOW - 60 * s,
    )
    with_attempt(queued_job(other, bob), S.PENDING)  # never started: not billed
    expected = job_gpu_seconds(Attempt.objects.filter(job__team=team), NOW)
    assert expected == pytest.approx(2 * 100.25 + 2 * 30.5 + 4 * 30)
    assert gpu_seconds_by_team(NOW) == {"vision": pytest.approx(expected)}
    samples = parse(render(NOW))
    assert value(samples, "starforge_gpu_seconds_total", team="vision") == pytest.approx(expected)
    assert value(samples, "starforge_gpu_seconds_total", team="nlp") == 0


def test_gpu_seconds_never_go_down_when_an_attempt_closes_before_the_last_scrape(
    redis_db, team, alice
):
    start = NOW - dt.timedelta(seconds=100)
    attempt = with_attempt(queued_job(team, alice, total_gpus=2), S.RUNNING, start_time=start)
    assert value(parse(render(NOW)), "starforge_gpu_seconds_total", team="vision") == 200
    # The backend reports the end ten seconds before the scrape that counted up to NOW.
    Attempt.objects.filter(pk=attempt.pk).update(end_time=NOW - dt.timedelta(seconds=10))
    assert gpu_seconds_by_team(NOW) == {"vision": 180}
    later = NOW + dt.timedelta(seconds=15)
    assert value(parse(render(later)), "starforge_gpu_seconds_total", team="vision") == 200
    with_attempt(Attempt.objects.get(pk=attempt.pk).job, S.RUNNING, start_time=NOW)
    assert value(parse(render(later)), "starforge_gpu_seconds_total", team="vision") == 210


def test_the_ticks_record_their_duration_and_the_reconcile_lag(redis_db, backend, team):
    before = parse(render(timezone.now()))
    assert not any(name.startswith("starforge_scheduler") for name, _ in before)
    schedule_tick()
    schedule_tick()
    reconcile_tick()
    samples = parse(render(timezone.now()))
    assert value(samples, "starforge_scheduler_tick_seconds_count") == 2
    assert value(samples, "starforge_scheduler_tick_seconds_bucket", le="+Inf") == 2
    assert value(samples, "starforge_scheduler_tick_seconds_sum") >= 0
    assert value(samples, "starforge_reconcile_tick_seconds_count") == 1
    assert value(samples, "starforge_reconcile_last_tick_seconds") >= 0
    ended = value(samples, "starforge_reconcile_last_success_timestamp_seconds")
    assert abs(ended - timezone.now().timestamp()) < 60
    assert 0 <= value(samples, "starforge_reconcile_lag_seconds", cluster="local") < 60


def test_a_failing_poll_shows_as_lag_since_the_failures_began(redis_db, team, local_cluster):
    tickstats.record("reconcile", 0.01)
    failing_since = timezone.now() - dt.timedelta(minutes=5)
    Cluster.objects.filter(pk=local_cluster.pk).update(poll_failing_since=failing_since)
    samples = parse(render(timezone.now()))
    assert value(samples, "starforge_reconcile_lag_seconds", cluster="local") >= 300


def test_without_redis_the_tick_metrics_are_left_out_and_the_ticks_still_run(
    no_redis, backend, team
):
    schedule_tick()
    reconcile_tick()
    samples = parse(render(timezone.now()))
    assert ("starforge_jobs", frozenset({("status", "QUEUED"), ("team", "vision")})) in samples
    assert not any("tick" in name or "reconcile" in name for name, _ in samples)
    assert value(samples, "starforge_gpu_seconds_total", team="vision") == 0


def test_label_values_are_escaped(redis_db, make_team):
    from jobs.api.prometheus import _labels

    assert _labels({"team": 'a"b\\c\nd'}) == '{team="a\\"b\\\\c\\nd"}'


SCRAPE = "scrape-token-0123456789abcdefghijklmnopqrstuvwxyz"


@pytest.fixture
def scrape_token(settings):
    settings.SF_METRICS_TOKEN = SCRAPE
    return SCRAPE


def scrape(address: str = "127.0.0.1", authorization: str = ""):
    extra = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
    return Client(REMOTE_ADDR=address, **extra).get("/metrics")


def test_the_scrape_token_reads_the_metrics(redis_db, team, scrape_token):
    response = scrape(authorization=f"Bearer {scrape_token}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert ("starforge_jobs", frozenset({("status", "QUEUED"), ("team", "vision")})) in parse(
        response.content.decode()
    )


def test_no_network_is_trusted_by_default(redis_db, team, settings):
    assert settings.SF_METRICS_ALLOWED_NETS == []
    response = scrape("127.0.0.1")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.content.decode().startswith("Metrics need a credential")


def test_the_allowed_networks_come_from_the_setting(redis_db, settings, team):
    settings.SF_METRICS_ALLOWED_NETS = ["10.1.0.0/16"]
    assert scrape("10.1.2.3").status_code == 200
    assert scrape("127.0.0.1").status_code == 401


def test_another_address_without_a_token_is_refused_with_one_sentence(redis_db, team):
    response = scrape("10.1.2.3")
    assert response.status_code == 401
    assert response.content.decode().count("\n") == 1


def test_a_wrong_scrape_token_is_unauthorised(redis_db, team, scrape_token):
    assert scrape(authorization=f"Bearer {scrape_token}x").status_code == 401
    assert scrape(authorization="Bearer ünïcode").status_code == 401


def test_without_a_configured_scrape_token_an_empty_bearer_is_refused(redis_db, settings):
    settings.SF_METRICS_TOKEN = ""
    assert scrape(authorization="Bearer ").status_code == 401


def test_a_staff_token_reads_from_anywhere(redis_db, staff):
    assert scrape("10.1.2.3", f"Bearer {issue_token(staff)}").status_code == 200


def test_a_token_of_a_user_who_is_not_staff_is_refused(redis_db, alice):
    response = scrape("10.1.2.3", f"Bearer {issue_token(alice)}")
    assert response.status_code == 403
    assert "staff tokens and the scrape token" in response.content.decode()


def test_a_bad_or_revoked_token_is_unauthorised(redis_db, staff):
    secret = issue_token(staff)
    ApiToken.objects.filter(user=staff).update(revoked_at=timezone.now())
    for header in ("Bearer sf_not-a-token", f"Bearer {secret}", "Basic cm9vdDpwdw=="):
        response = scrape("10.1.2.3", header)
        assert response.status_code == 401, header
        assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("jobs", [2, 40])
def test_a_scrape_costs_the_same_queries_however_many_jobs(
    redis_db, team, alice, django_assert_max_num_queries, jobs, scrape_token
):
    tickstats.record("reconcile", 0.01)
    for n in range(jobs):
        job = queued_job(team, alice)
        with_attempt(
            job,
            S.RUNNING if n % 2 else S.SUCCEEDED,
            start_time=NOW,
            end_time=None if n % 2 else NOW + dt.timedelta(seconds=n),
        )
    # 6, and this month's cost (issue 50): the teams with their budgets, the usage records,
    # the attempts not recorded yet, the check that none was metered meanwhile, the prices;
    # and this month's active and idle GPU-time: the records, the running attempts, the teams.
    with django_assert_max_num_queries(14):
        assert scrape(authorization=f"Bearer {scrape_token}").status_code == 200


def test_an_address_sending_unknown_tokens_is_throttled_but_a_staff_token_is_served(
    redis_db, staff, settings
):
    settings.SF_TOKEN_MAX_FAILURES, settings.SF_TOKEN_WINDOW_S = 2, 60
    for n in range(2):
        assert scrape("10.1.2.3", f"Bearer sf_guess{n}").status_code == 401
    response = scrape("10.1.2.3", "Bearer sf_guess-again")
    assert response.status_code == 429
    assert response.content.decode().startswith("too many unknown tokens from your address")
    assert 55 <= int(response["Retry-After"]) <= 60
    assert scrape("10.1.2.3", f"Bearer {issue_token(staff)}").status_code == 200
