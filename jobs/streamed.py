"""What an attempt's code streams into the ledger: its log (`LogStream`, and `LogChunk`s with
object storage), its metric points packed in chunks (`MetricStream`, `MetricChunk`), their
series extents and rollups (`MetricSeries`, `MetricRollup`), and its MLflow params and tags
(`TrackingValue`). Every row here belongs to one attempt of a job and is written by the stores
(`jobs.stores`), never by the job. `jobs.models` imports these so that the app and every reader
find them there; this module names the job by its label and imports nothing of the ledger's.
"""

from django.db import models


class LogStream(models.Model):
    """Bookkeeping for one attempt's append-only log; its row lock orders appends.

    `size` is the committed length of the log in bytes, whether it lives in one local file or,
    with object storage, in `LogChunk`s.
    """

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="log_streams")
    attempt = models.PositiveIntegerField()
    next_seq = models.BigIntegerField(default=0)
    size = models.BigIntegerField(default=0)
    # Lines dropped past SF_ATTEMPT_MAX_LOG_BYTES (their seqs still advance next_seq).
    dropped_lines = models.BigIntegerField(default=0)
    # With object storage: the ended attempt's log is one object, and every other object under
    # its key prefix (left by a compaction that crashed) has been deleted.
    objects_swept = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt"], name="one_stream_per_attempt"),
        ]


class LogChunk(models.Model):
    """Bytes [start, start + length) of an attempt's log, with object storage only (which
    cannot append): each batch is a chunk holding its bytes (`data`) in the ledger until
    compaction moves a run of them into one object of the store and one chunk without data
    (jobs.stores.logstore). The chunks of a stream tile [0, size) without gaps or overlaps;
    `start` and `length` count the log's own bytes, whatever form `data` keeps them in.
    """

    stream = models.ForeignKey(LogStream, on_delete=models.CASCADE, related_name="chunks")
    start = models.BigIntegerField()
    length = models.BigIntegerField()
    data = models.BinaryField(null=True)  # None: in the store, under the key of [start, end)
    # `data` is the bytes compressed with zlib (every chunk written since 0020; those before
    # hold them as they are).
    zlib = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["stream", "start"], name="one_chunk_per_offset"),
        ]


class MetricKind(models.TextChoices):
    """What a metric point is: logged through the SDK, or sampled by the runner."""

    TRAIN = "train"  # sf.log: loss, learning rate, throughput ...
    VALIDATION = "validation"  # sf.log_validation, and eval follow-on jobs
    SYSTEM = "system"  # sampled by the runner: process CPU/memory, NVML GPU telemetry


class MetricChunk(models.Model):
    """The points one batch added to one metric series (kind, name) of an attempt, packed.

    `points` holds four little-endian columns of the chunk's n points, in seq order: seq and
    step (int64), value and ts (float64; ts is the runner's wall clock in epoch seconds), see
    `jobs.stores.metrics.chunks.pack`. One row per series and batch, not per point: a batch of 2,000
    points of four metrics is four rows, which PostgreSQL writes in a tenth of the time 2,000
    rows took. `seq` numbers the attempt's points as the runner shipped them; a resent batch's
    points already stored are found through `first_seq`..`last_seq` and dropped. `max_step` is
    the chunk's highest step, so the latest point of a series is an index probe.
    """

    # No index of its own: both below lead with job. No constraint in the database either: its
    # check at commit costs every batch, ingest has just looked the job's attempt up, and every
    # delete of a job goes through the ORM (jobs.actions.control.delete_job, which the API and
    # the admin call), whose collector deletes the chunks (CASCADE); no raw SQL deletes jobs. A
    # batch committing while its finished job is deleted can leave chunks behind, of a job id
    # never reused: unreachable, they only take space.
    job = models.ForeignKey(
        "jobs.Job",
        on_delete=models.CASCADE,
        related_name="metric_chunks",
        db_index=False,
        db_constraint=False,
    )
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=MetricKind.choices)
    name = models.CharField(max_length=100)
    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField()
    max_step = models.BigIntegerField()
    points = models.BinaryField()

    class Meta:
        indexes = [
            models.Index(fields=["job", "attempt", "last_seq"], name="metric_chunk_seqs"),
            models.Index(fields=["job", "kind", "name", "max_step"], name="metric_chunk_series"),
        ]


class MetricStream(models.Model):
    """Bookkeeping for one attempt's metric points: how many are stored and how many were
    dropped past SF_ATTEMPT_MAX_METRIC_POINTS; its row lock orders the cap check."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="metric_streams")
    attempt = models.PositiveIntegerField()
    points = models.BigIntegerField(default=0)
    dropped = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt"], name="one_metric_stream"),
        ]


class MetricSeries(models.Model):
    """One metric of a job (kind, name): how many points it holds and their x extent.

    Maintained by `metrics.append` from the points it actually inserted; `series()` reads it to
    decide between the raw points and the rollups. Its row lock orders the rollup merges of a
    series.
    """

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="metric_series")
    kind = models.CharField(max_length=10, choices=MetricKind.choices)
    name = models.CharField(max_length=100)
    count = models.BigIntegerField(default=0)
    min_step = models.BigIntegerField(null=True)
    max_step = models.BigIntegerField(null=True)
    min_ts = models.FloatField(null=True)
    max_ts = models.FloatField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "kind", "name"], name="one_metric_series"),
        ]


class MetricRollup(models.Model):
    """A bucket of one metric series: its first, last, lowest and highest point, and its count.

    On axis "step" bucket b of level k holds the points with floor(step / 2**k) == b; on axis
    "time" those with floor(ts / 2**k) == b (ts in epoch seconds: buckets are fixed, so a point
    logged late or out of order never moves the others). Each point is kept as (x, y) with x
    its step or ts on that axis.
    """

    class Axis(models.TextChoices):
        STEP = "step"
        TIME = "time"

    # No index of its own (one_metric_rollup_bucket leads with the job) and no database
    # constraint: a batch writes some hundred buckets, and checking each against the job row
    # at commit was a fifth of a batch's time (bench: mlflow). The rows are derived data and
    # cannot outlive their job all the same: they are written only under the lock of the
    # attempt's MetricStream row (which keeps its constraint, `jobs.stores.metrics.ingest`),
    # and deleting a job takes those locks before Django's cascade deletes the rollups
    # (`jobs.actions.control.delete_job`).
    job = models.ForeignKey(
        "jobs.Job",
        on_delete=models.CASCADE,
        related_name="metric_rollups",
        db_index=False,
        db_constraint=False,
    )
    kind = models.CharField(max_length=10, choices=MetricKind.choices)
    name = models.CharField(max_length=100)
    axis = models.CharField(max_length=4, choices=Axis.choices)
    level = models.PositiveSmallIntegerField()
    bucket = models.BigIntegerField()
    count = models.BigIntegerField()
    first_x = models.FloatField()
    first_y = models.FloatField()
    last_x = models.FloatField()
    last_y = models.FloatField()
    min_x = models.FloatField()
    min_y = models.FloatField()
    max_x = models.FloatField()
    max_y = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "kind", "name", "axis", "level", "bucket"],
                name="one_metric_rollup_bucket",
            ),
        ]


class TrackingValue(models.Model):
    """An MLflow param or tag a job's code logged into one attempt (`jobs.stores.params`).

    A param keeps its first value (MLflow refuses to change one); a tag keeps its last.
    """

    class Kind(models.TextChoices):
        PARAM = "param"  # mlflow.log_param(s): the run's configuration, on the compare page
        TAG = "tag"  # mlflow.set_tag(s), and the tags MLflow's client sets itself

    # one_tracking_value (job, attempt, kind, key) leads with the job: no index of its own.
    job = models.ForeignKey(
        "jobs.Job", on_delete=models.CASCADE, related_name="tracking_values", db_index=False
    )
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=5, choices=Kind.choices)
    key = models.CharField(max_length=250)
    value = models.TextField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "kind", "key"], name="one_tracking_value"
            ),
        ]
