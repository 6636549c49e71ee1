"""Tests share fixtures and helpers, never test modules (issue 48, point 8): no Python file of
the project imports a `test_*.py` module or a name from one. A test module imported by another
is collected again under the importer's name (`import *` re-runs it whole), and what it shares
hides in a file that reads as tests. Shared fixtures live in a conftest.py or in a plugin that
tests/conftest.py lists in `pytest_plugins` (tests/local_jobs.py); shared helpers in plain
modules (tests/factories.py, tests/ingesting.py, tests/loops/borrowers.py, ...); a test that
holds on each store asks for the `storage` fixture instead of being imported again."""

import ast
from pathlib import Path

import pytest

from tests.structure.imports import from_module

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("tests", "bench", ".ci", "jobs", "metering", "starforge", "client", "examples")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_test_modules(name: str, source: str, is_package: bool = False) -> list[str]:
    """What module `name` imports from a test module: each dotted name with a `test_` part."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = from_module(name, node, is_package)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [t for t in targets if any(p.startswith("test_") for p in t.split("."))]
    return found


def test_no_file_imports_a_test_module():
    offenders = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = module_name(path)
            source = path.read_text()
            for target in imported_test_modules(name, source, path.name == "__init__.py"):
                offenders.append(f"{path.relative_to(ROOT)} imports {target}")
    assert offenders == [], "move what they share to a conftest or a helper module"


@pytest.mark.parametrize(
    "source",
    [
        "from tests.stores.test_log_ingest import *",
        "from tests.executors.test_local_executor import job_dirs, start",
        "import tests.loops.test_scheduler_concurrency",
        "from tests.loops import test_scheduler_concurrency",
        "from .test_slurm_states import FakeSlurm",
        "def f():\n    from tests.console.test_live import socket",
    ],
)
def test_the_detector_finds_each_way_of_importing_a_test_module(source):
    assert imported_test_modules("tests.engines.slurm.test_multinode", source) != []


@pytest.mark.parametrize(
    "source",
    [
        "from tests.factories import queued_job",
        "from tests.loops.borrowers import Engine, tick",
        "import pytest",
        "from .helpers import FakeSlurm",
        "from tests.structure.imports import modules",
    ],
)
def test_helpers_and_fixture_plugins_pass(source):
    assert imported_test_modules("tests.engines.slurm.test_multinode", source) == []
