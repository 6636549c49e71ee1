"""The client's modules import one way, read from the source (no import runs): the job side (the
runner and the SDK, which run inside any training image) imports the standard library only and
never reaches the CLI's modules; the CLI's commands never reach the runner's; the contract
imports nothing of the client; and no client module imports itself back through others."""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

SF = Path(__file__).resolve().parents[2] / "client" / "sf"
# Shared by both sides: the package, its HTTP client, the contract.
SHARED = {"sf", "sf.http", "sf.contract"}
JOB_SIDE = {
    "sf.runner",
    "sf.activity",
    "sf.ingest",
    "sf.environment",
    "sf.shipping",
    "sf.say",
    "sf.sandbox",
    "sf.supervise",
    "sf.ranks",
    "sf.system",
    "sf.checkpoints",
    "sf.metrics",
    "sf.notice",
    "sf.tracking",
    "sf.tensorboard",
    "sf.tfevents",
}
# sf.system: GPU telemetry where the image has NVML's binding; sf.tfevents: TensorBoard's own
# event decoder where the image has TensorBoard.
OPTIONAL = {"pynvml", "tensorboard"}


def module_name(path: Path) -> str:
    parts = ["sf", *path.relative_to(SF).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in SF.rglob("*.py")}


@cache
def imports(name: str) -> frozenset[str]:
    """Every module `name` imports, at module level or inside a function; a name imported from
    a package counts as its module where it is one."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found |= {
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules() else base for a in node.names
            }
    return frozenset(found)


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in imports(todo.pop()) & modules().keys():
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_job_side_imports_the_standard_library_and_itself_only():
    allowed = set(sys.stdlib_module_names) | OPTIONAL
    for name in sorted(JOB_SIDE):
        outside = {i for i in imports(name) if i.split(".")[0] not in allowed and i != "sf"}
        assert outside <= JOB_SIDE | SHARED, f"{name} imports {sorted(outside)}"


def test_the_job_side_never_reaches_the_cli():
    for name in sorted(JOB_SIDE):
        assert reachable(name) <= JOB_SIDE | SHARED, name


def test_the_commands_never_reach_the_runner():
    commands = sorted(n for n in modules() if n == "sf.cli" or n.startswith("sf.commands"))
    assert commands
    for name in commands:
        runner_side = reachable(name) & (JOB_SIDE - {"sf.metrics", "sf.notice"})
        assert runner_side == set(), f"{name} reaches {sorted(runner_side)}"


def test_the_contract_imports_nothing_of_the_client():
    assert reachable("sf.contract") == set()


def test_no_client_module_imports_itself_back_through_others():
    assert [name for name in sorted(modules()) if name in reachable(name)] == []


def test_every_module_is_on_one_side():
    cli = {n for n in modules() if n == "sf.cli" or n.startswith("sf.commands")}
    cli |= {"sf.config", "sf.project", "sf.snapshot"}
    assert set(modules()) == JOB_SIDE | SHARED | cli
