"""The sbatch of an attempt: its options (name, directories, nodes, GRES, CPUs, memory,
partition, account, time) and the anonymous export file that carries the job's whole
environment, which sbatch then takes as it is and adds nothing of its own process's to."""

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jobs.executors.base import TIME_LIMIT_BACKSTOP_S, LaunchSpec


def sbatch_args(
    spec: LaunchSpec,
    attempt_dir: Path,
    *,
    gres_type: str,
    partition: str,
    account: str,
    time_limit: str,
    exclude: list[str] | None = None,
) -> list[str]:
    """sbatch and its options for an attempt, less its environment and what it runs;
    `gres_type` is the partition's spelling of the job's GPU type ("" for any), `exclude` the
    nodes Slurm must not give it (a retry after a hang keeps off the node that hung)."""
    args = [
        "sbatch",
        "--parsable",
        f"--job-name={spec.name}",
        f"--chdir={attempt_dir}",
        f"--output={attempt_dir / 'slurm.out'}",
        f"--error={attempt_dir / 'slurm.err'}",
        "--no-requeue",  # one attempt, one run: retries are Starforge's (see STATE_TABLE)
    ]
    if spec.nodes > 1:  # one task per node: the batch step runs the runner on the first
        args += [f"--nodes={spec.nodes}", "--ntasks-per-node=1"]
    if spec.total_gpus > 0:  # GRES are per node
        args.append(f"--gres=gpu:{gres_type + ':' if gres_type else ''}{spec.gpus_per_node}")
    if spec.cpus:
        args.append(f"--cpus-per-task={spec.cpus}")
    if spec.memory_mb:
        args.append(f"--mem={spec.memory_mb}")  # MiB, per node
    if exclude:
        args.append(f"--exclude={','.join(exclude)}")
    for flag, value in (
        ("partition", partition),
        ("account", account),
        ("time", _minutes(spec.time_limit_s) if spec.time_limit_s else time_limit),
    ):
        if value:
            args.append(f"--{flag}={value}")
    return args


@contextmanager
def export_file(env: dict[str, str]) -> Iterator[int]:
    """The descriptor of an anonymous file (no name on disk, so the job token is never written
    anywhere) holding `env` as sbatch's --export-file reads it: NUL-separated NAME=value pairs,
    the job's whole environment."""
    with tempfile.TemporaryFile() as env_file:
        env_file.write(b"".join(f"{name}={value}".encode() + b"\0" for name, value in env.items()))
        env_file.flush()
        env_file.seek(0)
        yield env_file.fileno()


def _minutes(limit_s: int) -> str:
    """sbatch --time for a job's time limit: its backstop, rounded up to whole minutes."""
    return str(-(-(limit_s + TIME_LIMIT_BACKSTOP_S) // 60))
