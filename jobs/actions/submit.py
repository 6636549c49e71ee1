"""Submitting a job: every check a submission must pass, then the QUEUED row and its first
event in one transaction (`jobs.ledger.creation`); the scheduler is kicked after commit.

Checks that can be made at submit are made here (team, role, priority, cluster, "could never
fit", environment names, the snapshot and its `starforge.toml` follow-ons), so a job in the
queue is one the scheduler can admit once there is room.
"""

import logging
import re
import shlex
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet

from jobs import grants
from jobs.errors import BadRequest, Forbidden, NotFound
from jobs.executors import Capacity, executor_for, gpu_type_matches
from jobs.executors.base import ENV_NAME, GPU_VISIBILITY_VARS, check_request
from jobs.gpus import to_total_gpus
from jobs.ledger import creation
from jobs.models import Cluster, Job, Membership, ScheduleWindow, Snapshot, Team
from jobs.reads import prepared, teams
from jobs.schemas import JobIn
from jobs.stores.snapshots import SnapshotRefused, owned_snapshot, read_project_file

log = logging.getLogger(__name__)
MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)
MIB_PER_UNIT = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}
MAX_MEMORY_MB = 64 * 1024 * 1024  # 64 TiB per node: past any machine


def parse_memory(text: str) -> int:
    """MiB in a memory size as Slurm and Kubernetes users write it: 64G, 512M, 1.5T, 64GiB
    (binary units; a bare number is MiB, as Slurm's --mem reads it)."""
    match = MEMORY.fullmatch(text.strip())
    if match is None:
        raise BadRequest(
            f"--memory {text!r} is not a memory size; write a number with a unit, e.g. 64G, "
            "512M or 1.5T"
        )
    mib = float(match[1]) * MIB_PER_UNIT[match[2].upper()]
    if not 1 <= mib <= MAX_MEMORY_MB:
        raise BadRequest(f"--memory {text!r} must be from 1M to 64T per node")
    return int(mib)


@dataclass(frozen=True)
class Prepared:
    """What a submission resolved and checked before its transaction."""

    gpus_per_node: int
    team: Team
    cluster: Cluster
    capacity: Capacity
    memory_mb: int | None
    window: ScheduleWindow | None


def submit_job(user: User, data: JobIn) -> Job:
    prepared = prepare(user, data)
    with transaction.atomic():
        job = creation.build(
            name=data.name or " ".join(data.entrypoint)[:200],
            entrypoint=data.entrypoint,
            env=data.env,
            **job_fields(user, data, prepared),
        )
        creation.queue([job], "submitted", actor=user.username)
    return job


def prepare(user: User, data: JobIn) -> Prepared:
    """Every check of a submission that needs no lock: team and role, cluster and what it
    could ever hold, priority, environment, window."""
    gpus_per_node = asked_gpus_per_node(data)
    membership = _resolve_membership(user, data.team)
    team = membership.team
    cluster = _resolve_cluster(team, data.cluster)
    # The one engine question of a submit, asked outside the transaction: what the cluster has.
    capacity = executor_for(cluster).capacity()
    try:
        check_request(cluster, nodes=data.nodes, image=data.image or "")
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    _check_fits(team, cluster, capacity, to_total_gpus(gpus_per_node, data.nodes))
    _check_gang(cluster, capacity, data.nodes, gpus_per_node, data.gpu_type or "")
    memory_mb = parse_memory(data.memory) if data.memory is not None else None
    _check_priority(user, membership, data.priority)
    _check_env(data.env)
    window = _resolve_window(data.window)
    if data.window_policy == Job.WindowPolicy.PAUSE and not (
        window or team.window_id or cluster.window_id
    ):
        raise BadRequest(
            "--window-policy pause needs a window: pass --window NAME, or use a team or "
            "cluster that has one"
        )
    return Prepared(gpus_per_node, team, cluster, capacity, memory_mb, window)


def asked_gpus_per_node(data: JobIn) -> int:
    """The GPUs per node a body asks for: its `gpus_per_node`, or `gpus` (the same count under
    its first name in /api/v1), or 1; both given must agree."""
    named = [name for name in ("gpus_per_node", "gpus") if name in data.model_fields_set]
    given = {name: getattr(data, name) for name in named}
    if len(set(given.values())) > 1:
        raise BadRequest(
            f"gpus_per_node is {data.gpus_per_node} but gpus is {data.gpus}: both are the GPUs "
            "per node (gpus is its older name), so give one of them, or both alike"
        )
    return next(iter(given.values()), data.gpus_per_node)


def job_fields(user: User, data: JobIn, prepared: Prepared) -> dict:
    """The new job's columns but its name, entrypoint and environment (and what
    `jobs.ledger.creation.build` gives every job); inside the submission's transaction (the
    snapshot's row is locked, so a concurrent job deletion cannot remove the blob)."""
    team, cluster = prepared.team, prepared.cluster
    snapshot = _resolve_snapshot(data.snapshot, team)
    follow_ons = _follow_on_specs(prepared, data.then, data.gpu_type or "", snapshot)
    return {
        "team": team,
        "user": user,
        "cluster": cluster,
        "total_gpus": to_total_gpus(prepared.gpus_per_node, data.nodes),
        "nodes": data.nodes,
        "gpu_type": data.gpu_type or "",
        "cpus": data.cpus,
        "memory_mb": prepared.memory_mb,
        "image": data.image or "",
        "snapshot": snapshot,
        "priority": data.priority,
        "window": prepared.window,
        "window_policy": data.window_policy,
        "pending_deadline_s": data.pending_deadline_s,
        "max_retries": _or(data.max_retries, team.default_max_retries),
        "retry_cooldown_s": _or(data.retry_cooldown_s, team.default_retry_cooldown_s),
        "time_limit_s": data.time_limit_s or team.default_time_limit_s,
        "then": list(follow_ons),
        "follow_on_specs": follow_ons,
    }


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _memberships(shape: tuple, user_id: int, name: str = "") -> QuerySet:
    (named,) = shape
    memberships = Membership.objects.filter(user_id=user_id)
    if named:
        memberships = memberships.filter(team__name=name)
    columns = (*prepared.columns(Membership), *prepared.columns(Team, "team"))
    return memberships.order_by("pk").values_list(*columns)[:1]


# Every submission reads its membership: its SQL is built once (an ORM read cost ~1.5 ms a
# submit, most of it building the query and its models). The cluster's is `grants.USABLE`.
MEMBERSHIP = prepared.Prepared(_memberships)


def _resolve_membership(user: User, name: str | None) -> Membership:
    """The user's membership of the team named (or their first), with its team loaded."""
    rows = MEMBERSHIP.rows((bool(name),), user_id=user.pk, **({"name": name} if name else {}))
    if not rows:
        if name:
            raise Forbidden(f"you are not a member of team {name!r}")
        raise Forbidden("you belong to no team; ask an admin to add you to one")
    membership, membership.team = prepared.models_of(rows[0], Membership, Team)
    if membership.role == Membership.Role.VIEWER:
        raise Forbidden(
            f"your role in team {membership.team.name} is viewer; viewers cannot submit jobs"
        )
    return membership


def _check_priority(user: User, membership: Membership, priority: int) -> None:
    """Members raise priority up to the team's limit; team admins and staff up to 100."""
    if user.is_staff or membership.role == Membership.Role.ADMIN:
        return
    limit = membership.team.max_member_priority
    if priority > limit:
        raise Forbidden(
            f"priority {priority} is above {limit}, the highest a member of team "
            f"{membership.team.name} may give; ask a team admin to raise it"
        )


def _resolve_cluster(team: Team, name: str | None) -> Cluster:
    """The named cluster, else the team's default: one the team may use (`jobs.grants`; any
    other gets the same 404 as a cluster that does not exist), and enabled."""
    cluster = grants.usable_cluster(team, name)
    if not cluster.enabled:
        raise BadRequest(f"cluster {cluster.name} is disabled")
    return cluster


def _check_fits(team: Team, cluster: Cluster, capacity: Capacity, total_gpus: int) -> None:
    # Past its quota a job may start only on borrowed GPUs, all of them, within the cap.
    if total_gpus > max(team.gpu_quota, team.borrow_cap or 0):
        may_borrow = f" and it may borrow at most {team.borrow_cap}" if team.borrow_cap else ""
        raise BadRequest(
            f"this job asks for {total_gpus} GPUs but team {team.name}'s quota is "
            f"{team.gpu_quota}{may_borrow}; it could never start"
        )
    if team.max_gpus_per_job is not None and total_gpus > team.max_gpus_per_job:
        raise BadRequest(
            f"this job asks for {total_gpus} GPUs but team {team.name} allows at most "
            f"{team.max_gpus_per_job} per job"
        )
    if team.user_gpu_cap is not None and total_gpus > team.user_gpu_cap:
        raise BadRequest(
            f"this job asks for {total_gpus} GPUs but team {team.name} caps each member at "
            f"{team.user_gpu_cap} GPUs at once; it could never start"
        )
    if capacity.reachable and total_gpus > capacity.total_gpus:
        raise BadRequest(
            f"this job asks for {total_gpus} GPUs but cluster {cluster.name} has "
            f"{capacity.total_gpus}; it could never start"
        )


def _check_gang(
    cluster: Cluster, capacity: Capacity, nodes: int, gpus_per_node: int, gpu_type: str
) -> None:
    """A job whose nodes the cluster could never hold at once is refused now, not queued."""
    if gpu_type and not gpus_per_node:
        raise BadRequest(f"--gpu-type {gpu_type} needs GPUs: pass --gpus 1 or more")
    if not capacity.reachable:
        return  # asked again by every scheduler tick; the waiting reason says why
    types = capacity.gpu_types
    if gpu_type and not any(gpu_type_matches(gpu_type, t) for t in types):
        have = ", ".join(types) if types else "no GPU types (it names none)"
        raise BadRequest(f"cluster {cluster.name} has no {gpu_type} GPUs; it has {have}")
    if not gpus_per_node and nodes == 1:
        return
    largest = capacity.largest_gang(gpus_per_node, gpu_type)
    if nodes > largest:
        what = f"{gpus_per_node} {gpu_type + ' ' if gpu_type else ''}GPUs"
        raise BadRequest(
            f"this job asks for {nodes} nodes with {what} each but cluster {cluster.name} "
            f"could hold at most {largest} such node{'s' if largest != 1 else ''} at once; "
            "it could never start"
        )


def _check_env(env: dict[str, str]) -> None:
    for key in env:
        if not ENV_NAME.fullmatch(key):
            raise BadRequest(f"environment variable name {key!r} is not valid")
        if key.startswith("SF_"):
            raise BadRequest(
                f"environment variable {key} is set by Starforge and cannot be overridden"
            )
        if key in GPU_VISIBILITY_VARS:
            raise BadRequest(
                f"environment variable {key} chooses which GPUs a job sees; Starforge sets it "
                "from the GPUs it allocates (ask for them with --gpus)"
            )


def _resolve_snapshot(sha: str | None, team: Team) -> Snapshot | None:
    """The team's own snapshot, locked; another team's is refused exactly like an unknown one."""
    if sha is None:
        return None
    snapshot = owned_snapshot(team, sha)
    if snapshot is None:
        raise NotFound(
            f"snapshot {sha[:64]!r} is unknown to team {team.name}; upload it to "
            f"/api/v1/snapshots?team={team.name} first"
        )
    return snapshot


def _follow_on_specs(
    prepared: Prepared, names: list[str], gpu_type: str, snapshot: Snapshot | None
) -> dict:
    """The follow-ons' `[then.NAME]` tables, each checked as a job of one node that asks for
    its parent's GPU type (`jobs.ledger.creation.follow_on`)."""
    if not names:
        return {}
    if snapshot is None:
        raise BadRequest("--then needs a snapshot holding starforge.toml with [then.<name>]")
    try:
        project = read_project_file(snapshot.sha256)
    except SnapshotRefused as exc:
        raise BadRequest(str(exc)) from exc
    specs = {}
    for name in names:
        spec = project.get("then", {}).get(name)
        if not isinstance(spec, dict):
            raise BadRequest(
                f"--then {name} needs a [then.{name}] table in starforge.toml at "
                "the root of the submitted directory"
            )
        specs[name] = _check_follow_on(prepared, name, spec, gpu_type)
    return specs


def _check_follow_on(prepared: Prepared, name: str, spec: dict, gpu_type: str) -> dict:
    team, cluster, capacity = prepared.team, prepared.cluster, prepared.capacity
    entrypoint = spec.get("entrypoint")
    argv = _follow_on_argv(entrypoint)
    if argv is None:
        raise BadRequest(
            f"[then.{name}] in starforge.toml needs an entrypoint: a command string "
            "or a list of non-empty strings, without NUL characters and with balanced quotes"
        )
    # A follow-on runs on one node: its `gpus` are per node and in all alike.
    gpus = spec.get("gpus", 0)
    if type(gpus) is not int or not 0 <= gpus <= team.gpu_quota:
        raise BadRequest(
            f"[then.{name}] gpus must be an integer from 0 to team "
            f"{team.name}'s quota of {team.gpu_quota}"
        )
    if capacity.reachable and gpus > capacity.total_gpus:
        raise BadRequest(
            f"[then.{name}] asks for {gpus} GPUs but cluster {cluster.name} has "
            f"{capacity.total_gpus}; it could never start"
        )
    if gpus and gpu_type and capacity.reachable and capacity.largest_gang(gpus, gpu_type) < 1:
        raise BadRequest(
            f"[then.{name}] asks for {gpus} {gpu_type} GPUs (its parent's type) on one node but "
            f"cluster {cluster.name} has no such node; it could never start"
        )
    return {"entrypoint": argv, "gpus": gpus}


def _follow_on_argv(entrypoint: object) -> list[str] | None:
    """The argv a follow-on's entrypoint becomes; None if unusable.

    Split and checked at submit, so creating the follow-on inside the reconciler's transaction
    that ends the parent cannot fail on it.
    """
    if isinstance(entrypoint, str):
        try:
            argv = shlex.split(entrypoint)
        except ValueError:
            return None
    elif isinstance(entrypoint, list) and all(isinstance(a, str) for a in entrypoint):
        argv = entrypoint
    else:
        return None
    if not argv or any(not a or "\x00" in a for a in argv):
        return None
    return argv


def _resolve_window(name: str | None) -> ScheduleWindow | None:
    if name is None:
        return None
    return teams.named(ScheduleWindow, name, "schedule window", "windows")
