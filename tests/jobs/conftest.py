import pytest

from jobs import launcher, reconciler, services
from tests.jobs.scripted import ScriptedExecutor


@pytest.fixture
def backend(monkeypatch) -> ScriptedExecutor:
    """Replace every executor with one scripted backend for the test."""
    fake = ScriptedExecutor()
    for module in (reconciler, launcher, services):
        monkeypatch.setattr(module, "executor_for", fake)
    return fake
