"""What the metrics store keeps of a job, read back for the tests that check it: its rollups,
its series' extents, and the rollups worked out again from the points stored."""

from jobs.models import MetricRollup, MetricSeries
from jobs.stores.metrics.chunks import stored_points
from jobs.stores.metrics.rollups import ROLLUP_FIELDS, aggregate


def rollups(job_id: int) -> dict:
    return {
        row[:5]: list(row[5:])
        for row in MetricRollup.objects.filter(job_id=job_id).values_list(
            "kind", "name", "axis", "level", "bucket", *ROLLUP_FIELDS
        )
    }


def series_rows(job_id: int) -> dict:
    return {
        (row[0], row[1]): list(row[2:])
        for row in MetricSeries.objects.filter(job_id=job_id).values_list(
            "kind", "name", "count", "min_step", "max_step", "min_ts", "max_ts"
        )
    }


def from_scratch(job_id: int) -> tuple[dict, dict]:
    points = [
        (kind, name, step, ts, value) for _, _, kind, name, step, value, ts in stored_points(job_id)
    ]
    return aggregate(points)
