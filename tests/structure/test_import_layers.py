"""The layers import one way (docs/ARCHITECTURE.md, "Module map"): no module imports itself
back through others, reads import no write code, loops never import the API or the console,
executors never import the loops, the ledger's writers import neither the loops nor the
user-facing actions, and the webhook senders import no write code."""

import pytest

from tests.structure.imports import cycles, graph, imports_of, modules, reachable

# The code that changes the ledger: its writers, the user-facing actions, the loops, the tasks.
WRITES = ("jobs.ledger", "jobs.actions", "jobs.loops", "jobs.tasks")
LAYERS = {
    # importer prefix: prefixes it must never reach, directly or through other modules
    "jobs.reads": WRITES,
    "jobs.ledger": ("jobs.loops", "jobs.actions", "jobs.api", "jobs.console", "jobs.tasks"),
    "jobs.loops": ("jobs.api", "jobs.console", "jobs.actions"),
    "jobs.executors": ("jobs.loops", "jobs.ledger", "jobs.actions", "jobs.api", "jobs.console"),
    "jobs.actions": ("jobs.api", "jobs.console", "jobs.loops", "jobs.tasks"),
    # where a webhook may point and how one try reaches it: the world outside, like executors
    "jobs.webhooks": (*WRITES, "jobs.api", "jobs.console"),
}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_module_imports_itself_back_through_others():
    assert cycles() == []


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_imports_only_downwards(layer):
    crossings = [
        f"{name} reaches {target}"
        for name in sorted(modules())
        if under(name, layer)
        for target in sorted(reachable(name))
        if any(under(target, banned) for banned in LAYERS[layer])
    ]
    assert crossings == []


def test_the_attempt_clocks_are_called_only_by_the_loops_the_ingest_and_the_ends():
    callers = sorted(name for name, targets in graph().items() if "jobs.ledger.clocks" in targets)
    assert callers == [
        "jobs.api.ingest",  # the runner's start report, a sighting alive
        "jobs.ledger.ends",  # every close (tests/structure/test_attempt_ends_have_one_owner.py)
        "jobs.loops.reconciler",  # starts and sightings the engines report
        "jobs.loops.scheduler",  # opening the attempts it admits
    ]


def test_the_graph_sees_every_kind_of_import():
    modules()  # the project's names
    source = (
        "import jobs.models\n"
        "from jobs.ledger import clocks\n"
        "from jobs.states import JobStatus\n"
        "def f():\n    from jobs.loops.launcher import launch_attempts\n"
    )
    assert imports_of("jobs.kick", source) == {
        "jobs.models",
        "jobs.ledger.clocks",
        "jobs.states",
        "jobs.loops.launcher",
    }


def test_a_cycle_is_found(monkeypatch):
    from tests.structure import imports

    monkeypatch.setattr(imports, "graph", lambda: {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert imports.cycles() == [["a", "b", "c"]]
