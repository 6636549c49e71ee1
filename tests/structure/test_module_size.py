"""No module over 800 lines, migrations aside (issue 48, point 7; docs/ARCHITECTURE.md, "Module
size"): past that a module holds more than one concern and is split along its seams. Every
Python file of the repository that git tracks or could track (tests, bench and the CI scripts
included), read from the working tree."""

import subprocess

from tests.structure.imports import ROOT

LIMIT = 800


def python_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [name for name in listed if "/migrations/" not in name and (ROOT / name).exists()]


def too_long(names: list[str], limit: int = LIMIT) -> list[str]:
    found = []
    for name in names:
        lines = (ROOT / name).read_text().count("\n")
        if lines > limit:
            found.append(f"{name}: {lines} lines")
    return found


def test_no_module_is_over_800_lines():
    names = python_files()
    assert "jobs/models.py" in names and len(names) > 300
    assert not too_long(names), "over 800 lines, split it:\n" + "\n".join(too_long(names))


def test_the_count_finds_a_long_module():
    assert too_long(["jobs/models.py"], limit=10) == [
        f"jobs/models.py: {(ROOT / 'jobs/models.py').read_text().count(chr(10))} lines"
    ]
    assert too_long(["jobs/models.py"]) == []
