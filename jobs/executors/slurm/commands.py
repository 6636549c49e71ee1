"""Running one Slurm command (sbatch, squeue, scancel, sinfo, sacct) on the worker host, and what
its failure says: `SlurmError` with Slurm's own last sentence, and whether trying again could
help (`transient`)."""

import re
import subprocess
from collections.abc import Callable

COMMAND_TIMEOUT_S = 30
# "sbatch: error: ", "slurm_load_jobs error: ", "slurm_load_partitions: " before Slurm's words
SLURM_PREFIX = re.compile(r"^(?:[\w-]+:? (?:error|fatal): |slurm_\w+: )")
# Words in sbatch's refusals that mean "the controller could not be asked", not "no".
TRANSIENT = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "temporarily unable",
    "Resource temporarily unavailable",
    "Zero Bytes were transmitted",
    "Communication connection failure",
    "job submit limit",
    "slurm_persist_conn",
)

Run = Callable[[list[str], dict[str, str], tuple[int, ...]], subprocess.CompletedProcess]


class SlurmError(Exception):
    """A Slurm command failed; the message is Slurm's own sentence."""


def run_command(
    command: list[str], env: dict[str, str], fds: tuple[int, ...]
) -> subprocess.CompletedProcess:
    """Run one command, nothing on its stdin, its output kept, for at most COMMAND_TIMEOUT_S."""
    return subprocess.run(
        command,
        env=env,
        pass_fds=fds,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def sentence(words: str) -> str:
    """Slurm's last error line without its `sbatch: error:` prefixes."""
    lines = [line for line in words.splitlines() if line.strip()]
    if not lines:
        return ""
    last = SLURM_PREFIX.sub("", lines[-1].strip())
    return last.removeprefix("Batch job submission failed: ")


def transient(message: str) -> bool:
    """Whether Slurm's words say it could not be asked (a later try may pass), not "no"."""
    return any(word.lower() in message.lower() for word in TRANSIENT)
