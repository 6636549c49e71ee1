"""`jobs.loops.placement` on plain data: a cluster's nodes as a tick sees them (active jobs where
the engine saw their ranks, else where they would go), best-fit gang placement, and what teams
hold of their capped GPU types."""

from jobs.loops.placement import Placement, held_nodes
from tests.loops.plain import active, nodes, queued, snapshot, team

NLP = team(1, "nlp", quota=16)


def test_active_jobs_hold_the_nodes_the_engine_saw_their_ranks_on():
    _, capacity = nodes(("a", 4, ""), ("b", 4, ""))
    seen = active(1, NLP, total_gpus=4, nodes=2, ranks=[{"node": "b"}, {"node": "a"}])
    unseen = active(2, NLP, total_gpus=1)  # best fit: the node with the least room that fits
    held = held_nodes(capacity, [seen, unseen])
    assert held.free == {"a": 1, "b": 2}
    assert held.where == {1: ["b", "a"], 2: ["a"]}


def test_a_shape_that_did_not_fit_is_remembered_with_the_room_there_was():
    _, capacity = nodes(("a", 2, ""), ("b", 1, ""))
    held = held_nodes(capacity, [])
    assert held.place(2, 2, "") is None
    assert held.room(2, 2, "", frozenset()) == 1
    assert held.place(1, 2, "") == ["a"]


def test_a_typeless_job_counts_toward_the_capped_types_of_its_nodes():
    snap = snapshot(
        [NLP],
        [queued(10, NLP, total_gpus=2)],
        [
            active(1, NLP, total_gpus=2, ranks=[{"node": "a"}]),
            active(2, NLP, total_gpus=1, gpu_type="h100"),
        ],
        clusters=[nodes(("a", 4, "a100"), ("b", 4, "h100"))],
        type_caps={NLP.pk: {"a100": 2, "h100": 8}},
    )
    placement = Placement(snap)
    assert (placement.type_use(NLP.pk, "a100"), placement.type_use(NLP.pk, "h100")) == (2, 1)
    assert placement.full_types(queued(10, NLP, total_gpus=2)) == frozenset({"a100"})


def test_an_admission_takes_its_nodes_and_its_type_for_the_rest_of_the_tick():
    snap = snapshot([NLP], clusters=[nodes(("a", 4, "a100"))], type_caps={NLP.pk: {"a100": 8}})
    placement = Placement(snap)
    job = queued(10, NLP, total_gpus=3)
    placed = placement.nodes_of(job.cluster).place(1, 3, "")
    placement.hold(job, placed)
    assert placement.nodes_of(job.cluster).free == {"a": 1}
    assert placement.type_use(NLP.pk, "a100") == 3


def test_an_active_job_not_seen_on_its_nodes_yet_is_counted_off_the_nodes_it_keeps_off():
    """A retry after a hang waits on its engine kept off the node that hung: it is counted
    where it can go, not on that node (best fit would have put it there)."""
    _, capacity = nodes(("a", 1, ""), ("b", 4, ""))
    retry = active(1, NLP, total_gpus=1, ranks=[], avoid_nodes=["a"])
    held = held_nodes(capacity, [retry])
    assert held.where == {1: ["b"]} and held.free == {"a": 1, "b": 3}
