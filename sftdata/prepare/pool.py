"""Worker processes for prepare: its workers, chunks of records, and the pool as a
partitioned run's runner (``PoolRunner``; the generic runner is ``sftdata.tasks``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from ..curate import CurateSettings
from ..records.turns import TurnPolicy
from ..sources import RawRecord, SourceInfo
from ..sources.partitions import Partition, plan_partitions
from ..tasks import ProcessRunner, process_pool, worker_started
from ..template import TemplateProfile
from .chunk import curated_chunk
from .options import PrepareOptions
from .results import ChunkResult

CHUNK_RECORDS = 512
CHUNK_BYTES = 1 << 20
WORKER: dict = {}
# --workers > 1 on plain JSONL: the input is cut into ranges of at most MAX_PART_BYTES (the progress bar moves once
# per range), each at most 1/(TAIL_WAYS x workers) of what is left and at least MIN_PART_BYTES, so that the last
# ranges are small and the workers finish together
MAX_PART_BYTES = 4 << 20
MIN_PART_BYTES = 256 << 10
TAIL_WAYS = 2


def start_worker(parent_pid: int, setup: Callable, *args) -> None:
    """A ``process_pool`` initializer: ``worker_started``, then ``setup(*args)`` (a row
    kind's worker: what its task reads, kept in the worker)."""
    worker_started(parent_pid)
    setup(*args)


def worker_setup(tok, profile: TemplateProfile | None, mode: str, max_tokens: int | None, policy: TurnPolicy,
                 curate: CurateSettings = CurateSettings(), opts: PrepareOptions | None = None) -> None:
    """An episodes worker's state (``worker_task``'s, and a partition task's)."""
    WORKER["tok"] = tok  # pickled to a spawned worker: each kind reloads itself and checks its hash
    WORKER["profile"] = profile
    WORKER["mode"] = mode
    WORKER["max_tokens"] = max_tokens
    WORKER["policy"] = policy
    WORKER["curate"] = curate
    WORKER["memo"] = opts.new_memo(WORKER["tok"]) if opts is not None else None  # one per worker, kept


def worker_task(items: Sequence[RawRecord]) -> ChunkResult:
    """One chunk of episodes in a worker (``worker_setup``'s)."""
    return curated_chunk(items, WORKER["tok"], WORKER["mode"], WORKER["max_tokens"], WORKER["policy"],
                         WORKER["profile"], WORKER["curate"], WORKER["memo"])


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


def worker_pool(opts: PrepareOptions, tok, profile: TemplateProfile | None, curate: CurateSettings):
    """``opts.workers`` episodes workers (``worker_setup``): ``process_pool``."""
    return process_pool(opts.workers, start_worker, (worker_setup, tok, profile, opts.mode, opts.max_tokens,
                                                     opts.policy, curate, opts), curate)


class PoolRunner(ProcessRunner):
    """A run's tasks in ``--workers`` local processes (``worker_pool``), which hold the
    run's tokenizer, memo and curating settings: partition tasks get ``tokenizer`` and
    ``curate`` None. A partitioned run's
    ranges are guided (``local_parts``): the last ones small, so the workers finish
    together. At most 2 x workers tasks in flight; the stop rule is ``ProcessRunner``'s."""

    tokenizer = None
    curate = None

    def __init__(self, opts: PrepareOptions, tok, profile: TemplateProfile | None, stage_dir: Path | None,
                 curate: CurateSettings = CurateSettings(), pool=None):
        """``pool``: a ``process_pool`` of other workers (prepare-pref's) instead of prepare's."""
        super().__init__(pool if pool is not None else worker_pool(opts, tok, profile, curate), opts.workers,
                         stage_dir)

    def partitions(self, infos: list[SourceInfo]) -> list[Partition]:
        return local_parts(infos, self.cpus)


def local_parts(infos: list[SourceInfo], workers: int) -> list[Partition]:
    """The ranges ``workers`` local workers read, in input order (guided sizes: at most
    ``MAX_PART_BYTES``, then shrinking to ``MIN_PART_BYTES`` towards the end)."""
    return plan_partitions(infos, MAX_PART_BYTES, shrink=(TAIL_WAYS * workers, MIN_PART_BYTES))
