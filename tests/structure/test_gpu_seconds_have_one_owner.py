"""GPU-seconds are computed by metering alone (docs/ARCHITECTURE.md, invariant 5): no module
outside `metering/` multiplies a duration by a GPU count. The API, the console, diagnostics,
webhooks and /metrics read `metering.usage` (an attempt's or a job's GPU-seconds, every team's)
or `metering.records` (GPU-µs per day), so a bill, a page and a payload cannot disagree on what
an attempt ran. Read from the source of the server and of the `sf` client; the console's list
page carries metering's figure forward in the browser between renders (static/js/durations.js),
by the same rule, and is not Python."""

import ast
import re

import pytest

from tests.structure.imports import ROOT, modules

OWNER = "metering"
# A name or key that holds a GPU count (per node or in all).
GPU_COUNT = re.compile(r"gpus")
# A name or key that holds a time or a duration: seconds, µs, hours, a clock, an interval.
TIME = re.compile(
    r"(^|_)(s|us|ms|seconds|hours|duration|elapsed|ran|time|start|end|now|since|until)($|_)"
    r"|timedelta|ONE_US|US_PER"
)


def gpu_time_products(source: str) -> list[int]:
    """Lines that multiply something that reads a GPU count by something that reads a time."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            sides = (node.left, node.right)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult):
            sides = (node.target, node.value)
        else:
            continue
        if any(_reads(side, GPU_COUNT) for side in sides) and any(_timed(s) for s in sides):
            lines.append(node.lineno)
    return lines


def _timed(expr: ast.expr) -> bool:
    """A duration: a difference, a `total_seconds()`, or a name that says it is a time."""
    for node in ast.walk(expr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "total_seconds":
            return True
    return _reads(expr, TIME)


def _reads(expr: ast.expr, pattern: re.Pattern) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value  # a row's key: row["total_gpus"]
        else:
            continue
        if pattern.search(name):
            return True
    return False


def _sources() -> dict[str, str]:
    paths = {name: path for name, path in modules().items()}
    paths |= {
        f"sf.{path.stem}": path
        for path in (ROOT / "client" / "sf").rglob("*.py")
        if path.name != "__init__.py"
    }
    return {name: path.read_text() for name, path in sorted(paths.items())}


def test_only_metering_multiplies_a_duration_by_a_gpu_count():
    offenders = [
        f"{name}:{line}"
        for name, source in _sources().items()
        if not name.startswith(OWNER + ".")
        for line in gpu_time_products(source)
    ]
    assert offenders == []


def test_metering_is_where_they_are_computed():
    owners = [
        name
        for name, source in _sources().items()
        if name.startswith(OWNER + ".") and gpu_time_products(source)
    ]
    assert owners == ["metering.activity", "metering.records", "metering.usage"]


@pytest.mark.parametrize(
    "source",
    [
        "used = (end - start).total_seconds() * attempt.total_gpus",
        "total += row['ran'].total_seconds() * row['total_gpus']",
        "us = (piece_end - lo) // ONE_US * gpus",
        "billed = gpus_per_node * nodes * ran_s",
        "seconds *= total_gpus",
    ],
)
def test_a_gpu_seconds_product_is_found(source):
    assert gpu_time_products(source) == [source.count("\n") + 1]


@pytest.mark.parametrize(
    "source",
    [
        "total_gpus = gpus_per_node * nodes",  # the one multiplication of jobs.gpus
        "budget = hours * US_PER_HOUR",
        "score = recent_us / US_PER_HOUR + held_gpus",
        "seconds = (end - start).total_seconds()",
    ],
)
def test_other_products_pass(source):
    assert gpu_time_products(source) == []
