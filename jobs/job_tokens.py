"""Owns the runner's credentials: the job token, the one-time bootstrap credential, and which
of them (with the record-signing key) a launch hands its runner (`runner_credentials`).

A job token lets one attempt's runner fetch its snapshot and ship its logs, metrics and start
report; nothing else. It is `<job>.<attempt>.<nonce>` signed with the installation's secret
key, and it is honoured only while the attempt's row still carries that nonce and the attempt
is its job's current one, open or closed less than the ingest grace ago (`jobs.api.ingest`), so it
expires with the attempt and names exactly one.

Where others can read a job's specification (the Ray dashboard's job list, a pod spec), the
engine gets a bootstrap credential instead, which the runner exchanges once, at start, for the
job token (`POST /api/v1/ingest/token`): read later from the spec, it is spent. Where each
rank of a multi-node job is a pod with a runner of its own (Kubernetes), the pods share one
spec and so one credential, and it is spent once per rank (`spend_bootstrap`).

The job's own code gets neither: it gets the attempt's MLflow tracking token
(`sf.contract.tracking_token`, derived one way from the job token), which `tracking_attempt_of`
recomputes from the attempt's current job token, so it names one attempt and dies with it.
"""

import hmac

from django.core import signing
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import QuerySet
from django.utils import timezone
from sf.contract import (
    BOOTSTRAP_TOKEN_VAR,
    JOB_TOKEN_VAR,
    RECORD_KEY_VAR,
    TRACKING_TOKEN_PREFIX,
    tracking_token,
)

from jobs.executors.base import executor_class, record_key
from jobs.models import BIGINT_MAX, Attempt, Job
from jobs.reads.prepared import Prepared

JOB_TOKEN_SALT = "starforge.job-token"
BOOTSTRAP_SALT = "starforge.job-bootstrap"


def job_token_for(attempt: Attempt) -> str:
    return _sign(JOB_TOKEN_SALT, attempt)


def bootstrap_token_for(attempt: Attempt) -> str:
    return _sign(BOOTSTRAP_SALT, attempt)


def job_token(job_id: int, number: int) -> str:
    """The job token of attempt `number` of a job (for tools and tests that hold only ids)."""
    nonce = (
        Attempt.objects.filter(job_id=job_id, number=number)
        .values_list("token_nonce", flat=True)
        .first()
    )
    return signing.Signer(salt=JOB_TOKEN_SALT).sign(f"{job_id}.{number}.{nonce or '-'}")


def _sign(salt: str, attempt: Attempt) -> str:
    return signing.Signer(salt=salt).sign(
        f"{attempt.job_id}.{attempt.number}.{attempt.token_nonce}"
    )


def attempt_of(token: str, salt: str = JOB_TOKEN_SALT) -> Attempt | None:
    """The attempt (with its job) a token of this kind names, or None for anything else: a bad
    signature, another kind of credential, an attempt that does not exist or another nonce."""
    try:
        job_id, number, nonce = signing.Signer(salt=salt).unsign(token).split(".")
        key = {"job_id": int(job_id), "number": int(number)}
    except (signing.BadSignature, ValueError):
        return None
    rows = _ATTEMPT_WITH_JOB.rows(**key)
    if not rows or not hmac.compare_digest(rows[0][_NONCE], nonce):
        return None
    return _attempt_from(rows[0])


def tracking_attempt_of(token: str) -> Attempt | None:
    """The attempt (with its job) an MLflow tracking token names, or None for anything else:
    not `sft.<job>.<attempt>.<mac>`, an attempt that does not exist, or a mac that is not the
    one of the attempt's current job token (another nonce, a forged or an old token)."""
    if not token.startswith(TRACKING_TOKEN_PREFIX):
        return None
    try:
        job_id, number, _mac = token[len(TRACKING_TOKEN_PREFIX) :].split(".")
        key = {"job_id": int(job_id), "number": int(number)}
    except ValueError:
        return None
    if not (0 < key["job_id"] <= BIGINT_MAX and 0 < key["number"] < 2**31):
        return None
    rows = _ATTEMPT_WITH_JOB.rows(**key)
    if not rows:
        return None
    attempt = _attempt_from(rows[0])
    if not hmac.compare_digest(tracking_token(job_token_for(attempt)), token):
        return None
    return attempt


def _attempt_from(row: list) -> Attempt:
    width = len(_ATTEMPT_FIELDS)
    attempt = Attempt.from_db(DEFAULT_DB_ALIAS, _ATTEMPT_FIELDS, row[:width])
    attempt.job = Job.from_db(DEFAULT_DB_ALIAS, _JOB_FIELDS, row[width:])
    return attempt


# Every ingest request reads its attempt and job: one prepared read of both rows' columns, made
# into the models as a select_related query would (that query's build and plan were ~3 ms of a
# metric batch's ~20 on the runner's path).
_ATTEMPT_FIELDS = tuple(f.attname for f in Attempt._meta.concrete_fields)
_JOB_FIELDS = tuple(f.attname for f in Job._meta.concrete_fields)
_NONCE = _ATTEMPT_FIELDS.index("token_nonce")


def _attempt_with_job(shape: tuple, job_id: int, number: int) -> QuerySet:
    job_columns = (f"job__{name}" for name in _JOB_FIELDS)
    return Attempt.objects.filter(job_id=job_id, number=number).values_list(
        *_ATTEMPT_FIELDS, *job_columns
    )


_ATTEMPT_WITH_JOB = Prepared(_attempt_with_job)


def spend_bootstrap(attempt: Attempt, rank: int) -> bool:
    """Spend the attempt's bootstrap credential for `rank`; False when that rank has already.

    Rank 0 (every single-node attempt) spends it as `bootstrap_used_at`; the others each add
    themselves to `bootstrap_ranks` under the row's lock, so two exchanges of one rank cannot
    both succeed."""
    if rank == 0:
        return bool(
            Attempt.objects.filter(pk=attempt.pk, bootstrap_used_at__isnull=True).update(
                bootstrap_used_at=timezone.now()
            )
        )
    with transaction.atomic():
        locked = Attempt.objects.select_for_update().filter(pk=attempt.pk)
        spent = locked.values_list("bootstrap_ranks", flat=True).get()
        if rank in spent:
            return False
        Attempt.objects.filter(pk=attempt.pk).update(bootstrap_ranks=sorted([*spent, rank]))
    return True


def runner_credentials(kind: str, attempt: Attempt) -> dict[str, str]:
    """What the runner authenticates with; the runner keeps it from the job's own code.

    Engines whose job specs others can read (the Ray dashboard, pod specs) get a one-time
    bootstrap credential, spent at start; the others get the job token and the key the runner
    signs its start and exit records with (`jobs.executors.base.read_record`).
    """
    if getattr(executor_class(kind), "BOOTSTRAP_TOKEN", False):
        return {BOOTSTRAP_TOKEN_VAR: bootstrap_token_for(attempt)}
    return {
        JOB_TOKEN_VAR: job_token_for(attempt),
        RECORD_KEY_VAR: record_key(attempt.backend_name),
    }
