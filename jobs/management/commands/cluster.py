"""`manage.py cluster`: add, change, list and check clusters, and grant them to teams, from a
shell (the admin does the same).

    manage.py cluster add gpu-slurm --kind slurm --set partition=gpu --set account=ml
    manage.py cluster set gpu-slurm --set partition=debug [--unset account] [--disable]
    manage.py cluster list                 # with the teams that may use each
    manage.py cluster check gpu-slurm      # asks the engine for its capacity, now
    manage.py cluster grant gpu-slurm vision nlp
    manage.py cluster revoke gpu-slurm nlp

A team uses only the clusters granted to it (`jobs.grants`); `--default-for TEAM` grants the
cluster to the team as it makes it the team's default.

`--set KEY=VALUE` parses VALUE as JSON when it is valid JSON (numbers, true, {"a": "b"}) and
keeps it as a string otherwise; settings are validated for the kind before anything is saved.
"""

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.db.models import Prefetch

from jobs import grants
from jobs.errors import NotFound
from jobs.executors import executor_for
from jobs.models import Cluster, ClusterGrant, Team


def _parse_sets(pairs: list[str]) -> dict:
    parsed = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"--set takes KEY=VALUE, not {pair!r}")
        try:
            parsed[key] = json.loads(raw)
        except ValueError:
            parsed[key] = raw
    return parsed


class Command(BaseCommand):
    help = (
        "Add, change, list or check clusters (executor kind plus connection settings), and "
        "grant them to teams or revoke them."
    )

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="create a cluster")
        add.add_argument("name")
        add.add_argument("--kind", required=True, choices=Cluster.Kind.values)
        add.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
        add.add_argument("--default-for", action="append", default=[], metavar="TEAM")
        change = sub.add_parser("set", help="change a cluster's settings")
        change.add_argument("name")
        change.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
        change.add_argument("--unset", action="append", default=[], metavar="KEY")
        change.add_argument("--default-for", action="append", default=[], metavar="TEAM")
        enabled = change.add_mutually_exclusive_group()
        enabled.add_argument("--enable", dest="enabled", action="store_true", default=None)
        enabled.add_argument("--disable", dest="enabled", action="store_false")
        sub.add_parser("list", help="list clusters with their settings and health")
        check = sub.add_parser("check", help="ask the engine for its capacity now")
        check.add_argument("name")
        for verb, words in (("grant", "let teams use"), ("revoke", "take from teams")):
            grants_ = sub.add_parser(verb, help=f"{words} the cluster")
            grants_.add_argument("name")
            grants_.add_argument("teams", nargs="+", metavar="TEAM")

    def handle(self, *args, action: str, **options) -> None:
        getattr(self, f"_{action}")(**options)

    def _add(self, name: str, kind: str, set: list[str], default_for: list[str], **_) -> None:
        if Cluster.objects.filter(name=name).exists():
            raise CommandError(f"cluster {name} exists; change it with `cluster set {name}`")
        cluster = Cluster(name=name, kind=kind, settings=_parse_sets(set))
        self._save(cluster, default_for)
        self.stdout.write(f"added cluster {name} ({kind})")

    def _set(
        self, name: str, set: list[str], unset: list[str], default_for: list[str], enabled, **_
    ) -> None:
        cluster = self._get(name)
        cluster.settings = {
            **{k: v for k, v in cluster.settings.items() if k not in unset},
            **_parse_sets(set),
        }
        if enabled is not None:
            cluster.enabled = enabled
        self._save(cluster, default_for)
        self.stdout.write(f"changed cluster {name}")

    def _list(self, **_) -> None:
        granted = ClusterGrant.objects.select_related("team").order_by("team__name")
        for cluster in Cluster.objects.prefetch_related(Prefetch("grants", granted)).order_by(
            "name"
        ):
            health = "enabled" if cluster.enabled else "disabled"
            if cluster.unreachable_since:
                health += f", unreachable: {cluster.unreachable_reason}"
            if cluster.poll_failing_since:
                health += f", poll failing: {cluster.poll_error}"
            settings = json.dumps(cluster.settings, sort_keys=True)
            teams = ", ".join(g.team.name for g in cluster.grants.all()) or "none"
            self.stdout.write(
                f"{cluster.name}\t{cluster.kind}\t{health}\t{settings}\tteams: {teams}"
            )

    def _check(self, name: str, **_) -> None:
        capacity = executor_for(self._get(name)).capacity()
        if not capacity.reachable:
            raise CommandError(f"cluster {name} cannot be reached: {capacity.message}")
        kind = "virtual GPU slots" if capacity.virtual else "GPUs"
        self.stdout.write(f"cluster {name} is reachable: {capacity.total_gpus} {kind}")

    def _grant(self, name: str, teams: list[str], **_) -> None:
        cluster = self._get(name)
        for team in self._teams(teams):
            made = grants.grant(team, cluster, "manage.py cluster grant")
            said = "may now use" if made else "could already use"
            self.stdout.write(f"team {team.name} {said} cluster {name}")

    def _revoke(self, name: str, teams: list[str], **_) -> None:
        cluster = self._get(name)
        for team in self._teams(teams):
            try:
                revoked = grants.revoke(team, cluster, "manage.py cluster revoke")
            except NotFound as exc:
                raise CommandError(exc.detail) from exc
            said = f"team {team.name} may no longer use cluster {name}"
            if revoked.default_cleared:
                said += "; it was the team's default cluster, and the team now has none"
            if revoked.queued:
                said += f"; the scheduler's next tick stops its {revoked.queued} queued jobs there"
            self.stdout.write(said)

    def _teams(self, names: list[str]) -> list[Team]:
        teams = list(Team.objects.filter(name__in=names).order_by("name"))
        missing = set(names) - {t.name for t in teams}
        if missing:
            raise CommandError(f"no team named {', '.join(sorted(missing))}")
        return teams

    def _get(self, name: str) -> Cluster:
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            raise CommandError(f"no cluster named {name!r}; `manage.py cluster list` shows them")
        return cluster

    def _save(self, cluster: Cluster, default_for: list[str]) -> None:
        teams = self._teams(default_for)
        try:
            cluster.full_clean()
        except ValidationError as exc:
            why = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            raise CommandError(why) from exc
        with transaction.atomic():
            cluster.save()
            for team in teams:  # a team may use its default cluster
                grants.grant(team, cluster, "manage.py cluster --default-for")
            Team.objects.filter(pk__in=[t.pk for t in teams]).update(default_cluster=cluster)
