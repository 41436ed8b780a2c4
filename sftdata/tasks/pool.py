"""Tasks in local worker processes: the pool (``process_pool``), the runner over it
(``ProcessRunner``) and its stop (``stop_pool``), safe against Ctrl-C and dead workers."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

from ..errors import SftDataError
from ..util.lifetime import die_with_parent, signals_held
from .runner import write_stop


def worker_started(parent_pid: int) -> None:
    """What every worker process does first (prepare's, prepare-pref's)."""
    die_with_parent(parent_pid)  # a kill -9 of the parent must not leave workers running
    # Ctrl-C reaches the whole process group: the parent stops the run and terminates the
    # pool; a worker that died of it would print a traceback and leave a task unanswered
    # (pool.terminate() then hangs). SIGTERM (how the pool ends workers) keeps its default.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def process_pool(workers: int, initializer: Callable, initargs: tuple, curate=None):
    """``workers`` processes, each started by ``initializer(parent pid, *initargs)``, in a
    ``ProcessPoolExecutor``: a worker that dies (killed by the system, out of memory)
    breaks the pool and ends the run with an error. A ``multiprocessing.Pool`` would wait
    forever for the task it held. ``curate``: the run's curating settings (their
    ``dedup``), when its workers curate."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    # rensa (--dedup near) runs a thread pool: a process forked from one that has used it
    # waits forever for its threads, so near-dedup workers start from a new interpreter
    fork = "fork" in mp.get_all_start_methods() and getattr(curate, "dedup", None) != "near"
    ctx = mp.get_context("fork" if fork else "spawn")
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer, initargs=(os.getpid(), *initargs))


@contextlib.contextmanager
def _unbroken(doing: str):
    """A pool broken by a worker that died, while the run was ``doing``: one error saying so."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        yield
    except BrokenProcessPool:
        raise SftDataError(f"a worker process stopped unexpectedly (killed by the system, e.g. out of "
                           f"memory) while {doing}; nothing was written. Free memory, or rerun with fewer "
                           f"--workers (--workers 1 uses no worker process)") from None


class ProcessRunner:
    """A run's tasks in the local worker processes of ``pool`` (a ``process_pool``: what
    every task reads was given to its workers when they started), at most 2 x ``workers``
    in flight (``runner.TaskRunner``). ``stage_dir``: the run's staging area, where the stop
    rule writes ``STOP_FILE`` (None: its tasks write nothing)."""

    def __init__(self, pool, workers: int, stage_dir: Path | None = None):
        self.cpus, self.depth, self.stage_dir, self.pool = workers, 2 * workers, stage_dir, pool

    def shared(self, value):
        """``value`` as the tasks get it (pickled with each task that is given it)."""
        return value

    def submit(self, fn: Callable, args: tuple, doing: str):
        with _unbroken(doing), signals_held():  # submit takes the lock the pool's manager thread takes
            return self.pool.submit(fn, *args)

    def result(self, future, doing: str):
        with _unbroken(doing):
            return wait_result(future)

    def close(self, stopped: bool) -> None:
        """The stop rule (``runner``): a run that stopped early first tells the tasks still
        running to write nothing more (``STOP_FILE``); then the pool is shut down and its
        workers waited for (``stop_pool``), so the staging area can be removed once this
        returns."""
        if stopped:
            write_stop(self.stage_dir)
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
