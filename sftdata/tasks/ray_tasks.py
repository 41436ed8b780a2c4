"""Tasks on a Ray cluster: retries, a task's answer (its own error raised as it is), what a
signal handler raised while Ray waited, and the stop rule (``runner``) for Ray tasks.

The ``ray`` module is passed in (``engine.cluster`` imports it and connects): this module
imports no Ray, so a run without ``--engine ray`` never loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import SftDataError
from .runner import write_stop

TASK_RETRIES = 3  # a task whose worker died is run again this many times
TASKS_PER_CPU = 4  # tasks per CPU when cutting work finer: enough for the last ones to balance, few enough to start cheaply
STOP_SECONDS = 60  # how long a run that stops early waits for its tasks to stop
RAISED: list[BaseException] = []  # what a signal handler raised while Ray waited (``raised_in_wait``)


def kept_raised(handler):
    """``handler``, keeping what it raises: Ray turns any exception a handler raises while
    it waits (``ray.get``, ``ray.wait``) into a plain ``KeyboardInterrupt``, so SIGTERM would
    read as Ctrl-C (``raised_in_wait`` gives it back)."""
    if getattr(handler, "keeps_raised", False):
        return handler

    def on_signal(signum, frame):
        try:
            handler(signum, frame)
        except BaseException as e:
            RAISED.append(e)
            raise

    on_signal.keeps_raised = True
    return on_signal


def raised_in_wait(e: KeyboardInterrupt) -> BaseException:
    """What a signal handler raised while Ray waited (a SIGTERM's own exception), else ``e``."""
    got = RAISED[-1] if RAISED else e
    RAISED.clear()
    return got


def get_result(ray, ref, doing: str = "preparing"):
    """``ray.get``, with a task's own sftdata error raised as it is (no Ray traceback);
    ``doing``: what the run was doing, for a failure of the cluster itself."""
    try:
        return ray.get(ref)
    except KeyboardInterrupt as e:  # Ray's: whatever a signal handler raised while it waited
        raise raised_in_wait(e) from None
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, SftDataError):
            raise cause from None
        raise SftDataError(f"a Ray task failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except ray.exceptions.RayError as e:
        raise SftDataError(f"the Ray cluster failed while {doing} ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}); nothing was written") from None


def stop_tasks(ray, refs, stage_dir: Path | None) -> None:
    """The stop rule on Ray: tell the tasks still to come to stop (``STOP_FILE`` in
    ``stage_dir``: each checks it before every chunk) and wait until none runs. Not
    ``ray.cancel``: cancelling a task as it completes can abort the driver inside Ray."""
    write_stop(stage_dir)
    try:
        ray.wait(refs, num_returns=len(refs), timeout=STOP_SECONDS)
    except Exception:  # noqa: BLE001  (the cluster is gone: nothing runs on it)
        pass


class RayTasks:
    """A run's tasks on a Ray cluster (``runner.TaskRunner``): each function made a remote
    task once (1 CPU, retried when its worker dies, with ``options``), the refs not yet
    collected kept, ``close`` by the stop rule (``stop_tasks``). ``shared`` puts what
    every task reads in the object store once. Every task is submitted at once (``depth``
    None) unless a subclass says otherwise; ``stage_dir``: where ``STOP_FILE`` goes."""

    cpus: int = 1
    depth: int | None = None
    stage_dir: Path | None = None

    def __init__(self, ray, options: dict | None = None, *, cpus: int = 1, stage_dir: Path | None = None):
        self.ray = ray
        self.options = options or {}
        self.cpus, self.stage_dir = cpus, stage_dir
        self._remote: dict = {}
        self._pending: set = set()

    def shared(self, value):
        """``value`` put in the cluster's object store once (every task gets the object)."""
        return self.ray.put(value)

    def submit(self, fn: Callable, args: tuple, doing: str):
        task = self._remote.get(fn)
        if task is None:
            task = self._remote[fn] = self.ray.remote(num_cpus=1, max_retries=TASK_RETRIES, **self.options)(fn)
        ref = task.remote(*args)
        self._pending.add(ref)
        return ref

    def result(self, ref, doing: str):
        out = get_result(self.ray, ref, doing)
        self._pending.discard(ref)
        return out

    def close(self, stopped: bool) -> None:
        """A run that stopped early (an error, Ctrl-C): no task may write on into the
        staging area, nor run on unread (``stop_tasks``)."""
        if stopped and self._pending:
            stop_tasks(self.ray, list(self._pending), self.stage_dir)
        self._pending.clear()
