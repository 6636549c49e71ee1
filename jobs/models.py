"""Ledger models: teams, clusters, tokens, jobs, attempts, the event timeline, log streams.

`Job.status` is written only by `jobs.ledger.transitions`; everything else reads it.
"""

import datetime as dt
import functools
import posixpath
import secrets
from pathlib import PurePosixPath

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from jobs.audited import AuditEntry  # noqa: F401 - the app's models, found here by every reader
from jobs.gpus import to_gpus_per_node
from jobs.identities import (  # noqa: F401 - the app's models, found here by every reader
    GroupLink,
    Identity,
)
from jobs.money import (  # noqa: F401 - the app's models, found here by every reader
    BudgetAlert,
    GpuPrice,
    validate_alert_percents,
)
from jobs.states import JobStatus
from jobs.streamed import (  # noqa: F401 - the app's models, found here by every reader
    LogChunk,
    LogStream,
    MetricChunk,
    MetricKind,
    MetricRollup,
    MetricSeries,
    MetricStream,
    TrackingValue,
)
from jobs.watched import (  # noqa: F401 - the app's models, found here by every reader
    ActivityPolicy,
    AttemptActivity,
    IdleExemption,
)

# The longest time limit a job or a team's default may give: 30 days.
TIME_LIMIT_MAX_S = 30 * 24 * 3600
# The largest value a bigint column holds (every id, a metric point's seq and step): a larger
# one matches no row, and neither database can be sent it.
BIGINT_MAX = 2**63 - 1


class ScheduleWindow(models.Model):
    """A named weekly window in a time zone, e.g. ``mon-fri 20:00-08:00, sat-sun``."""

    name = models.SlugField(unique=True)
    timezone = models.CharField(max_length=64, default="UTC")
    spec = models.CharField(max_length=500, help_text="e.g. 'mon-fri 20:00-08:00, sat-sun'")

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from jobs.windows import WindowSpecError, parse_window

        try:
            parse_window(self.spec, self.timezone)
        except WindowSpecError as exc:
            raise ValidationError({"spec": str(exc)}) from exc


class Cluster(models.Model):
    """Where jobs run: an executor kind plus its connection settings."""

    class Kind(models.TextChoices):
        LOCAL = "local", "Local executor (process groups on the worker host)"
        SLURM = "slurm", "Slurm (sbatch/squeue/scancel)"
        RAY = "ray", "Ray (Jobs API on the dashboard)"
        KUBERNETES = "kubernetes", "Kubernetes (batch/v1 Jobs)"
        NOOP = "noop", "No-op executor (benchmarks: accepts launches, runs nothing)"

    name = models.SlugField(unique=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    settings = models.JSONField(
        default=dict,
        blank=True,
        help_text="connection settings of the executor kind; see the README's Clusters section",
    )
    enabled = models.BooleanField(default=True)
    window = models.ForeignKey(
        "ScheduleWindow",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text="jobs start on this cluster only inside this window (as well as their own)",
    )
    # Health as the scheduler and reconciler last saw it; only changes are written.
    unreachable_since = models.DateTimeField(null=True, blank=True, editable=False)
    unreachable_reason = models.TextField(blank=True, editable=False)
    poll_failing_since = models.DateTimeField(null=True, blank=True, editable=False)
    poll_error = models.TextField(blank=True, editable=False)
    # Whether its GPUs are counted slots rather than devices, as the scheduler last saw; None
    # until it has asked. Job reads show it from here: a read never asks an engine.
    gpus_virtual = models.BooleanField(null=True, editable=False)

    def __str__(self) -> str:
        return self.name

    @property
    def virtual_gpus(self) -> bool:
        """Counted GPU slots, not devices: as last seen, else what the kind has out of the box
        (the local executor counts slots on a host without an NVIDIA driver)."""
        return virtual_gpus(self.kind, self.gpus_virtual)

    def clean(self) -> None:
        from jobs.executors.base import validate_cluster_settings

        try:
            self.settings = validate_cluster_settings(self.kind, self.settings)
        except ValueError as exc:
            raise ValidationError({"settings": str(exc)}) from exc


class Team(models.Model):
    name = models.SlugField(unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership")
    gpu_quota = models.PositiveIntegerField(
        default=8, help_text="GPUs the team's SUBMITTED+PENDING+RUNNING jobs may hold at once"
    )
    max_jobs = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="slots: jobs the team may have SUBMITTED+PENDING+RUNNING at once; empty: none",
    )
    gpu_hours_per_month = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="monthly budget (UTC calendar month); when used up new jobs wait; empty: none",
    )
    budget_hard_stop = models.BooleanField(
        default=False,
        help_text="when the monthly budget (GPU-hours or money) is used up, also stop the "
        "team's running jobs",
    )
    money_budget_per_month = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="monthly budget in the server's currency (UTC calendar month), at the GPU "
        "prices in force; when used up new jobs wait; empty: none",
    )
    budget_alert_percents = models.CharField(
        max_length=100,
        blank=True,
        default="50,80,100",
        validators=[validate_alert_percents],
        help_text="percents of the money budget at which the team's webhooks are told, each "
        "once a month, e.g. 50,80,100; empty: none",
    )
    user_gpu_cap = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="GPUs one member's jobs may hold at once inside the team; empty: no cap",
    )
    max_gpus_per_job = models.PositiveIntegerField(
        null=True, blank=True, help_text="largest GPU count one job may ask for; empty: the quota"
    )
    max_member_priority = models.IntegerField(
        default=10,
        validators=[MinValueValidator(-100), MaxValueValidator(100)],
        help_text="highest --priority a member may give; team admins and staff go up to 100",
    )
    default_cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.SET_NULL)
    window = models.ForeignKey(ScheduleWindow, null=True, blank=True, on_delete=models.SET_NULL)
    default_max_retries = models.PositiveIntegerField(
        default=0, help_text="automatic retries of a failed job when its submit does not say"
    )
    default_retry_cooldown_s = models.PositiveIntegerField(
        default=30, help_text="seconds before the first automatic retry; doubles each retry"
    )
    default_time_limit_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(TIME_LIMIT_MAX_S)],
        help_text="seconds an attempt may run when its submit gives no --time-limit; past it "
        "the job is stopped (empty: no limit)",
    )
    lendable = models.BooleanField(
        default=False,
        help_text="GPUs of this team's quota it does not use (and no job of its own waits for) "
        "may be lent to teams allowed to borrow; the jobs on them are preemptible",
    )
    borrow_cap = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="GPUs this team's jobs may borrow at once beyond its quota from lendable "
        "teams' idle quota (empty: none); a job on borrowed GPUs is preemptible",
    )
    snapshot_quota_mb = models.PositiveIntegerField(
        default=10240,
        help_text="MiB of working-directory snapshots the team may own at once (the sum of "
        "their sizes); an upload past it is refused",
    )

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        super().save(*args, **kwargs)
        if self.default_cluster_id is not None:  # a team may use its default (jobs.grants)
            ClusterGrant.objects.get_or_create(team=self, cluster_id=self.default_cluster_id)


class TeamGpuTypeQuota(models.Model):
    """A cap on the GPUs of one type a team's jobs hold at once, beside its `gpu_quota`.

    A job counts toward it when it asked for that type, or, asking for none, when the
    scheduler placed its ranks on nodes of that type (clusters that report their nodes); a job
    without a type then avoids the nodes of a type whose cap it would pass."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="gpu_type_quotas")
    gpu_type = models.CharField(
        max_length=64,
        help_text="e.g. a100; matched the way --gpu-type is (case aside, a word "
        "of the product name)",
    )
    gpus = models.PositiveIntegerField(help_text="GPUs of this type the team may hold at once")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "gpu_type"], name="one_quota_per_gpu_type"),
        ]

    def __str__(self) -> str:
        return f"{self.team}: {self.gpus} {self.gpu_type}"


class ClusterShare(models.Model):
    """A team's share of one cluster's GPUs, in percent of what the cluster has."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="shares")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="cluster_shares")
    percent = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="the team's jobs on this cluster hold at most this share of its GPUs",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "team"], name="one_share_per_team"),
        ]

    def __str__(self) -> str:
        return f"{self.team} on {self.cluster}: {self.percent}%"


class ClusterGrant(models.Model):
    """The team may use the cluster: submit to it, choose it as default, be admitted on it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="grants")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="cluster_grants")
    granted_at = models.DateTimeField(default=timezone.now)
    granted_by = models.CharField(max_length=150, blank=True, help_text="empty: the team's default")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "cluster"], name="one_grant_per_team")
        ]

    def __str__(self) -> str:
        return f"{self.team} may use {self.cluster}"


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member"
        VIEWER = "viewer"
        ADMIN = "admin"

    team = models.ForeignKey(Team, on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership")]


class ApiToken(models.Model):
    """A user's bearer token; only its sha256 is stored, the secret is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100, default="cli")
    prefix = models.CharField(max_length=12)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # null: never expires
    # The token whose request created this one (null: the console session or a shell). A token
    # never outlives its creator and is revoked with it; deleting the creator deletes it too.
    created_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="created_tokens"
    )

    @staticmethod
    def new_secret() -> str:
        return "sf_" + secrets.token_urlsafe(32)

    def is_expired(self, now: dt.datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


class Snapshot(models.Model):
    """A content-addressed working-directory archive (tar.gz) on disk, one per sha256.

    Teams own it through `SnapshotOwner`. Deleted when no team owns it and no job references
    it; a blob pruned earlier keeps its row with `deleted_reason`, so a retry can say why it
    cannot run.
    """

    sha256 = models.CharField(max_length=64, primary_key=True)
    size = models.BigIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)
    deleted_reason = models.CharField(max_length=300, blank=True)


class SnapshotOwner(models.Model):
    """A team's claim on a stored snapshot: one of its members uploaded these bytes.

    A job may use only a snapshot its team owns; the blob is stored once whoever uploads it.
    The claim goes with the team's last job that uses the snapshot (deleted or pruned), the
    blob when no team owns it and no job references it.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="snapshot_claims")
    snapshot = models.ForeignKey(Snapshot, on_delete=models.CASCADE, related_name="owners")
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "snapshot"], name="one_snapshot_claim"),
        ]


class JobArray(models.Model):
    """A job array (`sf submit --array 0-31 -- ...`): N tasks sharing one snapshot, each a
    full job of the ledger (`Job.array`), at most `max_parallel` of them active at once. The
    array has no status of its own: its tasks' statuses are counted (jobs.arrays)."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="arrays")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    name = models.CharField(max_length=200, blank=True)
    spec = models.CharField(max_length=100, help_text='"0-31:2", or "file" for --array-file')
    size = models.PositiveIntegerField()
    max_parallel = models.PositiveIntegerField(null=True, blank=True, help_text="empty: no cap")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"array {self.pk} ({self.size} tasks)"


class Job(models.Model):
    run_id = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=200, blank=True)
    # No index of their own for team, user, cluster and array: the composite indexes in Meta
    # lead with each of them, and serve their lookups as well. Every index is written on each
    # insert and on each status change (status is in several, so no update of a job is a
    # heap-only one on PostgreSQL): the four single-column copies cost every submit and every
    # transition a write each: dropping them gave the SQLite API mix about 5% more requests a
    # second in an A/B (`bench/http_bench.py`'s servers; its full runs vary by as much).
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, db_index=False)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, db_index=False)
    # GPUs the job holds in all: nodes x GPUs per node (jobs.gpus). Every quota, share,
    # capacity sum and meter counts this; `gpus_per_node` is what each rank gets.
    total_gpus = models.PositiveIntegerField(default=1)
    nodes = models.PositiveIntegerField(default=1, help_text="ranks, each on its own node")
    gpu_type = models.CharField(
        max_length=64, blank=True, help_text="GPU type every node must have; empty: any"
    )
    cpus = models.PositiveIntegerField(null=True, blank=True, help_text="CPUs per node")
    memory_mb = models.PositiveIntegerField(null=True, blank=True, help_text="MiB per node")
    image = models.CharField(max_length=300, blank=True, help_text="container image (Kubernetes)")
    entrypoint = models.JSONField()
    env = models.JSONField(default=dict, blank=True)
    snapshot = models.ForeignKey(Snapshot, null=True, on_delete=models.PROTECT)
    priority = models.IntegerField(default=0)
    window = models.ForeignKey(ScheduleWindow, null=True, blank=True, on_delete=models.PROTECT)

    class WindowPolicy(models.TextChoices):
        WAIT = "wait", "start only inside the window; a running job runs on"
        PAUSE = "pause", "pause when the window closes, resume when it reopens"

    window_policy = models.CharField(
        max_length=5, choices=WindowPolicy.choices, default=WindowPolicy.WAIT
    )
    # Set when the scheduler paused the job because its window closed; a person's pause,
    # resume or stop clears it, so only window pauses are resumed by the window.
    paused_by_window = models.BooleanField(default=False)
    pending_deadline_s = models.PositiveIntegerField(null=True, blank=True)
    # Seconds each attempt may run, counted from when it is really up (as billing is): past it
    # the job is STOPPED, never retried automatically. None: no limit.
    time_limit_s = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(
        max_length=10, choices=JobStatus.choices, default=JobStatus.QUEUED, editable=False
    )
    status_reason = models.TextField(blank=True)
    status_changed_at = models.DateTimeField(default=timezone.now)
    submitted_at = models.DateTimeField(default=timezone.now)
    retry_count = models.PositiveIntegerField(default=0)
    attempt_count = models.PositiveIntegerField(default=0)
    current_attempt = models.ForeignKey(
        "Attempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    max_retries = models.PositiveIntegerField(default=0)
    retry_cooldown_s = models.PositiveIntegerField(default=30)
    # Set while a FAILED job waits out its cooldown before the next automatic attempt.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # The nodes its attempts that hung ran on, oldest first, where its engine can keep an attempt
    # off nodes (Slurm's --exclude): every later attempt is kept off as many of them as leave it
    # enough nodes (`jobs.executors.base.nodes_to_avoid`); written by `jobs.ledger.watch`.
    avoid_nodes = models.JSONField(default=list, blank=True)
    # Follow-on jobs (`--then eval`): the names asked for and their specs from starforge.toml.
    then = models.JSONField(default=list, blank=True)
    follow_on_specs = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="follow_ons"
    )
    follow_on_name = models.CharField(max_length=50, blank=True)
    # A task of a job array: its index and its parameter set (--array-file's line).
    array = models.ForeignKey(
        JobArray,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="tasks",
        db_index=False,  # job_array_status leads with it
    )
    array_index = models.PositiveIntegerField(null=True, blank=True)
    array_params = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            # A parent's follow-on of a given name is created exactly once.
            models.UniqueConstraint(
                fields=["parent", "follow_on_name"],
                condition=models.Q(parent__isnull=False),
                name="one_follow_on_per_name",
            ),
        ]
        indexes = [
            # Jobs of a team by status (quota sums, team views).
            models.Index(fields=["team", "status"], name="job_team_status"),
            # Latest jobs of a user (`sf job list`, `sf job status` without an id).
            models.Index(fields=["user", "-id"], name="job_user_latest"),
            # The scheduler's queue order and the reconciler's active scan.
            models.Index(fields=["status", "-priority", "submitted_at"], name="job_queue_order"),
            models.Index(fields=["cluster", "status"], name="job_cluster_status"),
            models.Index(fields=["status", "next_attempt_at"], name="job_retry_due"),
            # An array's tasks by status (its counts, the scheduler's --max-parallel gate).
            models.Index(fields=["array", "status"], name="job_array_status"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.run_id})"

    @property
    def is_terminal(self) -> bool:
        return self.status in JobStatus.terminal()

    @property
    def gpus_per_node(self) -> int:
        return to_gpus_per_node(self.total_gpus, self.nodes)


def virtual_gpus(kind: str, gpus_virtual: bool | None) -> bool:
    """`Cluster.virtual_gpus` of a cluster's columns (the API's row reads have no model)."""
    if gpus_virtual is not None:
        return gpus_virtual
    return kind in (Cluster.Kind.LOCAL, Cluster.Kind.NOOP)


def run_output_dir(output_root: object, run_id: str) -> str:
    """A run's output directory as its job sees it: under the cluster's `output_root` setting
    (where that cluster mounts run outputs), else SF_OUTPUT_ROOT; named by the run id (hex, made
    by the server), so every attempt and retry of the run writes to it. The launcher hands it to
    the job, the API shows it (for each of a list's jobs: hence no path object per call)."""
    return posixpath.join(_normal_root(str(output_root or settings.SF_OUTPUT_ROOT)), run_id)


@functools.lru_cache(maxsize=256)
def _normal_root(root: str) -> str:
    return str(PurePosixPath(root))


def new_token_nonce() -> str:
    return secrets.token_hex(16)


class Attempt(models.Model):
    """One launch of a job: first run, each resume, each retry."""

    # one_attempt_number (job, number) leads with the job: no index of its own (see Job.team).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts", db_index=False)
    number = models.PositiveIntegerField()
    total_gpus = models.PositiveIntegerField()  # in all: nodes x GPUs per node
    nodes = models.PositiveIntegerField(default=1)
    # Each rank as the engine last reported it: {"rank", "node", "state", "exit_code"}.
    ranks = models.JSONField(default=list, blank=True)
    # The lendable team whose idle quota this attempt runs on (None: its own team's quota):
    # its GPUs count against that team's quota, and it is preemptible.
    borrowed_from = models.ForeignKey(
        "Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # When the scheduler told this attempt to give its borrowed GPUs back (the notice: SIGTERM,
    # then SIGKILL after its cluster's grace), and the lender's job that needed them: the one
    # flag of a preemption, written by jobs.ledger.preemption alone. However the attempt then
    # ends, the job goes PAUSED and is queued again (jobs.reads.preemption says which).
    preempted_at = models.DateTimeField(null=True, blank=True)
    preempted_for = models.ForeignKey(
        "Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The newest checkpoint the runner saw in SF_CHECKPOINT_DIR (its files' newest mtime, never
    # later than when the server heard of it): victims that saved most recently go first.
    checkpoint_at = models.DateTimeField(null=True, blank=True)
    backend_name = models.CharField(max_length=100, help_text="deterministic: run_id + attempt")
    job_ref = models.CharField(max_length=200, blank=True)
    submitted_at = models.DateTimeField(default=timezone.now)
    # When a launcher last claimed the attempt to call the engine (jobs.loops.launcher): a
    # fresh claim keeps every other worker off it; one older than the lease means the claimer
    # died, and the next launcher looks for the backend object by name before submitting.
    launch_claimed_at = models.DateTimeField(null=True, blank=True)
    pending_at = models.DateTimeField(null=True, blank=True)
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)
    # The engine's own start and end of the run (Slurm's Start/End, a pod's container run,
    # Ray's job times), as it reported them: the billed times above never leave them
    # (jobs.ledger.clocks). None where the engine has not said.
    engine_start = models.DateTimeField(null=True, blank=True)
    engine_end = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    end_reason = models.TextField(blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The last moment the server saw the attempt alive (a log line, metric point or start
    # report it accepted, the engine reporting it running): no end is billed before it.
    alive_at = models.DateTimeField(null=True, blank=True)
    # Part of the attempt's job token and bootstrap credential, so neither can be made
    # without this row (a leaked or guessed signing key alone forges nothing).
    token_nonce = models.CharField(max_length=32, default=new_token_nonce, editable=False)
    # When the runner exchanged its one-time bootstrap credential for the job token (Ray,
    # Kubernetes: engines whose job specs others can read).
    bootstrap_used_at = models.DateTimeField(null=True, blank=True)
    # The ranks >= 1 of a multi-node attempt whose runners exchanged it, each once, where each
    # rank has a runner of its own (Kubernetes: a pod per rank); rank 0's is bootstrap_used_at.
    bootstrap_ranks = models.JSONField(default=list, blank=True)
    native_state = models.CharField(max_length=50, blank=True)
    # The backend's own words for a waiting attempt (Slurm's pending reason, a pod's
    # waiting reason), shown in Diagnostics.
    native_message = models.TextField(blank=True)
    # Why a failed attempt failed: a `sf.contract.Failure` value, whose `retryable()` are
    # retried automatically; "" for an attempt that did not fail.
    failure = models.CharField(max_length=20, blank=True)
    # Set, once, in the transaction that adds the ended attempt to the usage records.
    metered = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="one_attempt_number"),
        ]
        indexes = [
            # Running and not-yet-recorded attempts: the part of every usage answer the usage
            # records do not hold yet.
            models.Index(
                fields=["job"], condition=models.Q(metered=False), name="attempt_unmetered"
            ),
            # Of those, the ones that started: what a usage answer reads. Without it the read
            # scans every attempt, since the one above also holds each pending, never-started
            # attempt, and a usage answer slowed as the ledger grew (`bench/http_bench.py`).
            models.Index(
                fields=["job"],
                condition=models.Q(metered=False, start_time__isnull=False),
                name="attempt_started_unmetered",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.backend_name}"


class JobEvent(models.Model):
    """Append-only timeline: status changes and notable backend observations."""

    class Kind(models.TextChoices):
        STATUS = "status"
        OBSERVATION = "observation"
        NOTE = "note"  # lifecycle decisions: auto-retry planned, follow-ons created or not

    # event_job_order (job, id) leads with the job: no index of its own (see Job.team).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events", db_index=False)
    time = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=12, choices=Kind.choices)
    from_status = models.CharField(max_length=10, blank=True)
    to_status = models.CharField(max_length=10, blank=True)
    reason = models.TextField(blank=True)
    actor = models.CharField(max_length=150)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["job", "id"], name="event_job_order")]


class Webhook(models.Model):
    """Where to tell someone that a job ended, failed, was preempted or waits too long
    (jobs.webhooks). Scoped to its owner's own jobs, or to every job of one team (set up by a
    team admin). `url` is an http(s) URL (a Slack incoming webhook gets Slack's body) or a
    mailto: address (Django's email backend)."""

    class Event(models.TextChoices):
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        STOPPED = "stopped"
        PREEMPTED = "preempted"
        WAITING = "waiting-too-long"
        BUDGET = "budget-alert"  # a team reached a threshold of its money budget (no job)
        IDLE = "idle"  # idle past its team's idle_after: warned, then noticed and paused
        HUNG = "suspected-hang"  # its ranks made no progress for its team's hang_after

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, help_text="empty: the owner's jobs"
    )
    url = models.CharField(max_length=2000)
    events = models.JSONField(default=list)
    secret = models.CharField(max_length=64, editable=False)
    wait_after_s = models.PositiveIntegerField(
        default=3600, help_text="waiting-too-long: queued longer than this"
    )
    allow_private = models.BooleanField(
        default=False,
        help_text="staff only: may deliver to loopback, link-local and private addresses",
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"webhook {self.pk} ({self.url[:60]})"


class WebhookDelivery(models.Model):
    """One notification to one webhook, tried until delivered or a day has passed (at least
    once; `key` is the receiver's idempotency key). `tries` is its delivery log."""

    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        GAVE_UP = "gave-up"

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    job = models.ForeignKey(Job, null=True, on_delete=models.CASCADE, related_name="+")
    event = models.CharField(max_length=20)
    key = models.CharField(max_length=80)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    payload = models.JSONField(null=True, blank=True)
    tries = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    next_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["webhook", "key"], name="one_delivery_per_key"),
        ]
        indexes = [models.Index(fields=["state", "next_at"], name="delivery_due")]
