"""Worker processes for prepare: the pool, chunks of records, results in input order."""

from __future__ import annotations

import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..chat.tokenizer import ChatTokenizer, HFTokenizer
from ..curate import CurateSettings
from ..errors import SftDataError
from ..records.turns import TurnPolicy
from ..sources import RawRecord
from ..template import TemplateProfile
from ..util.lifetime import die_with_parent
from .chunk import curated_chunk
from .options import ChunkResult, PrepareOptions

CHUNK_RECORDS = 512
CHUNK_BYTES = 1 << 20
WORKER: dict = {}


def _worker_init(parent_pid: int, tok, profile: TemplateProfile | None, mode: str, max_tokens: int | None,
                 policy: TurnPolicy, curate: CurateSettings = CurateSettings(),
                 opts: PrepareOptions | None = None) -> None:
    die_with_parent(parent_pid)  # a kill -9 of the parent must not leave workers running
    # Ctrl-C reaches the whole process group: the parent stops the run and terminates the
    # pool; a worker that died of it would print a traceback and leave a task unanswered
    # (pool.terminate() then hangs). SIGTERM (how the pool ends workers) keeps its default.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    WORKER["tok"] = tok  # pickled to a spawned worker: each kind reloads itself and checks its hash
    WORKER["profile"] = profile
    WORKER["mode"] = mode
    WORKER["max_tokens"] = max_tokens
    WORKER["policy"] = policy
    WORKER["curate"] = curate
    WORKER["memo"] = opts.new_memo(WORKER["tok"]) if opts is not None else None  # one per worker, kept


def _worker_run(items: Sequence[RawRecord]) -> ChunkResult:
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
    """``opts.workers`` worker processes (``_worker_init``) in a ``ProcessPoolExecutor``: a
    worker that dies (killed by the system, out of memory) breaks the pool and ends the run
    with an error. A ``multiprocessing.Pool`` would wait forever for the task it held."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    # rensa (--dedup near) runs a thread pool: a process forked from one that has used it
    # waits forever for its threads, so near-dedup workers start from a new interpreter
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() and curate.dedup != "near" else "spawn")
    return ProcessPoolExecutor(opts.workers, mp_context=ctx, initializer=_worker_init,
                               initargs=(os.getpid(), tok, profile, opts.mode, opts.max_tokens, opts.policy, curate,
                                         opts))


def chunk_results(chunks: Iterator[tuple[list[RawRecord], int]], opts: PrepareOptions,
             tok: ChatTokenizer | HFTokenizer, profile: TemplateProfile | None = None,
             curate: CurateSettings = CurateSettings()) -> Iterator[tuple[ChunkResult, int]]:
    """Chunk results in input order; with workers, at most 2 x workers chunks in flight.

    Workers run in a ``ProcessPoolExecutor``: a worker that dies (killed by the system,
    out of memory) breaks the pool and ends the run with an error. A
    ``multiprocessing.Pool`` would wait forever for the chunk the dead worker held."""
    if opts.workers <= 1:
        memo = opts.new_memo(tok)
        for items, pos in chunks:
            yield curated_chunk(items, tok, opts.mode, opts.max_tokens, opts.policy, profile, curate, memo), pos
        return
    jobs = ((_worker_run, (items,), items[0].where, pos) for items, pos in chunks)
    yield from in_order(worker_pool(opts, tok, profile, curate), jobs, 2 * opts.workers)


def in_order(pool, jobs: Iterator[tuple[Callable, tuple, str, object]], depth: int) -> Iterator[tuple[object, object]]:
    """``(result, tag)`` of each job ``(function, args, where, tag)`` of ``jobs``, run in
    ``pool``, in the jobs' order with at most ``depth`` in flight; the pool is shut down at
    the end. A worker that dies breaks the pool: the error names ``where`` of the job
    waited for (or being submitted)."""
    from concurrent.futures.process import BrokenProcessPool

    pending: deque = deque()

    def take() -> tuple[object, object]:
        fut, where, tag = pending.popleft()
        try:
            return fut.result(), tag
        except BrokenProcessPool:
            raise _broken(where) from None

    try:
        for fn, args, where, tag in jobs:
            try:
                pending.append((pool.submit(fn, *args), where, tag))
            except BrokenProcessPool:
                raise _broken(where) from None
            if len(pending) >= depth:
                yield take()
        while pending:
            yield take()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _broken(where: str) -> SftDataError:
    return SftDataError(f"a worker process stopped unexpectedly (killed by the system, e.g. out of "
                        f"memory) while the records from {where} on were being prepared; nothing was "
                        f"written. Free memory, or rerun with fewer --workers (--workers 1 uses no "
                        f"worker process)")
