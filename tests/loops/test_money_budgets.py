"""Money budgets (issue 50, point 4), each loop step called on its own on a fixed clock: a team
that spent its month's money budget has its GPU jobs held in the queue (the words say which
budget), its running ones stopped where it asked for a hard stop, and each alert threshold it
reached told once a month, to its webhooks and by email."""

import datetime as dt
from decimal import Decimal

import pytest
from django.core import mail

from jobs.actions import webhooks
from jobs.loops import deliveries
from jobs.loops.budgets import apply_budget_stops, held_back, notify_budget_alerts
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import BudgetAlert, GpuPrice, Job, WebhookDelivery
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus
NOW = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)
MICROS = 10**6


@pytest.fixture
def nlp(make_team, noop_cluster):
    """A team with a money budget of 100.00, on a cluster whose GPUs cost 10.00 an hour."""
    team = make_team("nlp", gpu_quota=16, cluster=noop_cluster)
    team.money_budget_per_month, team.budget_hard_stop = Decimal("100"), True
    team.save()
    GpuPrice.objects.create(
        cluster=noop_cluster, per_gpu_hour=Decimal("10"), valid_from=NOW - dt.timedelta(days=30)
    )
    return team


def spent(team, user, hours: float, total_gpus: int = 1, status: str = S.RUNNING) -> Job:
    """A job of `team` that has run `hours` up to NOW (still running, unless `status` says)."""
    job = queued_job(team, user, total_gpus=total_gpus)
    start = NOW - dt.timedelta(hours=hours)
    end = None if status == S.RUNNING else NOW
    with_attempt(job, status, start_time=start, end_time=end)
    return job


def test_a_spent_money_budget_holds_gpu_jobs_and_says_which_budget(nlp):
    words = held_back(nlp, 1, 0, NOW, used_micros=100 * MICROS)
    assert words == (
        "waiting for budget: team nlp spent 100.00 USD of its money budget of 100.00 USD this "
        "month; the budget renews Jan 1 00:00 UTC"
    )
    assert held_back(nlp, 1, 0, NOW, used_micros=99 * MICROS) is None
    assert held_back(nlp, 0, 0, NOW, used_micros=500 * MICROS) is None  # no GPUs, no cost


def test_admission_keeps_a_gpu_job_queued_once_the_month_cost_the_budget(nlp, make_user):
    ann = make_user("ann", nlp)
    spent(nlp, ann, hours=10, status=S.SUCCEEDED)  # 10 GPU-hours at 10.00: the whole budget
    waiting = queued_job(nlp, ann, total_gpus=1)
    result = admit_queued_jobs(NOW)
    waiting.refresh_from_db()
    assert result.admitted == []
    assert waiting.status == S.QUEUED
    assert "money budget of 100.00 USD" in waiting.status_reason


def test_the_hard_stop_stops_running_gpu_jobs_on_money_and_says_so(nlp, make_user):
    ann = make_user("ann", nlp)
    gpu_job = spent(nlp, ann, hours=5, total_gpus=2)  # 10 GPU-hours: 100.00
    cpu_job = spent(nlp, ann, hours=5, total_gpus=0)
    assert apply_budget_stops(NOW - dt.timedelta(minutes=1)) == []  # 99.67 spent
    assert apply_budget_stops(NOW) == [gpu_job.pk]
    gpu_job.refresh_from_db()
    assert gpu_job.status_reason == (
        "stopped: team nlp used its monthly money budget of 100.00 USD (hard stop)"
    )
    cpu_job.refresh_from_db()
    assert cpu_job.status == S.RUNNING
    assert apply_budget_stops(NOW) == []


def test_each_threshold_is_told_once_a_month_to_the_teams_webhooks_and_by_email(
    nlp, make_user, settings
):
    settings.SF_NOTIFY_EMAIL = True
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    boss = make_user("boss", nlp, role="admin")
    webhooks.create(boss, "mailto:boss@example.com", ["budget-alert"], team_name="nlp")
    spent(nlp, boss, hours=6)  # 60.00 of 100.00
    assert notify_budget_alerts(NOW) == [(nlp.pk, 50)]
    assert notify_budget_alerts(NOW) == []  # told once
    assert notify_budget_alerts(NOW + dt.timedelta(hours=2)) == [(nlp.pk, 80)]  # 80.00
    assert notify_budget_alerts(NOW + dt.timedelta(hours=4)) == [(nlp.pk, 100)]
    assert notify_budget_alerts(NOW + dt.timedelta(hours=5)) == []
    assert sorted(BudgetAlert.objects.values_list("percent", flat=True)) == [50, 80, 100]
    deliveries.deliver_due(now=NOW + dt.timedelta(hours=5))
    subjects = sorted(m.subject for m in mail.outbox)
    assert len(subjects) == 3
    assert (
        "team nlp reached 50% of its money budget for 2026-12: 60.00 USD of 100.00 USD"
        in (subjects[1])
    )
    payloads = [d.payload for d in WebhookDelivery.objects.order_by("pk")]
    assert [(p["percent"], p["spent"], p["currency"]) for p in payloads] == [
        (50, "60.00", "USD"),
        (80, "80.00", "USD"),
        (100, "100.00", "USD"),
    ]


def test_a_new_month_tells_the_thresholds_again(nlp, make_user):
    ann = make_user("ann", nlp)
    spent(nlp, ann, hours=6, status=S.SUCCEEDED)
    assert notify_budget_alerts(NOW) == [(nlp.pk, 50)]
    january = dt.datetime(2027, 1, 3, tzinfo=dt.UTC)
    spent_in_january = queued_job(nlp, ann)
    with_attempt(
        spent_in_january,
        S.SUCCEEDED,
        start_time=january - dt.timedelta(hours=9),
        end_time=january,
    )
    assert notify_budget_alerts(january) == [(nlp.pk, 50), (nlp.pk, 80)]


def test_a_team_without_a_money_budget_or_thresholds_is_told_nothing(nlp, make_user):
    spent(nlp, make_user("ann", nlp), hours=20)
    nlp.budget_alert_percents = ""
    nlp.save()
    assert notify_budget_alerts(NOW) == []
    nlp.budget_alert_percents, nlp.money_budget_per_month = "50", None
    nlp.save()
    assert notify_budget_alerts(NOW) == []


def test_the_tick_tells_the_thresholds_after_its_budget_stops(nlp, make_user, settings):
    settings.SF_NOTIFY_EMAIL = True
    boss = make_user("boss", nlp, role="admin")
    webhooks.create(boss, "mailto:boss@example.com", ["budget-alert"], team_name="nlp")
    spent(nlp, boss, hours=9, status=S.SUCCEEDED)  # 90.00
    result = admit_queued_jobs(NOW)
    assert result.alerts == [(nlp.pk, 50), (nlp.pk, 80)]
    assert admit_queued_jobs(NOW).alerts == []
    assert WebhookDelivery.objects.filter(event="budget-alert").count() == 2


def test_only_owners_who_may_still_be_told_get_an_alert(nlp, make_user, make_team, settings):
    """A member's own webhook is told about their team; after they leave the team, or for a
    team they are not in, it is not."""
    settings.SF_NOTIFY_EMAIL = True
    ann, olga = make_user("ann", nlp), make_user("olga", make_team("other"))
    webhooks.create(ann, "mailto:ann@example.com", ["budget-alert"])
    webhooks.create(olga, "mailto:olga@example.com", ["budget-alert"])
    spent(nlp, ann, hours=6)
    notify_budget_alerts(NOW)
    assert [d.webhook.owner.username for d in WebhookDelivery.objects.all()] == ["ann"]
    nlp.membership_set.filter(user=ann).delete()
    notify_budget_alerts(NOW + dt.timedelta(hours=2))  # 80%: ann is no longer in nlp
    assert WebhookDelivery.objects.count() == 1


def test_an_alert_written_before_its_owner_left_the_team_is_not_sent(nlp, make_user, settings):
    """Checked again at every try, as a job's deliveries are: a member who leaves the team (or a
    team admin demoted) between the alert's write and its try is not told."""
    settings.SF_NOTIFY_EMAIL = True
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    ann = make_user("ann", nlp)
    webhooks.create(ann, "mailto:ann@example.com", ["budget-alert"])
    spent(nlp, ann, hours=6)
    assert notify_budget_alerts(NOW) == [(nlp.pk, 50)]
    nlp.membership_set.filter(user=ann).delete()
    deliveries.deliver_due(now=NOW)
    assert mail.outbox == []
    delivery = WebhookDelivery.objects.get()
    assert delivery.state != WebhookDelivery.State.DELIVERED
    assert "no longer in the team" in str(delivery.tries)
