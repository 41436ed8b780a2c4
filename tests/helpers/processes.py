"""Child processes observed by what they do, never by how long they take: a condition polled
until it holds, a line a child prints, the children of a process, whether a pid still runs,
and a standard input that never ends.

Every wait has a deadline only as a safety net (``SAFETY_S``, far beyond what a loaded
machine needs): reaching it fails the test, naming what never happened, instead of hanging
the suite. No deadline decides whether the behaviour under test passed."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

SAFETY_S = 120.0  # a wait this long is a hang, not a slow machine


def wait_for(what: str, condition, timeout: float = SAFETY_S, poll: float = 0.01):
    """Poll ``condition()`` until it returns a true value, and return that value; fail the
    test naming ``what`` when the safety net runs out first."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout:.0f} s waiting for {what}", pytrace=False)
        time.sleep(poll)


def read_line(stream, what: str, timeout: float = SAFETY_S):
    """The next line of a child's pipe (text or bytes); fail the test naming ``what`` when the
    safety net runs out before the child writes it."""
    got: list = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not got:
        pytest.fail(f"gave up after {timeout:.0f} s waiting for {what}", pytrace=False)
    return got[0]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: its parent has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (SIGSTOP) or gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] in "TtZX"
    except (OSError, IndexError):
        return True


def ignores(pid: int, signum: int) -> bool:
    """Whether ``pid`` ignores signal ``signum`` (its SigIgn mask in /proc; False when gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigIgn:")), 0)
    return bool(mask >> (signum - 1) & 1)


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (Linux: /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


class EndlessInput:
    """Feeds ``block`` to a child's standard input over and over, from a thread, and never
    closes it: a run that reads its input to the end cannot finish while the child lives.
    ``fed`` counts the bytes written; a pipe buffers 64 KiB, so beyond that the child has read
    them. Ends by itself when the child and every process sharing its input are gone."""

    def __init__(self, proc: subprocess.Popen, block: bytes):
        self.proc, self.block, self.fed = proc, block, 0
        self._thread = threading.Thread(target=self._feed, daemon=True, name="endless-input")
        self._thread.start()

    def _feed(self) -> None:
        fd = self.proc.stdin.fileno()
        view = memoryview(self.block)
        try:
            while True:
                done = 0
                while done < len(view):
                    done += os.write(fd, view[done:])
                self.fed += done
        except OSError:  # BrokenPipeError: nobody reads it any more
            return

    def close(self) -> None:
        """After the child ended: wait for the feeding thread, then close the pipe."""
        self._thread.join(SAFETY_S)
        if self._thread.is_alive():
            pytest.fail(f"the standard input of pid {self.proc.pid} still has a reader {SAFETY_S:.0f} s after the "
                        f"child ended: a process sharing it outlived the child", pytrace=False)
        try:
            self.proc.stdin.close()
        except OSError:
            pass


def pool_threads_closed() -> bool:
    """Whether nothing is left for CPython's exit handler (``_python_exit``) to wake: every
    pool manager thread has ended and its wakeup pipe is closed."""
    from concurrent.futures import process

    return all(not t.is_alive() and w._closed for t, w in list(process._threads_wakeups.items()))


def hold(pid_file, go):
    """A task (module-level: it is pickled to the worker) that says it runs, then is held
    until a file matching ``go`` (a glob pattern) appears; returns its pid."""
    pid_file.write_text(str(os.getpid()))
    root = Path("/")
    while not list(root.glob(str(go).lstrip("/"))):
        threading.Event().wait(0.01)
    return os.getpid()
