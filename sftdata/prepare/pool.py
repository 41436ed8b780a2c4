"""Worker processes for prepare: its workers, chunks of records, and the pool as a
partitioned run's runner (``PoolRunner``; the generic runner is ``sftdata.tasks``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from ..curate import CurateSettings
from ..sources import RawRecord, SourceInfo
from ..sources.partitions import Partition, plan_partitions
from ..tasks import ProcessRunner, process_pool, worker_started

CHUNK_RECORDS = 512
CHUNK_BYTES = 1 << 20
WORKER: dict = {}
# --workers > 1 on plain JSONL: the input is cut into ranges of at most MAX_PART_BYTES (the progress bar moves once
# per range), each at most 1/(TAIL_WAYS x workers) of what is left and at least MIN_PART_BYTES, so that the last
# ranges are small and the workers finish together
MAX_PART_BYTES = 4 << 20
MIN_PART_BYTES = 256 << 10
TAIL_WAYS = 2


def start_worker(parent_pid: int, work, curate: CurateSettings = CurateSettings(), opts=None) -> None:
    """A ``process_pool`` initializer: ``worker_started``, then what the worker's tasks read,
    kept in it: the row kind's ``work`` (``chunk.EpisodeWork``, ``pref.run.PairWork``:
    pickled to a spawned worker, a tokenizer reloads itself and checks its hash), the
    curating settings and (episodes: ``opts``) its memo of encoded texts."""
    worker_started(parent_pid)
    WORKER.update(work=work, curate=curate, memo=opts.new_memo(work.tok) if opts is not None else None)


def worker_task(items: Sequence[RawRecord]):
    """One chunk of records in a worker (``start_worker``'s): the kind's outcome."""
    return WORKER["work"].outcome(items, WORKER["memo"], WORKER["curate"])


def chunks_of(records: Iterable[tuple[RawRecord, int]]) -> Iterator[tuple[list[RawRecord], int]]:
    buf: list[RawRecord] = []
    size = 0
    pos = 0
    for rec, pos in records:
        buf.append(rec)
        size += len(rec.raw) + 64
        if len(buf) >= CHUNK_RECORDS or size >= CHUNK_BYTES:
            yield buf, pos
            buf, size = [], 0
    if buf:
        yield buf, pos


class PoolRunner(ProcessRunner):
    """A run's tasks in ``--workers`` local processes (``start_worker``, given ``worker``:
    its arguments), which hold the run's work, memo and curating settings: partition tasks
    get ``tokenizer`` and ``curate`` None. A partitioned run's ranges are guided
    (``local_parts``): the last ones small, so the workers finish together. At most
    2 x workers tasks in flight; the stop rule is ``ProcessRunner``'s."""

    tokenizer = None
    curate = None

    def __init__(self, workers: int, worker: tuple, stage_dir: Path | None = None):
        super().__init__(process_pool(workers, start_worker, worker, worker[1]), workers, stage_dir)

    def partitions(self, infos: list[SourceInfo]) -> list[Partition]:
        return local_parts(infos, self.cpus)


def local_parts(infos: list[SourceInfo], workers: int) -> list[Partition]:
    """The ranges ``workers`` local workers read, in input order (guided sizes: at most
    ``MAX_PART_BYTES``, then shrinking to ``MIN_PART_BYTES`` towards the end)."""
    return plan_partitions(infos, MAX_PART_BYTES, shrink=(TAIL_WAYS * workers, MIN_PART_BYTES))
