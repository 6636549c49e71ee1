"""A job's GPU count in its two units, and the one conversion each way between them.

`gpus_per_node` is what each rank gets: what a person asks for (`sf submit --gpus`, the submit
body's `gpus` or `gpus_per_node`), what an engine allocates on each node and what a rank sees.
`total_gpus` is what the job holds in all, nodes x GPUs per node: what the ledger stores
(`Job.total_gpus`, `Attempt.total_gpus`) and every quota, share, capacity sum and meter counts.
A number that changes unit changes name, and changes it here.
"""


def to_total_gpus(gpus_per_node: int, nodes: int) -> int:
    """The GPUs a job of `nodes` ranks holds in all."""
    return gpus_per_node * nodes


def to_gpus_per_node(total_gpus: int, nodes: int) -> int:
    """The GPUs each of a job's ranks gets of the `total_gpus` it holds."""
    return total_gpus // max(nodes, 1)
