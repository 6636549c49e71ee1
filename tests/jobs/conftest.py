import pytest
from django.db import connection

from tests.jobs.scripted import ScriptedExecutor


@pytest.fixture
def backend(use_executor) -> ScriptedExecutor:
    """Replace every executor with one scripted backend for the test."""
    fake = ScriptedExecutor()
    use_executor(fake)
    return fake


@pytest.fixture
def shared_ledger() -> None:
    """Skip on the in-memory SQLite ledger: threads share the embedded ledger only in a file
    (SF_SQLITE_TEST_DB, as `make test`'s SQLite run has it)."""
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.skip("threads share the embedded ledger only in a file (SF_SQLITE_TEST_DB)")
