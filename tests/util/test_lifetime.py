"""Workers die with their parent: SIGKILL of a parent leaves no orphan behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from sftdata.util.lifetime import _watch, signals_held
from tests.helpers.paths import ROOT
from tests.helpers.processes import SAFETY_S, EndlessInput, alive, children, read_line, wait_for

PARENT = """
import multiprocessing as mp, os, sys
from concurrent.futures import ProcessPoolExecutor
from sftdata.util.lifetime import die_with_parent

def init(parent, barrier):
    global BARRIER
    die_with_parent(parent)
    BARRIER = barrier

def pid(_):
    BARRIER.wait()  # each task waits for the other: two workers hold one each
    return os.getpid()

if __name__ == "__main__":
    ctx = mp.get_context()
    pool = ProcessPoolExecutor(2, mp_context=ctx, initializer=init, initargs=(os.getpid(), ctx.Barrier(2)))
    print(" ".join(map(str, sorted(set(pool.map(pid, range(2)))))), flush=True)
    sys.stdin.read()  # until it is killed: the test holds this pipe open
"""


def test_pool_workers_die_with_a_sigkilled_parent(tmp_path):
    (tmp_path / "parent.py").write_text(PARENT)
    p = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        workers = [int(w) for w in read_line(p.stdout, "the pool's two workers to report their pids").split()]
        assert len(workers) == 2 and all(alive(w) for w in workers)
        p.send_signal(signal.SIGKILL)
        p.wait()
        wait_for("the workers to die with their SIGKILLed parent (else they are orphans)",
                 lambda: not any(alive(w) for w in workers))
    finally:
        p.kill()
        p.wait()
        p.stdin.close()


def test_a_parent_that_died_before_the_call_ends_the_worker_at_once():
    code = "import os; from sftdata.util.lifetime import die_with_parent; die_with_parent(os.getppid() + 1); print('survived')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_S,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (r.returncode, r.stdout) == (1, "")


def test_the_linux_mechanism_is_the_kernels():
    if sys.platform.startswith("linux"):
        code = "import os; from sftdata.util.lifetime import die_with_parent; print(die_with_parent(os.getppid()))"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_S,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.stdout == "pdeathsig\n"


def test_the_watch_thread_exits_when_the_parent_changes(monkeypatch):
    exits = []
    monkeypatch.setattr(os, "getppid", lambda: 1)
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    _watch(parent_pid=4242, poll_s=0.01)
    assert exits == [1]


def test_sigkill_of_prepare_leaves_no_worker_keeps_the_old_dataset_and_the_next_run_sweeps(tmp_path):
    """Killed mid-run for certain: its input is standard input, fed and never closed, so the
    run cannot end before the SIGKILL, however fast the machine."""
    out = tmp_path / "ds"
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"messages": [{"role": "user", "content": "q"},
                                              {"role": "assistant", "content": "a"}]}) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "sftdata", "prepare-chat"]
    subprocess.run([*cli, str(small), "-o", str(out), "-q"], check=True, env=env, timeout=SAFETY_S)
    old = (out / "dataset_metadata.json").read_bytes()
    words = "the quick brown fox jumps over a lazy dog while sixty zebras quietly graze".split()
    block = "".join(json.dumps({"messages": [{"role": "user", "content": f"{i} " + " ".join(words * 4)},
                                             {"role": "assistant", "content": " ".join(words * 4)}]}) + "\n"
                    for i in range(2000)).encode()
    p = subprocess.Popen([*cli, "-", "-o", str(out), "--overwrite", "--workers", "2", "-q"], env=env,
                         stdin=subprocess.PIPE)
    feed = EndlessInput(p, block)

    def working() -> list[int] | None:  # the workers, once the run stages its output and reads its input
        workers = children(p.pid)
        staged = list(tmp_path.glob(".ds.tmp-*")) and feed.fed >= (4 << 20)
        return workers if staged and len(workers) >= 2 else None

    try:
        workers = wait_for("prepare to stage its output with 2 workers, reading its input", working)
        p.send_signal(signal.SIGKILL)
        p.wait()
        wait_for("the workers to die with their SIGKILLed parent (else they are orphans)",
                 lambda: not any(alive(w) for w in workers))
    finally:
        p.kill()
        p.wait()
        feed.close()
    assert (out / "dataset_metadata.json").read_bytes() == old  # the old dataset is intact
    (staging,) = tmp_path.glob(".ds.tmp-*")  # the killed run's staging is left ...
    # --force: the same build as the old dataset's would be up to date, and an up-to-date run touches nothing
    r = subprocess.run([*cli, str(small), "-o", str(out), "--force", "--json"], env=env, timeout=SAFETY_S,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not staging.exists()  # ... and swept by the next run to that target, which says so
    assert r.stderr == (f"warning: removed 1 stale staging folder(s) of {out} left by runs that died: "
                        f"{staging.name}\n")
    assert not list(tmp_path.glob(".ds.*"))


class Stopped(Exception):
    pass


def test_signals_held_raises_a_signal_after_the_block_not_inside_it():
    """A SIGTERM (or Ctrl-C) that arrives inside ``signals_held`` is raised by the handler
    it found once the block is done (a lock taken in the block is released by then), the
    handlers as they were; a block without a signal leaves nothing behind."""
    def ours(signum, frame):
        raise Stopped(signum)

    old = signal.signal(signal.SIGTERM, ours)
    steps = []
    try:
        with pytest.raises(Stopped) as e:
            with signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                signal.sigtimedwait([], 0)  # a point where a handler would have run
                steps.append("the block went on")
        assert steps == ["the block went on"] and e.value.args == (signal.SIGTERM,)
        assert signal.getsignal(signal.SIGTERM) is ours and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with signals_held():
            steps.append("quiet")
        assert steps[-1] == "quiet" and signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, old)
