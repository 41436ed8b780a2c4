"""``prepare-pref`` / ``prepare-rl`` on a Ray cluster (``--engine ray``): each chunk of
records rendered, split and proven by a task (``pref.run.pref_task``).

::

    this process: read the inputs ──► chunk ──► task on the cluster ──► the chunk's rows and keys
                  (prepare's chunks)            (renders, proves)        back, in input order
                  ◄── decides each record in input order (rejects, duplicates, kind), writes the rows

What crosses the network: each chunk's raw records to its task, and its rows (ids and
masks) back; the run's context (the tokenizer as its path and sha256, the template
profile, the options) and the curating settings are put once. At most 2 x the cluster's
CPUs chunks are in flight, so memory stays bounded by them. The decisions and the
writing are this process's, the same code as ``--engine local``: the dataset is
byte-identical for any cluster. A task whose worker dies is retried (``max_retries``); a
run that stops early waits for the tasks still running (the one stop rule: ``tasks.RayTasks.close``).
"""

from __future__ import annotations

from ..curate import CurateSettings
from ..tasks import RayTasks
from .cluster import RayCluster, connect, import_ray


class RayPrefRunner(RayTasks):
    """A prepare-pref run's tasks on a Ray cluster (``in_order``'s runner): at most 2 x the
    cluster's CPUs in flight; ``shared`` and the stop rule are ``tasks.RayTasks``'s."""

    def __init__(self, cluster: RayCluster):
        super().__init__(cluster.ray)
        self.depth = 2 * max(1, cluster.cpus)


class RayPrefExecutor:
    """``prepare_pref``'s executor on the Ray cluster at ``address`` (``pref.run.PrefExecutor``)."""

    def __init__(self, address: str | None = None):
        import_ray()  # without Ray: a UsageError now, before anything is read or written
        self.address = address

    def start(self, ctx, curate: CurateSettings) -> RayPrefRunner:
        return RayPrefRunner(connect(self.address))


def ray_pref_executor(address: str | None = None) -> RayPrefExecutor:
    """An executor for ``sftdata.pref.prepare_pref`` on the Ray cluster at ``address`` (else
    ``RAY_ADDRESS``, else a local one). Without Ray installed, a ``UsageError`` now."""
    return RayPrefExecutor(address)
