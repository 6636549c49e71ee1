"""Storing the MLflow params and tags a job's code logs into its attempt (`TrackingValue`).

A param is the run's configuration: as in MLflow, it keeps its first value, logging it again
with the same value changes nothing, and another value is refused (`ParamChanged`). A tag keeps
its last value. A batch is stored in one statement per kind, whatever its size.
"""

from django.db import transaction

from jobs.models import TrackingValue

K = TrackingValue.Kind


class ParamChanged(ValueError):
    """A param logged again with another value: the sentence names it and both values."""


def log_params(job_id: int, attempt: int, params: dict[str, str]) -> None:
    """Keep `params` for the attempt; ParamChanged (and nothing stored) when one already holds
    another value."""
    if not params:
        return
    with transaction.atomic():
        TrackingValue.objects.bulk_create(
            [_row(job_id, attempt, K.PARAM, key, value) for key, value in params.items()],
            ignore_conflicts=True,
        )
        stored = TrackingValue.objects.filter(
            job_id=job_id, attempt=attempt, kind=K.PARAM, key__in=list(params)
        ).values_list("key", "value")
        for key, value in stored:
            if params[key] != value:
                raise ParamChanged(
                    f"param {key!r} of this run is {value!r}: a param keeps its first value "
                    f"(MLflow's rule), so {params[key]!r} cannot replace it"
                )


def set_tags(job_id: int, attempt: int, tags: dict[str, str]) -> None:
    """Keep `tags` for the attempt, replacing the values of keys it already has."""
    if not tags:
        return
    TrackingValue.objects.bulk_create(
        [_row(job_id, attempt, K.TAG, key, value) for key, value in tags.items()],
        update_conflicts=True,
        unique_fields=["job", "attempt", "kind", "key"],
        update_fields=["value"],
    )


def _row(job_id: int, attempt: int, kind: str, key: str, value: str) -> TrackingValue:
    return TrackingValue(job_id=job_id, attempt=attempt, kind=kind, key=key, value=value)
