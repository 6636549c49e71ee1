import pytest

from tests.jobs.scripted import ScriptedExecutor


@pytest.fixture
def backend(use_executor) -> ScriptedExecutor:
    """Replace every executor with one scripted backend for the test."""
    fake = ScriptedExecutor()
    use_executor(fake)
    return fake
