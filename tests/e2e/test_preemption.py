"""Preemption end to end on the real stack (ASGI server, Celery worker and beat, the local
executor, the example training script): `EngineProof.preempts_a_borrower` — team demo borrows
team lab's idle GPUs, lab submits, demo's job gets its notice, checkpoints, goes PAUSED, is
queued again, resumes from that checkpoint and finishes with every step run once; lab's job
starts within the grace plus two ticks. The same proof runs on Slurm (tests/engines/slurm).

The minimum runtime is 3 s here (SF_PREEMPT_MIN_RUNTIME_S) so the test need not wait 10 min;
the grace is 30 s, far longer than the job needs to checkpoint.
"""

from collections.abc import Iterator

import pytest

from tests.engines.proof import EngineProof, on_local_stack

pytestmark = pytest.mark.e2e
GRACE_S = 30
TICK_S = 2.0  # the beat schedule's scheduler and reconciler ticks (starforge.settings)


@pytest.fixture(scope="module")
def proof(tmp_path_factory) -> Iterator[EngineProof]:
    env = {"SF_PREEMPT_MIN_RUNTIME_S": "3", "SF_PREEMPT_GRACE_S": "30"}
    with on_local_stack(tmp_path_factory, **env) as running:
        yield running


@pytest.fixture(autouse=True)
def _stack_logs_on_failure(request, proof) -> Iterator[None]:
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line(f"\nstack logs after {request.node.name}:\n{proof.stack.diagnostics()}")


def test_a_borrower_is_preempted_checkpoints_resumes_and_finishes_every_step_once(proof):
    proof.preempts_a_borrower(GRACE_S, TICK_S)
