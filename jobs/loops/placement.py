"""Where a job's ranks go, and the GPU types a team holds, as one scheduler tick counts them.

Nodes: on a cluster that reports its nodes, a job is admitted only with every rank placed on a
node with room for it, all at once (gang admission, docs/ARCHITECTURE.md, invariant 9). Each
node's free GPUs are what the engine reported, less what Starforge's active jobs hold there (on
the nodes the engine reported for their ranks, else where they would be placed now), less what
this tick admitted. Best fit: the nodes with the least room that still fits go first, so whole
nodes stay free for the next gang. A job whose attempts hung before is kept off the nodes they
ran on, as its engine keeps it (`kept_off`: the engine's rule, `nodes_to_avoid`).

GPU types: a team may be capped per GPU type (`TeamGpuTypeQuota`). A job asking for a type
counts toward the caps it matches; one asking for none, toward the types of the nodes its ranks
hold (on a cluster that reports no nodes such a job counts toward no type), and it is kept off
the capped types that have no room for it.

Worked out from the tick's snapshot (`jobs.loops.snapshot`) in memory, a cluster's nodes the
first time a job needs them; nothing here reads the database.
"""

import heapq

from jobs.executors import Capacity, gpu_type_matches
from jobs.executors.base import nodes_to_avoid
from jobs.loops.snapshot import Active, Queued, Snapshot

# A gang's shape as `place` remembers a miss: ranks, GPUs each, type, types and nodes kept off.
Shape = tuple[int, int, str, frozenset[str], frozenset[str]]


class Nodes:
    """A cluster's nodes as one tick sees them: the GPUs free on each, and where each active
    job's ranks are.

    Within a tick free GPUs only shrink, so a gang shape that did not fit once cannot fit
    later in the tick: `place` remembers it, and a deep queue of one shape costs one scan."""

    def __init__(self, capacity: Capacity) -> None:
        self.free = {n.name: n.gpus for n in capacity.nodes}
        self.types = {n.name: n.gpu_type for n in capacity.nodes}
        self.share = capacity.ranks_share_nodes
        self.misses: dict[Shape, int] = {}  # shape -> ranks that had room, when too few did
        self.where: dict[int, list[str]] = {}  # active job -> the nodes its ranks hold

    def place(
        self,
        ranks: int,
        gpus_per_node: int,
        gpu_type: str,
        avoid: frozenset[str] = frozenset(),
        off: frozenset[str] = frozenset(),
    ) -> list[str] | None:
        """The nodes (one per rank) a gang of `ranks` x `gpus_per_node` would take now, or None;
        never a node whose type matches one in `avoid`, nor one named in `off`. Best fit, as the
        module says."""
        shape = (ranks, gpus_per_node, gpu_type, avoid, off)
        if shape in self.misses:
            return None
        fits = [
            (free, name)
            for name, free in self.free.items()
            if free >= gpus_per_node
            and name not in off
            and gpu_type_matches(gpu_type, self.types[name])
            and not any(gpu_type_matches(a, self.types[name]) for a in avoid)
        ]
        chosen: list[str] = []
        for free, name in heapq.nsmallest(ranks, fits) if not self.share else sorted(fits):
            room = (free // gpus_per_node if gpus_per_node else ranks) if self.share else 1
            chosen += [name] * min(room, ranks - len(chosen))
            if len(chosen) == ranks:
                return chosen
        self.misses[shape] = len(chosen) if self.share else len(fits)
        return None

    def room(
        self,
        ranks: int,
        gpus_per_node: int,
        gpu_type: str,
        avoid: frozenset[str],
        off: frozenset[str] = frozenset(),
    ) -> int:
        """How many ranks of that shape had room when `place` last found too few."""
        return self.misses.get((ranks, gpus_per_node, gpu_type, avoid, off), 0)

    def take(self, names: list[str], gpus_per_node: int) -> None:
        for name in names:
            if name in self.free:
                self.free[name] -= gpus_per_node


def kept_off(capacity: Capacity, job: Queued | Active) -> frozenset[str]:
    """The nodes a job's next attempt is kept off: where its hung attempts ran, as many as
    leave it enough nodes (`nodes_to_avoid`, which its engine applies too)."""
    if not job.avoid_nodes:
        return frozenset()
    return frozenset(nodes_to_avoid(job.avoid_nodes, capacity, job.nodes, job.gpu_type))


def held_nodes(capacity: Capacity, active: list[Active]) -> Nodes:
    """The cluster's nodes less what its active jobs (`active`, in id order) hold: on the nodes
    the engine reported for their ranks where it did, else where the scheduler would place them
    now."""
    nodes = Nodes(capacity)
    for job in active:
        seen = [r["node"] for r in job.ranks or [] if isinstance(r, dict) and "node" in r]
        placed = (
            seen
            if len(seen) == job.nodes and all(name in nodes.free for name in seen)
            else nodes.place(
                job.nodes, job.gpus_per_node, job.gpu_type, off=kept_off(capacity, job)
            )
        )
        if placed is not None:
            nodes.take(placed, job.gpus_per_node)
            nodes.where[job.id] = placed
    return nodes


class Placement:
    """The tick's nodes per cluster and its teams' use of their capped GPU types: worked out
    from the snapshot when first needed, then taken from as the tick admits (`hold`)."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.nodes: dict[int, Nodes] = {}  # per cluster reporting its nodes
        self._type_used: dict[tuple[int, str], int] | None = None

    def nodes_of(self, cluster: int) -> Nodes:
        if cluster not in self.nodes:
            capacity = self.snap.capacities[cluster][1]
            mine = [a for a in self.snap.active if a.cluster == cluster and a.total_gpus > 0]
            self.nodes[cluster] = held_nodes(capacity, mine)
        return self.nodes[cluster]

    def caps_matching(self, team: int, gpu_type: str) -> list[str]:
        """The team's capped types that GPUs of `gpu_type` count toward."""
        caps = self.snap.type_caps.get(team)
        if not caps or not gpu_type:
            return []
        return [c for c in caps if gpu_type_matches(c, gpu_type) or gpu_type_matches(gpu_type, c)]

    def type_use(self, team: int, cap: str) -> int:
        return self._used().get((team, cap), 0)

    def full_types(self, job: Queued) -> frozenset[str]:
        """The capped types a job that asks for no type must keep off: those without room."""
        caps = self.snap.type_caps.get(job.team, {})
        return frozenset(
            c for c, limit in caps.items() if self.type_use(job.team, c) + job.total_gpus > limit
        )

    def hold(self, job: Queued, placed: list[str] | None) -> None:
        """What an admission takes for the rest of the tick: its ranks' room on their nodes, and
        its GPUs of a capped type (the type it asked for, else the types of its nodes)."""
        if placed is not None:
            nodes = self.nodes[job.cluster]
            nodes.take(placed, job.gpus_per_node)
        if job.team not in self.snap.type_caps:
            return
        if job.gpu_type:
            self._count(job.team, job.gpu_type, job.total_gpus)
        elif placed is not None:
            for name in placed:
                self._count(job.team, nodes.types[name], job.gpus_per_node)

    def _count(self, team: int, gpu_type: str, gpus: int) -> None:
        used = self._used()
        for cap in self.caps_matching(team, gpu_type):
            used[(team, cap)] = used.get((team, cap), 0) + gpus

    def _used(self) -> dict[tuple[int, str], int]:
        if self._type_used is None:
            self._type_used = self._type_use_now()
        return self._type_used

    def _type_use_now(self) -> dict[tuple[int, str], int]:
        """GPUs of each capped type the teams with caps hold now (the module says how a job
        counts)."""
        used: dict[tuple[int, str], int] = {}
        for job in self.snap.active:
            if job.team not in self.snap.type_caps or not job.total_gpus:
                continue
            kinds = [job.gpu_type] if job.gpu_type else self._node_types(job)
            for kind in kinds:
                share = job.total_gpus if job.gpu_type else job.gpus_per_node
                for cap in self.caps_matching(job.team, kind):
                    used[(job.team, cap)] = used.get((job.team, cap), 0) + share
        return used

    def _node_types(self, job: Active) -> list[str]:
        """The types of the nodes a typeless active job's ranks hold (none on a pool)."""
        cap_of = self.snap.capacities.get(job.cluster)
        if cap_of is None or not cap_of[1].nodes:
            return []
        nodes = self.nodes_of(job.cluster)
        return [nodes.types[name] for name in nodes.where.get(job.id, [])]
