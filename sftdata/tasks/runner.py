"""The one task runner protocol, and what drives any runner: results in the jobs' order
(``in_order``), the next item started while the one before is finished (``overlapped``),
and the one stop rule (``running``).

A runner runs the same picklable functions in this process's worker processes
(``pool.ProcessRunner``) or as Ray tasks (``ray_tasks.RayTasks``); what every task reads
(a tokenizer, a rule, an index) is given once, read-only: pickled into the workers when
they start, or put once in Ray's object store. Results are small.

The stop rule, the same for every runner: a run that stops early (an error, Ctrl-C,
SIGTERM) closes its runner ``stopped``: ``STOP_FILE`` is written into the run's staging
area (every task that writes checks it before each piece of its work and writes nothing
more), then every task still running is waited for. Only then may the caller remove the
staging area: no task writes on into a folder being removed.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..store.format import STOP_FILE


class TaskRunner(Protocol):
    """Where a run's tasks run: local worker processes (``pool.ProcessRunner``) or a Ray
    cluster (``ray_tasks.RayTasks``). ``submit`` starts ``fn(*args)`` (``doing``: what it
    does, for an error: "the records from in.jsonl:line 5 on were being prepared");
    ``result`` waits for it; ``close`` ends the runner by the stop rule. A partitioned
    prepare run's runner also gives ``partitions``, ``tokenizer`` and ``curate``
    (``prepare.results.Executor``)."""

    cpus: int
    depth: int | None  # tasks in flight at most (None: every task submitted at once)

    def shared(self, value): ...  # what every task reads, given once (read-only): pass the result to the tasks
    def submit(self, fn: Callable, args: tuple, doing: str): ...
    def result(self, handle, doing: str): ...
    def close(self, stopped: bool) -> None: ...


@dataclass(frozen=True)
class Engine:
    """Where a pipeline's tasks run when not in this process (``--engine ray``: made by
    ``sftdata.engine``): ``start(stage_dir)`` connects and gives the runner of one run
    (``stage_dir``: its staging area, where the stop rule writes; None when its tasks
    write nothing). ``sizes``: how much work one task takes, by the pipeline's own names
    (pack: ``shards_per_task``, ``rows_per_task``; verify: ``items_per_task``); a size
    left out or None is the pipeline's default."""

    start: Callable[[Path | None], TaskRunner]
    sizes: Mapping[str, int | None] = field(default_factory=dict)

    def size(self, name: str) -> int | None:
        return self.sizes.get(name)


def in_order(runner: TaskRunner, fn: Callable, jobs: Iterable[tuple[tuple, str, object]]
             ) -> Iterator[tuple[object, object]]:
    """``(fn(*args), tag)`` of each job ``(args, doing, tag)``, run by ``runner``, in the
    jobs' order with at most ``runner.depth`` in flight (None: all at once); a failure
    says what the job was ``doing``."""
    pending: deque = deque()
    for args, doing, tag in jobs:
        pending.append((runner.submit(fn, args, doing), doing, tag))
        if runner.depth is not None and len(pending) >= runner.depth:
            handle, doing, tag = pending.popleft()
            yield runner.result(handle, doing), tag
    while pending:
        handle, doing, tag = pending.popleft()
        yield runner.result(handle, doing), tag


@contextlib.contextmanager
def running(runner: TaskRunner) -> Iterator[TaskRunner]:
    """``runner``, closed on leaving the block: by the stop rule when it is left by an
    exception (``close(stopped=True)``: no task runs once this returns)."""
    done = False
    try:
        yield runner
        done = True
    finally:
        runner.close(not done)


def write_stop(stage_dir: Path | None) -> None:
    """``STOP_FILE`` in ``stage_dir``: the tasks writing there write nothing more (none
    when the run has no staging area, or it is gone already)."""
    if stage_dir is not None:
        with contextlib.suppress(OSError):  # the staging area is gone already: nothing can be written in it
            (Path(stage_dir) / STOP_FILE).touch()


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
