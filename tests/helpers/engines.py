"""For the tests of the Ray engines: two datasets compared file by file, and a worker
killed while it writes."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
import time
from pathlib import Path

from sftdata.tasks import Engine


def files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def same_dataset(a: Path, b: Path) -> None:
    fa, fb = files(a), files(b)
    assert sorted(fa) == sorted(fb)
    assert [k for k in fa if fa[k] != fb[k]] == []



@contextlib.contextmanager
def kill_first_writer(root: Path, pattern: str):
    """While the block runs, SIGKILL the first worker seen writing under ``root`` (a
    ``NAME.tmp-PID`` folder matching ``pattern``), once; yields the list of killed pids."""
    killed: list[int] = []
    stop = threading.Event()

    def killer():
        while not stop.is_set() and not killed:
            for tmp in root.glob(pattern):
                pid = int(tmp.name.split(".tmp-")[1].split("-")[0])
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
            time.sleep(0.001)

    t = threading.Thread(target=killer)
    t.start()
    try:
        yield killed
    finally:
        stop.set()
        t.join()


class InProcess:
    """A task runner (``sftdata.tasks.TaskRunner``) that runs each task here as it is
    submitted, what it is given and what it answers pickled as Ray sends them: each task
    gets its own copy of a shared value, as a Ray task does."""

    cpus, depth, stage_dir = 1, None, None

    def shared(self, value):
        return value  # each task gets its own copy: ``submit`` pickles what it is given

    def submit(self, fn, args, doing):
        return pickle.loads(pickle.dumps(fn(*pickle.loads(pickle.dumps(args)))))

    def result(self, handle, doing):
        return handle

    def close(self, stopped: bool) -> None:
        pass


def in_process_engine(**sizes) -> Engine:
    """An engine whose tasks run in this process (``InProcess``), of the given sizes."""
    return Engine(lambda stage_dir: InProcess(), sizes)
