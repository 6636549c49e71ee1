"""Metric points stored packed: one `MetricChunk` row per series and batch instead of a row per
point. The points stored before are moved into chunks of at most CHUNK points of one series,
in seq order; their series rows and rollups stay as they are (they summarise the same points).
"""

import sys
from array import array
from itertools import groupby, islice

import django.db.models.deletion
from django.db import migrations, models

CHUNK = 2000  # points per chunk of the points moved here: the runner's batch
READ = 50_000
PACKED = ("q", "q", "d", "d")  # seq, step, value, ts: as jobs.stores.metrics.chunks.pack writes them


def _pack(columns):
    arrays = [array(code, column) for code, column in zip(PACKED, columns, strict=True)]
    if sys.byteorder == "big":
        for column in arrays:
            column.byteswap()
    return b"".join(column.tobytes() for column in arrays)


def _unpack(points):
    n = len(points) // (8 * len(PACKED))
    view = memoryview(points)
    out = []
    for i, code in enumerate(PACKED):
        column = array(code)
        column.frombytes(view[i * 8 * n : (i + 1) * 8 * n])
        if sys.byteorder == "big":
            column.byteswap()
        out.append(column)
    return out


def to_chunks(apps, schema_editor):
    MetricPoint = apps.get_model("jobs", "MetricPoint")
    MetricChunk = apps.get_model("jobs", "MetricChunk")
    points = MetricPoint.objects.order_by("job_id", "attempt", "kind", "name", "seq").values_list(
        "job_id", "attempt", "kind", "name", "seq", "step", "value", "ts"
    )
    pending = []
    for key, group in groupby(points.iterator(chunk_size=READ), key=lambda p: p[:4]):
        job_id, attempt, kind, name = key
        # A series is read CHUNK points at a time: one of millions never sits in memory whole.
        while part := list(islice(group, CHUNK)):
            pending.append(
                MetricChunk(
                    job_id=job_id,
                    attempt=attempt,
                    kind=kind,
                    name=name,
                    first_seq=part[0][4],
                    last_seq=part[-1][4],
                    max_step=max(p[5] for p in part),
                    points=_pack([[p[i] for p in part] for i in range(4, 8)]),
                )
            )
            if len(pending) >= 100:
                MetricChunk.objects.bulk_create(pending)
                pending = []
    MetricChunk.objects.bulk_create(pending)


def to_points(apps, schema_editor):
    MetricPoint = apps.get_model("jobs", "MetricPoint")
    MetricChunk = apps.get_model("jobs", "MetricChunk")
    chunks = MetricChunk.objects.order_by("pk").values_list(
        "job_id", "attempt", "kind", "name", "points"
    )
    for job_id, attempt, kind, name, packed in chunks.iterator(chunk_size=100):
        seqs, steps, values, ts = _unpack(packed)
        MetricPoint.objects.bulk_create(
            [
                MetricPoint(
                    job_id=job_id, attempt=attempt, kind=kind, name=name, seq=seq, step=step,
                    value=value, ts=t,
                )
                for seq, step, value, t in zip(seqs, steps, values, ts, strict=True)
            ],
            batch_size=5000,
        )


def external_storage(apps, schema_editor):
    """Packed numbers do not compress: PostgreSQL is told not to try (it would on every chunk
    over 2 kB, and give up)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE jobs_metricchunk ALTER COLUMN points SET STORAGE EXTERNAL"
        )


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0021_log_objects_swept"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricChunk",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("attempt", models.PositiveIntegerField()),
                ("kind", models.CharField(choices=[("train", "Train"), ("validation", "Validation"), ("system", "System")], max_length=10)),
                ("name", models.CharField(max_length=100)),
                ("first_seq", models.BigIntegerField()),
                ("last_seq", models.BigIntegerField()),
                ("max_step", models.BigIntegerField()),
                ("points", models.BinaryField()),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="metric_chunks",
                        to="jobs.job",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["job", "attempt", "last_seq"], name="metric_chunk_seqs"),
                    models.Index(fields=["job", "kind", "name", "max_step"], name="metric_chunk_series"),
                ],
            },
        ),
        migrations.RunPython(external_storage, migrations.RunPython.noop),
        migrations.RunPython(to_chunks, to_points),
        migrations.DeleteModel(name="MetricPoint"),
    ]
