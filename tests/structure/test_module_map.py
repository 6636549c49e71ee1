"""docs/ARCHITECTURE.md's module map names every module of the server and the client (issue 48,
point 9): a module nobody wrote a line for is a rule with no stated home. Read from the map's
first column: a path in backticks, `{a,b}.py` for several, a bare `name.py` in the folder of the
path before it in the cell, and a folder (`.../`) for every module under it. Migrations and
package `__init__` files are left out; a name in the map that is no file fails too."""

import re

from tests.structure.imports import ROOT

MAP = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("jobs", "metering", "starforge", "client/sf")


def mapped(text: str) -> tuple[set[str], set[str]]:
    """The files and the folders the module map's first column names."""
    section = re.split(r"\n##+ ", text.split("## Module map", 1)[1], maxsplit=1)[0]
    files: set[str] = set()
    folders: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
            if "/" not in name:
                name = folder + name
            folder = name.rsplit("/", 1)[0] + "/"
            if name.endswith("/"):
                folders.add(name)
                continue
            files.update(_expand(name))
    return files, folders


def _expand(name: str) -> list[str]:
    braces = re.search(r"\{([^}]+)\}", name)
    if not braces:
        return [name]
    head, tail = name[: braces.start()], name[braces.end() :]
    return [head + part + tail for part in braces.group(1).split(",")]


def modules() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if path.name == "__init__.py" or "/migrations/" in relative:
                continue
            found.add(relative)
    return found


def unmapped(files: set[str], folders: set[str], present: set[str]) -> list[str]:
    return sorted(
        name for name in present if name not in files and not name.startswith(tuple(folders))
    )


def test_every_module_is_in_the_module_map():
    files, folders = mapped(MAP.read_text())
    missing = unmapped(files, folders, modules())
    assert not missing, "not in docs/ARCHITECTURE.md's module map:\n" + "\n".join(missing)


def test_the_module_map_names_no_module_that_is_gone():
    files, folders = mapped(MAP.read_text())
    gone = sorted(name for name in files | folders if not (ROOT / name).exists())
    assert not gone, "the module map names what is not there:\n" + "\n".join(gone)


def test_the_reading_of_the_map():
    text = (
        "## Module map\n\n| module | owns |\n|---|---|\n"
        "| `jobs/executors/{local,ray}.py` | one backend each |\n"
        "| `metering/models.py`, `records.py` | usage |\n"
        "| `jobs/management/commands/` | commands |\n"
        "\n## Next\n| `jobs/later.py` | not in the map |\n"
    )
    files, folders = mapped(text)
    assert files == {
        "jobs/executors/local.py",
        "jobs/executors/ray.py",
        "metering/models.py",
        "metering/records.py",
    }
    assert folders == {"jobs/management/commands/"}
    present = {
        "jobs/executors/local.py",
        "jobs/executors/slurm.py",
        "jobs/management/commands/runstack.py",
        "metering/records.py",
    }
    assert unmapped(files, folders, present) == ["jobs/executors/slurm.py"]


def invariants(text: str) -> dict[int, str]:
    """Each numbered invariant's whole text (its sub-points included)."""
    section = re.split(r"\n##+ ", text.split("## Invariants", 1)[1], maxsplit=1)[0]
    parts = re.split(r"^(\d+)\. ", section, flags=re.MULTILINE)
    return {int(number): body for number, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_each_invariant_names_its_owner_and_a_test_that_exists():
    found = invariants(MAP.read_text())
    assert sorted(found) == list(range(1, len(found) + 1)) and len(found) >= 10
    faults = []
    for number, body in found.items():
        tests = re.findall(r"`(tests/[^`]+\.py)`", body)
        if "Owner" not in body:
            faults.append(f"invariant {number} names no owner")
        if not tests:
            faults.append(f"invariant {number} names no test")
    assert not faults, "\n".join(faults)


def test_every_path_the_architecture_names_is_there():
    text = MAP.read_text()
    named = {
        path
        for path in re.findall(r"`((?:jobs|metering|starforge|client|tests)/[^`*{ ]+)`", text)
        if not path.endswith("/")
    }
    gone = sorted(path for path in named if not (ROOT / path).exists())
    assert not gone, "docs/ARCHITECTURE.md names what is not there:\n" + "\n".join(gone)
