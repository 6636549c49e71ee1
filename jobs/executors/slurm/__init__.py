"""The Slurm executor, registered in `jobs.executors.base.KINDS` as this package's
`SlurmExecutor`: each attempt is one batch job whose batch step is the job-side runner.

`executor` holds the executor and its `STATE_TABLE`; `sbatch` builds an attempt's sbatch options
and its environment's export file; `parse` reads what squeue, sacct and sinfo answer; `commands`
runs one Slurm command and says what its failure means.
"""

from jobs.executors.slurm.executor import SlurmExecutor

__all__ = ["SlurmExecutor"]
