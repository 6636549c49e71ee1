"""`/metrics`: the ledger and the loops in Prometheus' text format, for staff and scrapers.

Every figure is read on scrape with a fixed number of queries, however many jobs the ledger
holds; the ticks' durations come from `jobs.loops.tickstats` (Redis), written by the Celery worker.
The exposition is written by hand (format 0.0.4) so the server needs no client library.
"""

import datetime as dt
import hmac
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from jobs.addresses import client_address, in_networks
from jobs.auth import UserToken
from jobs.errors import ApiError
from jobs.loops import tickstats
from jobs.models import Cluster, Job, Team
from jobs.states import JobStatus
from jobs.throttle import Throttled
from metering.activity import team_activity_month
from metering.cost import team_month_cost
from metering.prices import MICROS, currency, to_micros
from metering.usage import gpu_seconds_by_team

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Labels = dict[str, str]
Sample = tuple[str, Labels, float]  # (name suffix, labels, value)


@dataclass(frozen=True)
class Family:
    """One metric: its HELP and TYPE lines and its samples."""

    name: str
    kind: str  # gauge, counter, histogram
    help: str
    samples: list[Sample]

    def exposition(self) -> str:
        lines = [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]
        lines += [f"{self.name}{sfx}{_labels(lb)} {_number(v)}" for sfx, lb, v in self.samples]
        return "\n".join(lines) + "\n"


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(render(timezone.now()), content_type=CONTENT_TYPE)


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may read; otherwise the 401, 403 or 429 to answer.

    A scrape needs a credential: the scrape token an admin set (SF_METRICS_TOKEN) or a staff
    user's API token. Only the networks an admin listed in SF_METRICS_ALLOWED_NETS (none by
    default: local jobs share the server's loopback) may read without one.
    """
    if in_networks(client_address(request), settings.SF_METRICS_ALLOWED_NETS):
        return None
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        return _unauthorised(
            "Metrics need a credential: send Authorization: Bearer with the scrape token "
            "(SF_METRICS_TOKEN) or a staff user's API token."
        )
    if _is_scrape_token(secret):
        return None
    try:
        user = _token_user(request, secret)
    except Throttled as exc:  # too many unknown tokens from this address
        response = _plain(429, exc.detail)
        response["Retry-After"] = str(exc.extra.get("retry_after", ""))
        return response
    if user is None:
        return _unauthorised("The bearer token is missing, unknown or revoked.")
    if not user.is_staff:
        return _plain(403, "Metrics are served to staff tokens and the scrape token only.")
    return None


def _is_scrape_token(secret: str) -> bool:
    expected = settings.SF_METRICS_TOKEN
    return bool(expected) and hmac.compare_digest(secret.encode(), expected.encode())


def _unauthorised(sentence: str) -> HttpResponse:
    response = _plain(401, sentence)
    response["WWW-Authenticate"] = "Bearer"
    return response


def _token_user(request: HttpRequest, secret: str) -> User | None:
    try:
        return UserToken().authenticate(request, secret)
    except Throttled:
        raise
    except ApiError:  # a known token refused: revoked or expired
        return None


def _plain(status: int, sentence: str) -> HttpResponse:
    return HttpResponse(sentence + "\n", status=status, content_type="text/plain; charset=utf-8")


def render(now: dt.datetime) -> str:
    teams = list(Team.objects.order_by("name").values_list("name", flat=True))
    families = [
        Family(
            "starforge_jobs",
            "gauge",
            "Jobs in the ledger by status and team.",
            _jobs_by_status(teams),
        ),
        Family(
            "starforge_gpus_in_use",
            "gauge",
            "GPUs held by PENDING and RUNNING jobs, by team and cluster.",
            _gpus_in_use(),
        ),
        Family(
            "starforge_gpu_seconds_total",
            "counter",
            "GPU-seconds used by attempts (running ones up to now), by team.",
            _gpu_seconds(teams, now),
        ),
        *_cost_families(now),
        *_activity_families(now),
        *_tick_families(now),
    ]
    return "".join(family.exposition() for family in families)


def _jobs_by_status(teams: list[str]) -> list[Sample]:
    counts = {
        (row["team__name"], row["status"]): row["n"]
        for row in Job.objects.values("team__name", "status").annotate(n=Count("id"))
    }
    # Every (status, team) pair is written, zeros included, so a series never vanishes.
    return [
        ("", {"status": status, "team": team}, counts.get((team, status), 0))
        for team in teams
        for status in JobStatus.values
    ]


def _gpus_in_use() -> list[Sample]:
    rows = (
        Job.objects.filter(status__in=JobStatus.holds_gpus())
        .values("team__name", "cluster__name")
        .annotate(held=Sum("total_gpus"))
        .order_by("team__name", "cluster__name")
    )
    return [
        ("", {"team": row["team__name"], "cluster": row["cluster__name"]}, row["held"])
        for row in rows
    ]


def _gpu_seconds(teams: list[str], now: dt.datetime) -> list[Sample]:
    totals = gpu_seconds_by_team(now)
    # A counter must never go down, or Prometheus reads a reset and rate() jumps by the whole
    # total. Sums can dip: a running attempt counts up to the scrape, then closes with the
    # backend's end time, which may lie before that scrape; a deleted job takes its attempts.
    kept = tickstats.high_water("gpu_seconds", {team: totals.get(team, 0.0) for team in teams})
    return [("", {"team": team}, seconds) for team, seconds in kept.items()]


def _activity_families(now: dt.datetime) -> list[Family]:
    """Each team's active and idle GPU-seconds this month (`metering.activity`)."""
    by_team = team_activity_month(now)
    teams = Team.objects.order_by("name").values_list("pk", "name")
    active = [("", {"team": name}, by_team.get(pk, (0, 0))[0] / 1e6) for pk, name in teams]
    idle = [("", {"team": name}, by_team.get(pk, (0, 0))[1] / 1e6) for pk, name in teams]
    return [
        Family(
            "starforge_active_gpu_seconds_month",
            "gauge",
            "GPU-seconds this UTC month whose GPUs worked (utilisation at the threshold, or "
            "without GPU readings their ranks progressing), by team, from the runners' reports.",
            active,
        ),
        Family(
            "starforge_idle_gpu_seconds_month",
            "gauge",
            "GPU-seconds this UTC month whose GPUs idled, by team, from the runners' reports.",
            idle,
        ),
    ]


def _cost_families(now: dt.datetime) -> list[Family]:
    """Each team's cost this month (`metering.cost`) and the money budgets set, from one read
    of the teams."""
    spent, unit = team_month_cost(now), currency()
    teams = Team.objects.order_by("name").values_list("pk", "name", "money_budget_per_month")
    cost: list[Sample] = []
    budgets: list[Sample] = []
    for pk, name, budget in teams:
        labels = {"team": name, "currency": unit}
        cost.append(("", labels, spent.get(pk, 0) / MICROS))
        if budget is not None:
            budgets.append(("", labels, to_micros(budget) / MICROS))
    return [
        Family(
            "starforge_cost_month",
            "gauge",
            "Cost of GPU time this UTC month (running attempts up to now) at the prices in force "
            "when it ran, by team, in the server's currency.",
            cost,
        ),
        Family(
            "starforge_money_budget_month",
            "gauge",
            "Each team's monthly money budget, in the server's currency (teams that set one).",
            budgets,
        ),
    ]


def _tick_families(now: dt.datetime) -> list[Family]:
    stats = tickstats.read(["schedule", "reconcile"])
    families = []
    for loop, prefix in (("schedule", "starforge_scheduler"), ("reconcile", "starforge_reconcile")):
        if loop not in stats:
            continue  # no tick recorded yet, or Redis unreachable: omitted, not an error
        tick = stats[loop]
        families += [
            Family(
                f"{prefix}_tick_seconds",
                "histogram",
                f"Duration of the {loop} tick.",
                _histogram(tick),
            ),
            Family(
                f"{prefix}_last_tick_seconds",
                "gauge",
                f"Duration of the last {loop} tick.",
                [("", {}, tick.last_seconds)],
            ),
            Family(
                f"{prefix}_last_success_timestamp_seconds",
                "gauge",
                f"When the last {loop} tick completed (epoch seconds).",
                [("", {}, tick.last_end)],
            ),
        ]
    if "reconcile" in stats:
        families.append(
            Family(
                "starforge_reconcile_lag_seconds",
                "gauge",
                "Seconds since each enabled cluster was last reconciled; while its poll "
                "fails, since the failures began.",
                _reconcile_lag(stats["reconcile"].last_end, now),
            )
        )
    return families


def _histogram(tick: tickstats.TickStats) -> list[Sample]:
    samples: list[Sample] = [
        ("_bucket", {"le": _number(bound)}, count) for bound, count in tick.buckets.items()
    ]
    samples += [
        ("_bucket", {"le": "+Inf"}, tick.count),
        ("_sum", {}, tick.total_seconds),
        ("_count", {}, tick.count),
    ]
    return samples


def _reconcile_lag(last_end: float, now: dt.datetime) -> list[Sample]:
    # A failing poll does not stop the tick, so the tick's end time would hide that cluster:
    # its lag counts from when its failures began (the last good poll was at most a beat before).
    samples: list[Sample] = []
    clusters = Cluster.objects.filter(enabled=True).order_by("name")
    for name, failing_since in clusters.values_list("name", "poll_failing_since"):
        since = min(last_end, failing_since.timestamp()) if failing_since else last_end
        samples.append(("", {"cluster": name}, max(0.0, now.timestamp() - since)))
    return samples


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))
