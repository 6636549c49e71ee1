"""An attempt ends one way (docs/ARCHITECTURE.md, invariant 5): nothing but jobs/ledger/ends.py
closes an attempt's clocks or moves a job to an end (SUCCEEDED, FAILED, STOPPED, PAUSED), so
every end records its cause and runs what follows, the same whoever saw or decided it."""

import ast

from tests.structure.imports import ROOT, modules

OWNER = "jobs/ledger/ends.py"
# Where the closing and moving functions are defined, not used.
DEFINED = {"jobs/ledger/clocks.py", "jobs/ledger/transitions.py"}
CLOSERS = {"close", "close_many", "close_open"}
# Each transition function, and the position of its target (a state, or a path of states).
MOVERS = {"apply_transitions": 0, "transition": 1, "advance": 1, "walk": 1}
# The states a job may be moved to outside the ends: on its way, never ended.
ON_ITS_WAY = {"QUEUED", "SUBMITTED", "PENDING", "RUNNING"}


def ending_calls(source: str) -> list[int]:
    """Lines that call a clocks closer, or a transition function with a target that is not
    written out as a state on a job's way (a state that ends it, or any name that could)."""
    tree = ast.parse(source)
    closers, movers = _imported(tree)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _called(node.func)
        if name in CLOSERS and name in closers:
            lines.append(node.lineno)
        elif name in MOVERS and name in movers and not _on_its_way(_target(node, name)):
            lines.append(node.lineno)
    return lines


def _imported(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The closers and movers this module may call: by name where it imports them from their
    module, all of them where it imports the module."""
    closers: set[str] = set()
    movers: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "jobs.ledger.clocks":
            closers |= {a.name for a in node.names if a.name in CLOSERS}
        elif isinstance(node, ast.ImportFrom) and node.module == "jobs.ledger.transitions":
            movers |= {a.name for a in node.names if a.name in MOVERS}
        elif isinstance(node, ast.ImportFrom) and node.module == "jobs.ledger":
            names = {a.name for a in node.names}
            closers |= CLOSERS if "clocks" in names else set()
            movers |= set(MOVERS) if "transitions" in names else set()
    return closers, movers


def _called(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and ast.unparse(func.value) in ("clocks", "transitions"):
        return func.attr
    return None


def _target(call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg in ("target", "path"):
            return keyword.value
    position = MOVERS[name]
    return call.args[position] if len(call.args) > position else None


def _on_its_way(target: ast.expr | None) -> bool:
    states = target.elts if isinstance(target, ast.List | ast.Tuple) else [target]
    return all(
        isinstance(state, ast.Attribute)
        and ast.unparse(state.value) in ("S", "JobStatus")
        and state.attr in ON_ITS_WAY
        for state in states
    )


def test_only_the_ends_module_closes_an_attempt_or_moves_a_job_to_an_end():
    offenders = []
    for path in modules().values():  # the server's modules, migrations aside
        rel = path.relative_to(ROOT).as_posix()
        if rel == OWNER or rel in DEFINED:
            continue
        offenders += [f"{rel}:{n}" for n in ending_calls(path.read_text())]
    assert offenders == []


def test_the_detector_finds_each_way_of_ending_an_attempt():
    clocks = "from jobs.ledger import clocks\n"
    moves = "from jobs.ledger.transitions import apply_transitions, transition, advance, walk\n"
    assert ending_calls(clocks + "clocks.close(attempt, None, now, end_reason='x')")
    assert ending_calls(clocks + "clocks.close_open([1], now, 'stopped')")
    assert ending_calls("from jobs.ledger.clocks import close_many\nclose_many([], {}, now, {})")
    assert ending_calls(moves + "apply_transitions(S.STOPPED, changes, actor='x')")
    assert ending_calls(moves + "apply_transitions(target, changes, actor='x')")
    assert ending_calls(moves + "transition(job_id, JobStatus.FAILED, actor='x')")
    assert ending_calls(moves + "advance(job, [S.RUNNING, S.SUCCEEDED], 'r', actor='x')")
    assert ending_calls(moves + "walk(group, path, 'r', actor='x')")
    assert ending_calls("from jobs.ledger import transitions\ntransitions.transition(1, S.PAUSED)")
    assert not ending_calls(moves + "apply_transitions(S.QUEUED, changes, actor='x')")
    assert not ending_calls(moves + "transition(job.pk, S.PENDING, reason='r', actor='x')")
    assert not ending_calls(moves + "walk(group, [S.PENDING, S.RUNNING], 'r', actor='x')")
    assert not ending_calls(clocks + "clocks.mark_started(attempt, at, now)")
    assert not ending_calls("for root, dirs, files in os.walk(top): pass")
    assert not ending_calls("def close(): pass\nclose()")
