"""Worker processes for prepare: the pool, chunks of records, results in input order, and the
pool as a partitioned run's runner (``PoolRunner``)."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from ..curate import CurateSettings
from ..errors import SftDataError
from ..records.turns import TurnPolicy
from ..sources import RawRecord, SourceInfo
from ..sources.partitions import Partition, plan_partitions
from ..store.format import STOP_FILE
from ..template import TemplateProfile
from ..util.lifetime import die_with_parent, signals_held
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


def worker_started(parent_pid: int) -> None:
    """What every worker process does first (prepare's, prepare-pref's)."""
    die_with_parent(parent_pid)  # a kill -9 of the parent must not leave workers running
    # Ctrl-C reaches the whole process group: the parent stops the run and terminates the
    # pool; a worker that died of it would print a traceback and leave a task unanswered
    # (pool.terminate() then hangs). SIGTERM (how the pool ends workers) keeps its default.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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


def process_pool(workers: int, initializer: Callable, initargs: tuple, curate: CurateSettings):
    """``workers`` processes, each started by ``initializer(parent pid, *initargs)``, in a
    ``ProcessPoolExecutor``: a worker that dies (killed by the system, out of memory)
    breaks the pool and ends the run with an error. A ``multiprocessing.Pool`` would wait
    forever for the task it held. (prepare's and prepare-pref's workers alike.)"""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    # rensa (--dedup near) runs a thread pool: a process forked from one that has used it
    # waits forever for its threads, so near-dedup workers start from a new interpreter
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() and curate.dedup != "near" else "spawn")
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer, initargs=(os.getpid(), *initargs))


def worker_pool(opts: PrepareOptions, tok, profile: TemplateProfile | None, curate: CurateSettings):
    """``opts.workers`` episodes workers (``worker_setup``): ``process_pool``."""
    return process_pool(opts.workers, start_worker, (worker_setup, tok, profile, opts.mode, opts.max_tokens,
                                                     opts.policy, curate, opts), curate)


def overlapped(jobs: Iterable[tuple[object, object]], start: Callable) -> Iterator[tuple[object, object]]:
    """``(start(item), tag)`` of each ``(item, tag)`` of ``jobs``, each yielded once the
    next one is started: what ``start`` leaves running in the background (a chunk's
    tokenizing, on a thread) goes on while the next item starts. An error getting or
    starting the next item is raised after the item before it is yielded, as one item
    at a time would."""
    prev = None
    it = iter(jobs)
    while True:
        try:
            try:
                item, tag = next(it)
            except StopIteration:
                break
            cur = (start(item), tag)  # a StopIteration from start is an error (PEP 479), not the end
        except Exception:
            if prev is not None:
                yield prev
            raise
        if prev is not None:
            yield prev
        prev = cur
    if prev is not None:
        yield prev


def in_order(runner, fn: Callable, jobs: Iterable[tuple[tuple, str, object]]) -> Iterator[tuple[object, object]]:
    """``(fn(*args), tag)`` of each job ``(args, doing, tag)``, run by ``runner`` (a
    ``PoolRunner``, or an engine's runner: ``results.TaskRunner``), in the jobs' order with at
    most ``runner.depth`` in flight (None: all at once); a failure says what the job was
    ``doing`` ("the records from in.jsonl:line 5 on were being prepared")."""
    pending: deque = deque()
    for args, doing, tag in jobs:
        pending.append((runner.submit(fn, args, doing), doing, tag))
        if runner.depth is not None and len(pending) >= runner.depth:
            handle, doing, tag = pending.popleft()
            yield runner.result(handle, doing), tag
    while pending:
        handle, doing, tag = pending.popleft()
        yield runner.result(handle, doing), tag


def _broken(doing: str) -> SftDataError:
    return SftDataError(f"a worker process stopped unexpectedly (killed by the system, e.g. out of "
                        f"memory) while {doing}; nothing was written. Free memory, or rerun with fewer "
                        f"--workers (--workers 1 uses no worker process)")


class PoolRunner:
    """A run's tasks in ``--workers`` local processes (``worker_pool``), which hold the
    run's tokenizer, memo and curating settings: partition tasks get ``tokenizer`` and
    ``curate`` None. A partitioned run's
    ranges are guided (``local_parts``): the last ones small, so the workers finish
    together. At most 2 x workers tasks in flight."""

    tokenizer = None
    curate = None

    def __init__(self, opts: PrepareOptions, tok, profile: TemplateProfile | None, stage_dir: Path | None,
                 curate: CurateSettings = CurateSettings(), pool=None):
        """``pool``: a ``process_pool`` of other workers (prepare-pref's) instead of prepare's."""
        self.cpus, self.depth, self.stage_dir = opts.workers, 2 * opts.workers, stage_dir
        self.pool = pool if pool is not None else worker_pool(opts, tok, profile, curate)

    def partitions(self, infos: list[SourceInfo]) -> list[Partition]:
        return local_parts(infos, self.cpus)

    def submit(self, fn: Callable, args: tuple, doing: str):
        from concurrent.futures.process import BrokenProcessPool

        try:
            with signals_held():  # submit takes the lock the pool's manager thread takes
                return self.pool.submit(fn, *args)
        except BrokenProcessPool:
            raise _broken(doing) from None

    def result(self, future, doing: str):
        from concurrent.futures.process import BrokenProcessPool

        try:
            return wait_result(future)
        except BrokenProcessPool:
            raise _broken(doing) from None

    def close(self, stopped: bool) -> None:
        """The pool shut down, its workers waited for (``stop_pool``). A run that stopped
        early first tells the tasks still running to write nothing more (``STOP_FILE``,
        checked before every chunk): none outlives the stop, so the staging area can be
        removed once this returns."""
        if stopped and self.stage_dir is not None:
            with contextlib.suppress(OSError):  # the staging area is gone already: nothing can be written in it
                (self.stage_dir / STOP_FILE).touch()
        stop_pool(self.pool, stopped)


def wait_result(future):
    """``future.result()``, waited for without holding the future's lock: Ctrl-C while
    waiting leaves no lock held (the pool's manager thread takes it to answer or cancel
    the future; an interrupt inside ``Future.result`` could leave it held for ever)."""
    done = _thread.allocate_lock()
    done.acquire()
    with signals_held():
        future.add_done_callback(lambda _: done.release())
    done.acquire()  # interruptible; the pool's thread releases it when the future is answered
    with signals_held():
        return future.result()


def stop_pool(pool, stopped: bool) -> None:
    """``pool`` (a ``process_pool``) shut down, its workers and manager thread waited for
    before this returns: the tasks not started are cancelled, the ones running finish (a
    run that ``stopped`` early has told them to write nothing more: they return at their
    next chunk). So no worker writes on into a staging area about to be removed, and no
    manager thread is left to race CPython's exit handler (``_python_exit`` waking it
    through the pipe it is closing: "OSError: [Errno 9] Bad file descriptor" at exit).

    Workers are not killed first: one killed while it sends its result leaves half a
    message in the result pipe, and the manager thread waits for the rest for ever. Only a
    second interrupt during the wait ends them (``_end_workers``)."""
    thread = getattr(pool, "_executor_manager_thread", None)
    procs = list((getattr(pool, "_processes", None) or {}).values())
    results = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    with signals_held():  # shutdown takes the lock the manager thread takes: never interrupted there
        pool.shutdown(wait=False, cancel_futures=True)
    try:
        if thread is not None:
            thread.join()  # the manager thread ends once every worker has
        for p in procs:
            p.join()
    except BaseException:
        if stopped:
            _end_workers(procs, results)
        raise


def _end_workers(procs: list, results) -> None:
    """The pool's worker processes ``procs`` killed and waited for (a second Ctrl-C while
    a stopped run waits for them), and this process's end ``results`` of the result pipe
    closed, so that a manager thread reading half a message a killed worker was sending
    gets the end of the file (the pool is broken) instead of waiting for ever."""
    with signals_held():
        for p in procs:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                p.kill()
        for p in procs:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                p.join()
        with contextlib.suppress(OSError, AttributeError):
            results.close()


def local_parts(infos: list[SourceInfo], workers: int) -> list[Partition]:
    """The ranges ``workers`` local workers read, in input order (guided sizes: at most
    ``MAX_PART_BYTES``, then shrinking to ``MIN_PART_BYTES`` towards the end)."""
    return plan_partitions(infos, MAX_PART_BYTES, shrink=(TAIL_WAYS * workers, MIN_PART_BYTES))
