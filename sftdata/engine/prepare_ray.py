"""``prepare-chat`` / ``prepare-tool`` on a Ray cluster (``--engine ray``).

::

    driver: plan partitions ─► one task per partition ───────────────► gather summaries in
            (byte ranges of      reads its bytes itself, renders and     input order, shift
             JSONL on line        masks them (``process_chunk``), and    record numbers, split,
             starts; other        writes its episodes to
             inputs whole)        _parts/part_N.tmp-PID, renamed to _parts/part_N when complete

What crosses the network: the partition descriptors and the tokenizer (pickled, a few
hundred bytes: what rebuilds it; each worker rebuilds it once) to the tasks; back, a
summary per partition (counts, rejected records, the shard's path). Tokens go from the
task straight to the output's staging area; the driver then copies them, in input order,
into the train/val shards (``prepare``'s own split), so the dataset is byte-identical
to ``--engine local`` for any number of workers.

A task whose worker dies is retried by Ray (``max_retries``); the dead attempt's
``.tmp-PID`` folder is never renamed, so its partial files are never read, and the whole
staging area goes when the run commits or fails.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..prepare import (
    ChunkResult,
    Executor,
    PartNumbering,
    PartSummary,
    PrepareOptions,
    partition_settings,
    prepare_partition,
    range_cuts,
)
from ..sources import SourceInfo
from ..sources.partitions import PART_BYTES, file_digest, line_counts, plan_partitions
from .cluster import RayCluster, connect, import_ray
from .tasks import TASK_RETRIES, get_result, stop_tasks

MIN_PART_BYTES = 1 << 20
PARTS_PER_CPU = 16  # partitions per CPU of the cluster: the last ones to finish leave CPUs idle briefly


def part_bytes_for(infos: list[SourceInfo], cpus: int, part_bytes: int | None = None) -> int:
    if part_bytes is not None:
        return part_bytes
    total = sum(i.bytes for i in infos)
    return int(min(PART_BYTES, max(MIN_PART_BYTES, total // (PARTS_PER_CPU * cpus))))


def run_partitions(cluster: RayCluster, infos: list[SourceInfo], opts: PrepareOptions, tok, profile,
                   token_dtype: np.dtype, stage_dir: Path, part_bytes: int | None = None
                   ) -> Iterator[tuple[ChunkResult, int]]:
    """The Ray executor's body: submit every partition, then yield the results in input
    order, each shifted to global record numbers, and fill in ``infos``."""
    for info in infos:
        if info.kind == "stdin":
            raise UsageError("--engine ray reads files and URLs, which its tasks open themselves; stdin (-) can only "
                             "be read here: use --engine local, or save the input to a file")
    ray = cluster.ray
    parts = plan_partitions(infos, part_bytes_for(infos, cluster.cpus, part_bytes))
    stage_dir.mkdir(parents=True, exist_ok=True)
    task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(prepare_partition)
    scan_task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(line_counts)
    digest_task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(file_digest)
    cuts, cut_of = range_cuts(parts)
    scans = {si: scan_task.remote(infos[si].path, c) for si, c in cuts.items()}
    digests = {si: digest_task.remote(infos[si].path) for si in cuts}  # needed only at the end: nothing waits
    tokenizer = pickle.dumps((tok, profile))
    settings = partition_settings(opts, token_dtype)
    refs = [task.remote(p, scans.get(p.source) if p.start else None,  # the first range starts at line 0
                        cut_of.get((p.source, p.start), -1),
                        tokenizer, settings, str(stage_dir)) for p in parts]
    numbering = PartNumbering(parts, infos)
    got = 0
    try:
        for p, ref in zip(parts, refs):
            s: PartSummary = get_result(ray, ref)
            got += 1
            digest = (lambda si=p.source: get_result(ray, digests[si])) if p.source in digests else None
            yield numbering.place(p, s, digest)
    finally:
        if got < len(refs):  # stopped early (an error, Ctrl-C): no task may write on into the staging area
            stop_tasks(ray, refs[got:] + list(scans.values()) + list(digests.values()), stage_dir)


def ray_prepare_executor(address: str | None = None, part_bytes: int | None = None) -> Executor:
    """An ``Executor`` for ``sftdata.prepare.prepare`` that runs on the Ray cluster at
    ``address`` (else ``RAY_ADDRESS``, else a local one). Without Ray installed, a
    ``UsageError`` now, before anything is read or written."""
    import_ray()

    def run(infos, opts, tok, profile, token_dtype, stage_dir):
        return run_partitions(connect(address), infos, opts, tok, profile, token_dtype, stage_dir, part_bytes)

    return run
