"""Kill a run at its Nth file system operation: deterministic, event-driven kill points.

``run_forked(job, kill_at)`` forks this process (sftdata, the tokenizer and the caches are
already loaded and warm, so each run costs milliseconds) and runs ``job()`` in the child
with every operation that changes the file system counted: the mutating ``os`` calls
(``mkdir``, ``rename``, ``replace``, ``unlink``, ``rmdir``, ``write``, ``pwrite``,
``ftruncate``, ``link``, ``os.open`` with a writing flag), a file opened for writing
(``open`` in a ``w``, ``a``, ``x`` or ``+`` mode) and ``renameat2`` (the writer's swap). Just
before operation ``kill_at`` the child sends itself SIGKILL: no ``finally``, no atexit, the
state a power cut or ``kill -9`` leaves. With ``kill_at=None`` the child runs to the end
and reports how many operations it made and the number of the one that put the new
dataset at ``target`` (the commit): the kill points are drawn from those counts.

The same job from the same state makes the same operations in the same order (one
process, ``workers=1``), so a kill point names one instant of the run.
"""

from __future__ import annotations

import builtins
import io
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

import sftdata.storage.fsops as fsops

_OS_CALLS = ("mkdir", "rename", "replace", "unlink", "remove", "rmdir", "write", "pwrite", "ftruncate", "link")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@dataclass
class Outcome:
    killed: bool  # the child died of SIGKILL at the kill point
    ops: int | None = None  # a run to the end: its operations
    commit: int | None = None  # ... and the number of the operation that put a dataset at the target
    error: str | None = None  # a run to the end that raised


class _Counter:
    def __init__(self, kill_at: int | None, target: Path):
        self.n = 0
        self.kill_at = kill_at
        self.target = os.fspath(target)
        self.commit: int | None = None

    def tick(self, dst=None) -> None:
        self.n += 1
        if self.n == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if dst is not None and self.commit is None and os.fspath(dst) == self.target:
            self.commit = self.n


def _install(counter: _Counter) -> None:
    for name in _OS_CALLS:
        real = getattr(os, name)

        def wrapped(*a, _real=real, _name=name, **kw):
            counter.tick(a[1] if _name in ("rename", "replace") and len(a) > 1 else None)
            return _real(*a, **kw)

        setattr(os, name, wrapped)
    real_open = os.open

    def os_open(path, flags, *a, **kw):
        if flags & _WRITE_FLAGS:
            counter.tick()
        return real_open(path, flags, *a, **kw)

    os.open = os_open
    real_io_open = io.open

    def file_open(file, mode="r", *a, **kw):
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            counter.tick()
        return real_io_open(file, mode, *a, **kw)

    builtins.open = io.open = file_open
    real_renameat2 = fsops._renameat2

    def renameat2(src, dst, flags):
        counter.tick(dst)
        return real_renameat2(src, dst, flags)

    fsops._renameat2 = renameat2


def run_forked(job: Callable[[], object], target: Path, kill_at: int | None = None) -> Outcome:
    """Run ``job()`` in a forked child, killed just before its operation ``kill_at``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test
        code = 0
        try:
            os.close(r)
            counter = _Counter(kill_at, target)
            _install(counter)
            try:
                job()
                report = {"ops": counter.n, "commit": counter.commit}
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                report = {"error": f"{type(e).__name__}: {e}"}
            counter.kill_at = None
            os.write(w, orjson.dumps(report))  # counted, but past any kill point
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return Outcome(killed=True)
    report = orjson.loads(data) if data else {"error": f"the child ended with status {status} and no report"}
    return Outcome(False, report.get("ops"), report.get("commit"), report.get("error"))
