"""A failure cause is named once (`sf.contract.Failure`): the executors, the reconciler, the
ledger, Diagnostics, the API and the CLI use its members, so no module of the server or the
client spells a cause as a bare string (docstrings and comments aside). The few modules whose
string only sounds like a cause, meaning something else, are listed with what it means."""

from pathlib import Path

import pytest
from sf.contract import Failure

from tests.structure.constants import constants

ROOT = Path(__file__).resolve().parents[2]
CAUSES = {cause.value for cause in Failure}
# (module, string): what the word means there, which is not why an attempt failed.
OTHER_MEANINGS = {
    ("client/sf/commands/notify.py", "preempted"): "a webhook's event (Webhook.Event)",
    ("jobs/models.py", "preempted"): "the webhook event Webhook.Event.PREEMPTED",
    ("client/sf/supervise.py", "preempted"): "the kind of the runner's notice file",
    ("jobs/executors/local.py", "preempted"): "the flag of the local cancel record",
    ("jobs/stores/logstore.py", "ingest"): "the actor of an event the ingest API writes",
    ("jobs/stores/metrics/ingest.py", "ingest"): "the actor of an event the ingest API writes",
    ("starforge/settings.py", "timeout"): "SQLite's busy timeout option",
    ("starforge/db/sqlite3/base.py", "timeout"): "SQLite's busy timeout option",
}


def modules() -> list[Path]:
    trees = [ROOT / "jobs", ROOT / "metering", ROOT / "starforge", ROOT / "client" / "sf"]
    return sorted(
        path
        for tree in trees
        for path in tree.rglob("*.py")
        if "migrations" not in path.parts and path != ROOT / "client" / "sf" / "contract.py"
    )


def spelled_causes(source: str) -> set[object]:
    """The failure causes a module's code holds as string constants, docstrings left out."""
    return constants(source) & CAUSES


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_spells_a_failure_cause(path):
    rel = path.relative_to(ROOT).as_posix()
    spelled = {
        word for word in spelled_causes(path.read_text()) if (rel, word) not in OTHER_MEANINGS
    }
    assert spelled == set(), f"{rel} spells {sorted(spelled)}: use sf.contract.Failure"


def test_every_other_meaning_is_still_there():
    for rel, word in OTHER_MEANINGS:
        assert word in spelled_causes((ROOT / rel).read_text()), f"{rel} no longer spells {word}"


def test_the_detector_finds_a_cause_in_code_and_not_in_a_docstring():
    assert spelled_causes('failure = "lost"') == {"lost"}
    assert spelled_causes('END = {"TIMEOUT": ("timeout", "the limit")}') == {"timeout"}
    assert spelled_causes('def f():\n    """An oom."""\n    return "oom"') == {"oom"}
    assert spelled_causes('"""exit"""\nx = Failure.EXIT') == set()
