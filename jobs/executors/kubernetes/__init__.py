"""The Kubernetes executor, registered in `jobs.executors.base.KINDS` as this package's
`KubernetesExecutor`: each attempt is one batch/v1 Job whose pods run the job-side runner.

`executor` talks to the API (submit, find, poll, cancel, capacity); `manifests` builds the Job,
its headless Service and their pod from a launch spec; `observe` reads an attempt's state from
its Job and pods and holds `STATE_TABLE`; `nodes` reads the room for pods from nodes and pods;
`settings` checks a cluster's settings.
"""

from jobs.executors.kubernetes.executor import KubernetesExecutor

__all__ = ["KubernetesExecutor"]
