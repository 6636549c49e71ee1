"""Cluster grants: which clusters a team may use, the one rule every path asks.

A cluster is used only by the teams staff granted it to (`ClusterGrant`). Submit and arrays
(`jobs.actions`), retry and resume, a follow-on's creation (`jobs.ledger.lifecycle`), a team
admin's choice of default cluster (`jobs.actions.teams`) and the scheduler's admission all ask
here. A cluster the team may not use is refused exactly as one that does not exist: 404 and the
same sentence, which names only the team's own clusters, so a member cannot learn which others
exist.

Staff grant and revoke through `grant` and `revoke`: the Django admin, `POST` and `DELETE
/api/v1/teams/NAME/clusters`, `manage.py cluster grant|revoke`. A team may always use its
default cluster: saving a team with a default grants it (`Team.save`), and revoking the
default's grant clears the default. A revoke stops no running job; the team's QUEUED jobs on
the cluster are stopped by the scheduler's next tick (`queued_without_grant`), and with them a
resumed job or an automatic retry that comes back to the queue there.
"""

import logging
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet

from jobs.errors import BadRequest, Forbidden, NotFound
from jobs.models import Cluster, ClusterGrant, Job, Team
from jobs.reads import prepared
from jobs.states import JobStatus

log = logging.getLogger(__name__)


def may_use(team_id: int, cluster_id: int) -> bool:
    return ClusterGrant.objects.filter(team_id=team_id, cluster_id=cluster_id).exists()


def usable_clusters(team: Team) -> QuerySet[Cluster]:
    """The clusters the team may use, by name."""
    return Cluster.objects.filter(grants__team=team).order_by("name")


def usable_names(team: Team) -> list[str]:
    return list(usable_clusters(team).values_list("name", flat=True))


def refusal(team: Team, name: str) -> NotFound:
    """The answer to a cluster the team may not use, word for word the same whether the
    cluster exists or not."""
    names = ", ".join(usable_names(team)) or "none yet (ask an admin to grant one)"
    return NotFound(f"team {team.name} has no cluster {name[:64]!r}; clusters it may use: {names}")


def _usable(shape: tuple, team: int, key: int | str) -> QuerySet:
    (by_name,) = shape
    found = Cluster.objects.filter(grants__team_id=team)
    found = found.filter(name=key) if by_name else found.filter(pk=key)
    return found.values_list(*prepared.columns(Cluster))


# Every submission resolves its cluster: the SQL is built once (see `jobs.reads.prepared`).
USABLE = prepared.Prepared(_usable)


def usable_cluster(team: Team, name: str | None = None) -> Cluster:
    """The cluster called `name` if the team may use it, else the refusal an unknown cluster
    gets. Without a name: the team's default, else (as before teams had defaults) `local`."""
    if name:
        found = USABLE.rows((True,), team=team.pk, key=name)
        if not found:
            raise refusal(team, name)
    elif team.default_cluster_id is not None:
        found = USABLE.rows((False,), team=team.pk, key=team.default_cluster_id)
        if not found:  # a default set in the database by hand, never granted
            raise refusal(team, str(team.default_cluster))
    else:
        found = USABLE.rows((True,), team=team.pk, key="local")
        if not found:
            names = ", ".join(usable_names(team)) or "none yet (ask an admin to grant one)"
            raise BadRequest(
                f"team {team.name} has no default cluster; pass --cluster (clusters it may "
                f"use: {names})"
            )
    return prepared.models_of(found[0], Cluster)[0]


def check_may_use(team: Team, cluster: Cluster) -> None:
    """Raise the refusal when the team may not use the cluster (retry, resume)."""
    if not may_use(team.pk, cluster.pk):
        raise refusal(team, cluster.name)


def queued_without_grant() -> list[tuple[int, str, str]]:
    """QUEUED jobs whose team may not use their cluster (its grant was revoked after they were
    queued): (job id, team name, cluster name), for the scheduler to stop, never to admit."""
    granted = ClusterGrant.objects.filter(team_id=OuterRef("team_id"), cluster=OuterRef("cluster"))
    queued = Job.objects.filter(status=JobStatus.QUEUED).filter(~Exists(granted))
    return list(queued.order_by("pk").values_list("pk", "team__name", "cluster__name"))


def grant(team: Team, cluster: Cluster, by: str) -> bool:
    """Let the team use the cluster; False when it already could."""
    _, created = ClusterGrant.objects.get_or_create(
        team=team, cluster=cluster, defaults={"granted_by": by[:150]}
    )
    if created:
        log.info("cluster %s granted to team %s by %s", cluster.name, team.name, by)
    return created


@dataclass(frozen=True)
class Revoked:
    default_cleared: bool  # it was the team's default cluster, which is now none
    queued: int  # the team's QUEUED jobs on it, which the scheduler's next tick stops


def revoke(team: Team, cluster: Cluster, by: str) -> Revoked:
    """The team may no longer use the cluster: no submit, retry, resume or follow-on there,
    and its queued jobs there are not admitted. Running jobs go on."""
    with transaction.atomic():
        deleted, _ = ClusterGrant.objects.filter(team=team, cluster=cluster).delete()
        if not deleted:
            raise NotFound(f"team {team.name} has no grant of cluster {cluster.name}")
        cleared = Team.objects.filter(pk=team.pk, default_cluster=cluster).update(
            default_cluster=None
        )
        queued = Job.objects.filter(team=team, cluster=cluster, status=JobStatus.QUEUED).count()
    log.info("cluster %s revoked from team %s by %s", cluster.name, team.name, by)
    return Revoked(default_cleared=bool(cleared), queued=queued)


def grant_named(actor: User, team: Team, name: str) -> tuple[Cluster, bool]:
    """Staff let the team use the cluster called `name` (the API's door)."""
    check_staff(actor, team)
    cluster = any_cluster(name)
    return cluster, grant(team, cluster, actor.username)


def revoke_named(actor: User, team: Team, name: str) -> Revoked:
    """Staff take the cluster called `name` from the team (the API's door)."""
    check_staff(actor, team)
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        raise NotFound(f"team {team.name} has no grant of cluster {name[:64]!r}")
    return revoke(team, cluster, actor.username)


def any_cluster(name: str) -> Cluster:
    """For staff, who see every cluster: the one called `name`, or a 400 naming them all."""
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        known = ", ".join(Cluster.objects.order_by("name").values_list("name", flat=True))
        raise BadRequest(f"unknown cluster {name[:64]!r}; known clusters: {known or 'none'}")
    return cluster


def check_staff(actor: User, team: Team) -> None:
    """Only staff grant and revoke clusters; a team's own admins see theirs but cannot."""
    if not actor.is_staff:
        raise Forbidden(
            f"only staff grant and revoke clusters; ask an admin to change team {team.name}'s"
        )
