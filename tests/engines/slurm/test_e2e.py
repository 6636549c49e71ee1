"""The whole product on a real Slurm: `sf submit --cluster slurm` to the ledger's final states.

The stack (ASGI server, Celery worker and beat) runs with a `slurm` cluster as the demo team's
default; slurmctld and slurmd run on this host with 4 fake GPUs declared as GRES, so
`--gres=gpu:2` gives the job `CUDA_VISIBLE_DEVICES=0,1`. This Slurm has no cgroup task plugin
and no accounting, so it never reports OUT_OF_MEMORY: the out-of-memory row is proven in the
state-table test and on Kubernetes, where the engine reports one.
"""

from collections.abc import Iterator

import pytest

from tests.engines.proof import EngineProof, engine_proof
from tests.engines.slurm.conftest import slurm

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"}


@pytest.fixture(scope="module")
def proof(slurm_conf, tmp_path_factory) -> Iterator[EngineProof]:
    def alive(job_ref: str) -> bool:
        """True while Slurm still runs (or would start) the batch job."""
        state = slurm("squeue", "-h", "-t", "all", "-j", job_ref, "-o", "%T", conf=slurm_conf)
        return state.strip() in ACTIVE_STATES

    work = tmp_path_factory.mktemp("slurm-work")
    settings = {"slurm_conf": slurm_conf, "work_dir": str(work)}
    # A 3 s minimum runtime before preemption (10 min by default), for the preemption proof.
    with engine_proof(
        tmp_path_factory, "slurm", settings, alive, SF_PREEMPT_MIN_RUNTIME_S="3"
    ) as running_proof:
        yield running_proof


def test_the_example_training_job_runs_on_two_gpus_to_succeeded(proof):
    job = proof.succeeds_with_gpus(2, expect_devices="0,1")
    assert job["job_ref"].isdigit()  # a Slurm job id: the job really went through sbatch


def test_pause_cancels_the_batch_job_and_resume_continues_from_the_checkpoint(proof):
    proof.pauses_and_resumes()


def test_a_non_zero_exit_fails_the_job_with_its_code(proof):
    proof.fails_with_exit_code(1)


def test_stop_cancels_the_batch_job(proof):
    proof.stops()


def test_a_borrower_is_preempted_through_its_signal_checkpoints_and_resumes(proof):
    """scancel --signal=TERM --full is the notice (the runner gives the job the grace, 120 s by
    default, SF_STOP_GRACE_S); the job checkpoints and exits at once, so lab's job starts within
    the grace plus two ticks; demo's resumes and finishes every step once."""
    proof.preempts_a_borrower(grace_s=120, tick_s=2.0)
