"""Worker processes die with their parent, however the parent dies (SIGKILL included).

Call :func:`die_with_parent` first thing in a worker (a pool's initializer). On Linux the
kernel sends the worker SIGKILL when its parent exits (``PR_SET_PDEATHSIG``); elsewhere a
daemon thread watches the parent's pid and exits the worker within ``poll_s``. Either way
a parent that died before the call is noticed at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

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
