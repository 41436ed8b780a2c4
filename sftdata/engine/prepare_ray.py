"""``prepare-chat``, ``prepare-tool``, ``prepare-pref`` and ``prepare-rl`` on a Ray cluster
(``--engine ray``): the partitioned run (``sftdata.prepare.partitioned``) with its tasks on
the cluster, for every kind of row (the kind's work: ``prepare.partition_task``).

::

    driver: plan partitions ──► scan_range per byte range ──► prepare_partition per partition ──►
            (byte ranges of       (lines, hash blocks)          (reads its bytes itself, renders,
             JSONL on line                                       masks, stages _parts/part_N)
             starts; other    ◄── summaries in input order: record numbers, rejects, curating,
             inputs whole)        the exact split, the final shards planned from the lengths
                              ──► write_shard per final shard (from the staged parts) ──► commit

What crosses the network: the partition descriptors and the kind's work (the tokenizer
in it pickled, a few hundred bytes: what rebuilds it; each worker rebuilds it once) to the
tasks; back, a summary per partition (counts, rejected records, keys, 3-8 bytes per row
for its length and record, 2 more per row of pairs) and a record per final shard. Tokens
go from a partition task to the staging area and from there to their final shard through
a task (with an object-store output, put straight into the bucket by that task:
``storage.object_upload``), never through the driver; the dataset is byte-identical to
``--engine local`` for any number of workers.

A task whose worker dies is retried by Ray (``max_retries``); the dead attempt's
``.tmp-PID`` folder is never renamed, so its partial files are never read, and the whole
staging area goes when the run commits or fails.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from ..curate import CurateSettings
from ..errors import UsageError
from ..prepare import Executor
from ..sources import SourceInfo
from ..sources.partitions import PART_BYTES, Partition, plan_partitions
from ..tasks import RayTasks
from .cluster import RayCluster, connect, import_ray

MIN_PART_BYTES = 1 << 20
PARTS_PER_CPU = 16  # partitions per CPU of the cluster: the last ones to finish leave CPUs idle briefly


class RayRunner(RayTasks):
    """A run's tasks on a Ray cluster (``tasks.TaskRunner``): every task submitted at once,
    1 CPU each, retried when its worker dies; stopping early writes ``STOP`` and waits
    (the one stop rule: ``tasks.RayTasks.close``)."""

    def __init__(self, cluster: RayCluster, work, stage_dir: Path, curate: CurateSettings,
                 part_bytes: int | None = None, task_env: dict[str, str] | None = None):
        super().__init__(cluster.ray, {"runtime_env": {"env_vars": dict(task_env)}} if task_env else None,
                         cpus=cluster.cpus, stage_dir=stage_dir)
        self.part_bytes = part_bytes
        # what a partition task makes rows with (the tokenizer in it), put once: every task gets the object
        self.tokenizer = self.shared(pickle.dumps(work))
        self.curate = self.shared(curate)  # one object for every task (an evaluation set's index is MBs)

    def partitions(self, infos: list[SourceInfo]) -> list[Partition]:
        for info in infos:
            if info.kind == "stdin":
                raise UsageError("--engine ray reads files and URLs, which its tasks open themselves; stdin (-) can "
                                 "only be read here: use --engine local, or save the input to a file")
        part_bytes = self.part_bytes  # by default PARTS_PER_CPU a CPU, between MIN_PART_BYTES and PART_BYTES each
        if part_bytes is None:
            total = sum(i.bytes for i in infos)
            part_bytes = int(min(PART_BYTES, max(MIN_PART_BYTES, total // (PARTS_PER_CPU * self.cpus))))
        return plan_partitions(infos, part_bytes)


@dataclass(frozen=True)
class RayExecutor:
    """``prepare``'s and ``prepare_pref``'s executor on the Ray cluster at ``address`` (``Executor``)."""

    address: str | None = None
    part_bytes: int | None = None
    task_env: dict[str, str] | None = None

    def start(self, opts, work, stage_dir: Path, curate: CurateSettings) -> RayRunner:
        return RayRunner(connect(self.address), work, stage_dir, curate, self.part_bytes, self.task_env)


def ray_prepare_executor(address: str | None = None, part_bytes: int | None = None,
                         task_env: dict[str, str] | None = None) -> Executor:
    """An ``Executor`` for ``sftdata.prepare.prepare`` and ``prepare_pref`` that runs on the Ray cluster at
    ``address`` (else ``RAY_ADDRESS``, else a local one). ``task_env``: environment
    variables the tasks run with (Ray's ``runtime_env``), e.g. an object store's endpoint
    for tasks that upload their shards (the nodes' own settings otherwise). Without Ray
    installed, a ``UsageError`` now, before anything is read or written."""
    import_ray()
    return RayExecutor(address, part_bytes, task_env)
