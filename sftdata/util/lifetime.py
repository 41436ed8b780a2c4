"""Worker processes die with their parent, however the parent dies (SIGKILL included).

Call :func:`die_with_parent` first thing in a worker (a pool's initializer). On Linux the
kernel sends the worker SIGKILL when its parent exits (``PR_SET_PDEATHSIG``); elsewhere a
daemon thread watches the parent's pid and exits the worker within ``poll_s``. Either way
a parent that died before the call is noticed at once.

:func:`signals_held` holds Ctrl-C and SIGTERM back around the steps of the main thread
that take a lock a pool's manager thread also takes (an interrupt there would leave it
held, and the pool's end would wait for ever).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, poll_s: float = 0.5) -> str:
    """Arrange for this process to end when ``parent_pid`` does; returns the mechanism
    used (``"pdeathsig"`` or ``"watch"``)."""
    how = "watch"
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                how = "pdeathsig"
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    if how == "watch":
        threading.Thread(target=_watch, args=(parent_pid, poll_s), daemon=True, name="sftdata-parent-watch").start()
    return how


def _watch(parent_pid: int, poll_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    os._exit(1)


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back for the block, then raised as they would have been.

    For the few steps that take a lock another thread also takes (a worker pool's
    ``submit``, a future's condition): an interrupt raised there can leave the lock held
    for ever, and the pool's manager thread then waits on it for ever (the process never
    exits). Outside the main thread (where no signal handler runs) the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[tuple[int, object]] = []
    old: dict[int, object] = {}
    try:
        for s in HELD_SIGNALS:
            if signal.getsignal(s) is not None:  # None: a handler not set from Python, left as it is
                old[s] = signal.signal(s, lambda n, f: got.append((n, f)))
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if got:
            _deliver(old.get(got[0][0]), *got[0])


def _deliver(handler, signum: int, frame) -> None:
    """Signal ``signum``, held back, given to the handler it found (``signals_held``)."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action (SIGTERM: the process ends)
