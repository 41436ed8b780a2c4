"""What every Ray engine shares: retries, a task's answer (its own error raised as it is),
and stopping the tasks of a run that ends early.

A run's tasks write into a staging area; when the run stops early (an error, Ctrl-C)
the driver writes ``STOP_FILE`` there, which every task checks before each chunk of its
work, and waits for them before the staging area is removed.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SftDataError
from ..store.format import STOP_FILE
from .cluster import raised_in_wait

TASK_RETRIES = 3  # a task whose worker died is run again this many times
TASKS_PER_CPU = 4  # tasks per CPU when cutting work finer: enough for the last ones to balance, few enough to start cheaply
STOP_SECONDS = 60  # how long a run that stops early waits for its tasks to stop


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


def stop_tasks(ray, refs, stage_dir: Path) -> None:
    """Tell the tasks still to come to stop (``STOP_FILE``: each checks it before every
    chunk) and wait until none runs. Not ``ray.cancel``: cancelling a task as it
    completes can abort the driver inside Ray."""
    try:
        (stage_dir / STOP_FILE).touch()
    except OSError:  # the staging area is gone already: a task can create nothing in it
        return
    try:
        ray.wait(refs, num_returns=len(refs), timeout=STOP_SECONDS)
    except Exception:  # noqa: BLE001  (the cluster is gone: nothing runs on it)
        pass


class RayTasks:
    """A run's tasks on a Ray cluster (the runner ``prepare.pool.in_order`` drives): each
    function made a remote task once (1 CPU, retried when its worker dies, with
    ``options``), the refs not yet collected kept in ``pending``."""

    def __init__(self, ray, options: dict | None = None):
        self.ray = ray
        self.options = options or {}
        self._remote: dict = {}
        self._pending: set = set()

    def submit(self, fn, args: tuple, doing: str):
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
