"""Ctrl-C and SIGTERM in the middle of a prepare with workers: a one-line message, the exit
code of the signal, no traceback (from the main process or its workers), and nothing left
at the target or beside it. Runs the real command in a child process, as a shell does.

The signal lands mid-run on any machine, fast or loaded, without guessing how long a run
takes: either the input is standard input, which the test keeps feeding and never closes
(the run cannot end before the signal; the main process reads, workers render), or a file
whose byte ranges the workers read themselves, and then the whole process group is stopped
(SIGSTOP) once its workers run, seen unfinished while stopped, and signalled before it
continues (SIGCONT). Either way the signal comes once both workers have started (they ignore
Ctrl-C, which the main process handles): a Ctrl-C while a worker is still starting is
another moment, not this test's."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.processes import SAFETY_S, EndlessInput, children, ignores, stopped, wait_for

# CPython 3.11's ProcessPoolExecutor may print this at interpreter exit after shutdown(wait=False):
# its atexit hook (_python_exit) wakes the executor's manager thread through a pipe that the
# thread is closing at that moment (a race CPython later closed with a lock: gh-125451). An
# interrupted prepare ends that way (sftdata/prepare/pool.py: in_order shuts its pool down
# without waiting); until it waits for its pool, the message is taken off stderr, every other
# check still holds, and the test is marked xfail naming it.
EXIT_RACE = re.compile(r"Exception ignored in: <module 'threading'[^\n]*\nTraceback \(most recent call last\):\n"
                       r"(?:  [^\n]*\n)*?OSError: \[Errno 9\] Bad file descriptor\n?")


def _without_exit_race(stderr: str) -> tuple[str, bool]:
    m = EXIT_RACE.search(stderr)
    if m is None or "_python_exit" not in m.group() or "thread_wakeup.wakeup()" not in m.group():
        return stderr, False
    return stderr[:m.start()] + stderr[m.end():], True


def _xfail_on_exit_race(r: subprocess.CompletedProcess) -> None:
    if getattr(r, "exit_race", False):
        pytest.xfail("CPython 3.11's ProcessPoolExecutor printed 'OSError: [Errno 9] Bad file descriptor' at exit "
                     "(a pool shut down without waiting, sftdata/prepare/pool.py); everything else held")


RECORD = {"messages": [{"role": "user", "content": "Tell me about the weather in Paris in spring. " * 3},
                       {"role": "assistant", "content": "Mild, with showers and long bright spells. " * 3}]}
LINE = (json.dumps(RECORD) + "\n").encode()
BUSY_BYTES = 4 << 20  # the child has read this much of its standard input: chunks are with the workers


def _run_and_signal(tmp_path: Path, sig: int, group: bool, source: str) -> subprocess.CompletedProcess:
    """prepare-chat -j 2 into tmp_path/work/ds, signalled mid-run: ``sig`` to the whole process
    group (Ctrl-C in a terminal) or to the main process alone (``kill PID``)."""
    work = tmp_path / "work"
    work.mkdir()
    if source == "file":  # 150,000 records (50 MB): plain JSONL, so each worker reads its own byte range
        big = tmp_path / "big.jsonl"
        big.write_bytes(LINE * 150_000)
        args, stdin = [str(big)], subprocess.DEVNULL
    else:
        args, stdin = ["-"], subprocess.PIPE
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "wb") as o, open(err, "wb") as e:
        p = subprocess.Popen([sys.executable, "-m", "sftdata", "prepare-chat", *args, "-o", str(work / "ds"), "-j", "2"],
                             cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=stdin, stdout=o, stderr=e,
                             start_new_session=True)
    feed = EndlessInput(p, LINE * 2000) if source == "stdin" else None
    try:
        def running() -> bool:
            if p.poll() is not None:
                pytest.fail(f"prepare ended (exit {p.returncode}) before it was signalled: {err.read_text()[-2000:]}")
            started = [w for w in children(p.pid) if ignores(w, signal.SIGINT)]  # past their start-up
            return (bool(list(work.glob(".ds.tmp-*"))) and len(started) >= 2
                    and (feed is None or feed.fed >= BUSY_BYTES))

        wait_for("prepare to write its staging folder with 2 workers started", running)
        if source == "file":
            os.killpg(p.pid, signal.SIGSTOP)
            group_pids = [p.pid, *children(p.pid)]
            wait_for("the process group to stop", lambda: all(stopped(pid) for pid in group_pids))
            if p.poll() is not None or (work / "ds").exists():
                pytest.fail("prepare finished before it could be stopped: give it a larger input")
        if group:  # Ctrl-C in a terminal signals the whole foreground process group
            os.killpg(p.pid, sig)
        else:  # `kill PID`
            p.send_signal(sig)
        if source == "file":
            os.killpg(p.pid, signal.SIGCONT)
        try:
            p.wait(SAFETY_S)
        except subprocess.TimeoutExpired:  # it hung on the signal: end it, then fail
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            pytest.fail(f"no exit within {SAFETY_S:.0f} s of the signal; stderr: {err.read_text()[-2000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if feed is not None:
            feed.close()
    stderr, race = _without_exit_race(err.read_text())
    r = subprocess.CompletedProcess(p.args, p.returncode, out.read_text(), stderr)
    r.exit_race = race
    return r


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")
@pytest.mark.parametrize("source", ["stdin", "file"])
def test_ctrl_c_with_workers_leaves_nothing_and_prints_no_traceback(tmp_path, source):
    r = _run_and_signal(tmp_path, signal.SIGINT, group=True, source=source)
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: interrupted; nothing was written to the output"
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr
    assert r.stdout == ""
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []
    _xfail_on_exit_race(r)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")
@pytest.mark.parametrize("source", ["stdin", "file"])
def test_sigterm_removes_the_temporary_folder(tmp_path, source):
    r = _run_and_signal(tmp_path, signal.SIGTERM, group=False, source=source)
    assert r.returncode == 143, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: terminated (SIGTERM); nothing was written to the output"
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []
    _xfail_on_exit_race(r)
