"""``verify`` on a Ray cluster (``--engine ray``): the per-shard tasks (``sftdata.verify.tasks``)
run as Ray tasks. Connecting is this module's; the tasks, what they send and how a stopped
run ends are ``verify.tasks``' and ``sftdata.tasks``'.
"""

from __future__ import annotations

from ..tasks import Engine, RayTasks
from .cluster import connect, import_ray


def ray_verify_executor(address: str | None = None, items_per_task: int | None = None) -> Engine:
    """An engine for ``sftdata.verify.verify`` that checks each shard (and re-encodes each
    shard's ``--retokenize`` sample) as a task on the Ray cluster at ``address`` (else
    ``RAY_ADDRESS``, else a local one). A split of fewer than ``TASKS_PER_CPU`` shards per
    CPU is checked in parts of its shards' episodes (rows); ``items_per_task=N`` sets the
    part size (the report is the same). Without Ray installed, a ``UsageError`` now,
    before anything is read."""
    import_ray()  # without Ray: a UsageError now, before anything is read

    def start(stage_dir):
        cluster = connect(address)
        return RayTasks(cluster.ray, cpus=cluster.cpus, stage_dir=stage_dir)

    return Engine(start, {"items_per_task": items_per_task})
