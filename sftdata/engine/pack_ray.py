"""``pack`` on a Ray cluster (``--engine ray``): the rows' tasks (``sftdata.pack.tasks``) run
as Ray tasks. Connecting is this module's; the tasks, what they send and how a stopped run
ends are ``pack.tasks``' and ``sftdata.tasks``'.
"""

from __future__ import annotations

from ..tasks import Engine, RayTasks
from .cluster import connect, import_ray


def ray_pack_executor(address: str | None = None, shards_per_task: int | None = None,
                      rows_per_task: int | None = None) -> Engine:
    """An engine for ``sftdata.pack.pack`` that builds the rows as tasks on the Ray
    cluster at ``address`` (else ``RAY_ADDRESS``, else a local one): ranges of
    ``shards_per_task`` whole output shards, or pieces of ``rows_per_task`` rows of one
    (default: pieces where the split has fewer shards than ``TASKS_PER_CPU`` per CPU;
    ``pack.tasks.row_tasks``). Without Ray installed, a ``UsageError`` now, before
    anything is read or written."""
    import_ray()

    def start(stage_dir):
        cluster = connect(address)
        return RayTasks(cluster.ray, cpus=cluster.cpus, stage_dir=stage_dir)

    return Engine(start, {"shards_per_task": shards_per_task, "rows_per_task": rows_per_task})
