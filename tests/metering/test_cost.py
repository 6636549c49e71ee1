"""Cost (issue 50, point 4): each attempt is billed at the price in force when it ran, cut where
the price changes; the records, a job's figure and a team's month agree to the micro-unit; a
type without a price of its own pays the cluster's default; money is never a float."""

import datetime as dt
from decimal import Decimal

import pytest

from jobs.models import GpuPrice
from metering.cost import attempt_parts, job_cost, team_cost, usage_cost
from metering.models import UsageRecord
from metering.prices import amount, price_spans, read_prices, to_micros
from metering.records import meter_ended
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
DEC = dt.date(2026, 12, 1)
DEC_1 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
CHANGE = dt.datetime(2026, 12, 10, 12, 0, tzinfo=dt.UTC)  # the price goes from 2.00 to 3.00
NOW = dt.datetime(2026, 12, 20, tzinfo=dt.UTC)


def price(cluster, per_gpu_hour: str, valid_from: dt.datetime, gpu_type: str = "") -> GpuPrice:
    return GpuPrice.objects.create(
        cluster=cluster,
        gpu_type=gpu_type,
        per_gpu_hour=Decimal(per_gpu_hour),
        valid_from=valid_from,
    )


def ran(team, user, start: dt.datetime, hours: float, total_gpus: int = 1, **fields):
    job = queued_job(team, user, total_gpus=total_gpus, **fields)
    end = start + dt.timedelta(hours=hours)
    attempt = with_attempt(job, "SUCCEEDED", start_time=start, end_time=end)
    return job, attempt


@pytest.fixture
def priced(team):
    cluster = team.default_cluster
    price(cluster, "2.00", DEC_1)
    price(cluster, "3.00", CHANGE)
    return cluster


def test_a_price_change_mid_month_bills_each_attempt_at_the_price_in_force_when_it_ran(
    team, alice, priced
):
    before, _ = ran(team, alice, CHANGE - dt.timedelta(days=2), hours=2, total_gpus=2)
    after, _ = ran(team, alice, CHANGE + dt.timedelta(days=2), hours=2, total_gpus=2)
    started = lambda job: [(a.start_time, a.end_time, a.total_gpus) for a in job.attempts.all()]  # noqa: E731
    assert job_cost(priced.pk, "", started(before), NOW) == to_micros("8.00")  # 4 GPU-h x 2
    assert job_cost(priced.pk, "", started(after), NOW) == to_micros("12.00")  # 4 GPU-h x 3
    assert team_cost(DEC, NOW) == {team.pk: to_micros("20.00")}
    assert meter_ended() == 2
    assert sum(UsageRecord.objects.values_list("cost_micros", flat=True)) == to_micros("20.00")
    assert team_cost(DEC, NOW) == {team.pk: to_micros("20.00")}  # the same once recorded


def test_an_attempt_spanning_the_change_is_split_at_it_and_says_so(team, alice, priced):
    job, attempt = ran(team, alice, CHANGE - dt.timedelta(hours=1), hours=3, total_gpus=1)
    parts = attempt_parts(priced.pk, "", attempt.start_time, attempt.end_time, 1, NOW)
    assert [
        (p.start, p.end, amount(p.micros_per_gpu_hour), amount(p.cost_micros)) for p in parts
    ] == [
        (attempt.start_time, CHANGE, "2.00", "2.00"),
        (CHANGE, attempt.end_time, "3.00", "6.00"),
    ]
    assert meter_ended() == 1
    assert UsageRecord.objects.get().cost_micros == to_micros("8.00")


def test_a_price_added_later_does_not_rewrite_what_was_recorded(team, alice, priced):
    ran(team, alice, CHANGE + dt.timedelta(days=1), hours=1)
    meter_ended()
    price(priced, "100.00", CHANGE + dt.timedelta(days=1))  # by hand, into the past
    assert UsageRecord.objects.get().cost_micros == to_micros("3.00")


def test_a_running_attempt_costs_up_to_now_and_the_records_keep_its_final_cost(team, alice, priced):
    job = queued_job(team, alice, total_gpus=4)
    with_attempt(job, "RUNNING", start_time=NOW - dt.timedelta(minutes=30))
    assert team_cost(DEC, NOW) == {team.pk: to_micros("6.00")}  # 2 GPU-h x 3
    users = usage_cost(DEC, dt.date(2027, 1, 1), NOW, [team.pk])
    assert users == {(dt.date(2026, 12, 19), team.pk, alice.pk, priced.pk, ""): to_micros("6.00")}


def test_a_gpu_type_pays_its_own_price_from_its_first_and_the_default_otherwise(
    team, alice, priced
):
    price(priced, "10.00", CHANGE + dt.timedelta(days=1), gpu_type="H100")
    book = read_prices()
    schedule = book.schedule(priced.pk, "H100")
    assert [amount(rate) for _, rate in schedule] == ["2.00", "3.00", "10.00"]
    assert book.schedule(priced.pk, "A40") == book.schedule(priced.pk, "")  # no price of its own
    h100, _ = ran(team, alice, CHANGE + dt.timedelta(days=2), hours=1, gpu_type="H100")
    a40, _ = ran(team, alice, CHANGE + dt.timedelta(days=2), hours=1, gpu_type="A40")
    assert team_cost(DEC, NOW) == {team.pk: to_micros("13.00")}


def test_gpus_before_the_first_price_cost_nothing(team, alice):
    cluster = team.default_cluster
    price(cluster, "4.00", CHANGE)
    start = CHANGE - dt.timedelta(hours=1)
    spans = list(
        price_spans(start, CHANGE + dt.timedelta(hours=1), read_prices().schedule(cluster.pk, ""))
    )
    assert [rate for _, _, rate in spans] == [0, to_micros("4.00")]
    ran(team, alice, start, hours=2)
    assert team_cost(DEC, NOW) == {team.pk: to_micros("4.00")}


def test_money_is_never_a_float():
    assert to_micros(Decimal("0.000001")) == 1
    assert amount(to_micros("12.345")) == "12.34"  # half to even, in cents
    with pytest.raises(TypeError):
        to_micros(1.5)  # type: ignore[arg-type]
