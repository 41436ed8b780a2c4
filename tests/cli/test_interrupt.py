"""Ctrl-C and SIGTERM in the middle of a prepare with workers: a one-line message, the exit
code of the signal, no traceback (from the main process or its workers), and nothing left
at the target or beside it. Runs the real command in a child process, as a shell does.

The signal lands mid-run on any machine, fast or loaded, without guessing how long a run
takes: either the input is standard input, which the test keeps feeding and never closes
(the run cannot end before the signal; the main process reads, workers render), or a file
whose byte ranges the workers read themselves, and then the whole process group is stopped
(SIGSTOP) once the run is under way, seen unfinished while stopped (else the test starts
again on an input 4 times larger), and signalled before it continues (SIGCONT).

"Under way" is observed, not waited for: both workers have started (they ignore Ctrl-C,
which the main process handles) and the main process has written tokens of their results.
A Ctrl-C while a worker is still starting (its traceback is printed) or while the main
process forks one (the interrupt is lost in os.fork's handlers and the run completes) is
another moment than this test's."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sftdata.storage.leftovers import clean
from tests.helpers.paths import ROOT
from tests.helpers.processes import SAFETY_S, EndlessInput, alive, children, ignores, stopped, wait_for

RECORD = {"messages": [{"role": "user", "content": "Tell me about the weather in Paris in spring. " * 3},
                       {"role": "assistant", "content": "Mild, with showers and long bright spells. " * 3}]}
LINE = (json.dumps(RECORD) + "\n").encode()
BUSY_BYTES = 4 << 20  # the child has read this much of its standard input: chunks are with the workers
FILE_RECORDS = (150_000, 600_000)  # 50 MB; 200 MB only where a machine prepared the first before it could be stopped

# Two ways CPython 3.11's ProcessPoolExecutor spoiled the end of an interrupted prepare, which
# the product now avoids (prepare/pool.py): the exit handler (_python_exit) waking a pool's
# manager thread through the pipe that thread was closing ("OSError: [Errno 9] Bad file
# descriptor" after the one-line error: every pool is now shut down waiting for that thread),
# and an interrupt inside Future.result() leaving the future's lock held, the manager thread
# waiting on it for ever (results are now waited for without holding it: signals_held).
# Either is now a failure of these tests.


class LinkPlanter:
    """What anyone who can write to the output's parent folder can do: as soon as a staging
    folder's name disappears (the run removed it), a link to ``victim`` stands there."""

    def __init__(self, folder: Path, victim: Path):
        self.folder, self.victim, self.planted = folder, victim, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="link-planter")
        self._thread.start()

    def _watch(self) -> None:
        seen: set[str] = set()
        while not self._stop.is_set():
            names = {n for n in os.listdir(self.folder) if ".tmp-" in n}
            for gone in seen - names:
                with contextlib.suppress(OSError):
                    os.symlink(self.victim, self.folder / gone)
                    self.planted.append(gone)
            seen |= names
            self._stop.wait(0.0005)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(SAFETY_S)


def _attempt(tmp_path: Path, sig: int, group: bool, source: str, records: int,
             victim: Path | None = None) -> subprocess.CompletedProcess | None:
    """prepare-chat -j 2 into tmp_path/work/ds, signalled mid-run: ``sig`` to the whole process
    group (Ctrl-C in a terminal) or to the main process alone (``kill PID``). None when a file
    of ``records`` records was prepared whole before the run could be stopped."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    if source == "file":  # plain JSONL, so each worker reads its own byte range
        big = tmp_path / "big.jsonl"
        big.write_bytes(LINE * records)
        args, stdin = [str(big)], subprocess.DEVNULL
    else:
        args, stdin = ["-"], subprocess.PIPE
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}  # stacks on SIGABRT, if it hangs
    with open(out, "wb") as o, open(err, "wb") as e:
        p = subprocess.Popen([sys.executable, "-m", "sftdata", "prepare-chat", *args, "-o", str(work / "ds"), "-j", "2"],
                             cwd=work, env=env, stdin=stdin, stdout=o, stderr=e, start_new_session=True)
    feed = EndlessInput(p, LINE * 2000) if source == "stdin" else None
    planter = LinkPlanter(work, victim) if victim is not None else None
    workers: set[int] = set()
    try:
        def under_way() -> bool:
            if p.poll() is not None:
                return True  # told apart below
            started = [w for w in children(p.pid) if ignores(w, signal.SIGINT)]  # past their start-up
            workers.update(started)
            written = any(t.stat().st_size for t in work.glob(".ds.tmp-*/*/shard_*/tokens.bin"))
            return len(started) >= 2 and written and (feed is None or feed.fed >= BUSY_BYTES)

        wait_for("prepare to write the tokens of its 2 workers' results", under_way)
        if p.poll() is not None:
            if p.returncode == 0 and source == "file":
                return None
            pytest.fail(f"prepare ended (exit {p.returncode}) before it was signalled: {err.read_text()[-2000:]}")
        if source == "file":
            os.killpg(p.pid, signal.SIGSTOP)
            group_pids = [p.pid, *children(p.pid)]
            wait_for("the process group to stop", lambda: all(stopped(pid) for pid in group_pids))
            if p.poll() is not None or (work / "ds").exists():
                os.killpg(p.pid, signal.SIGCONT)
                p.wait()
                return None
        if group:  # Ctrl-C in a terminal signals the whole foreground process group
            os.killpg(p.pid, sig)
        else:  # `kill PID`
            p.send_signal(sig)
        if source == "file":
            os.killpg(p.pid, signal.SIGCONT)
        try:
            p.wait(SAFETY_S)
        except subprocess.TimeoutExpired:  # it hung on the signal: its stacks, then the end of it
            os.kill(p.pid, signal.SIGABRT)
            p.wait()
            os.killpg(p.pid, signal.SIGKILL)
            stacks = err.read_text()
            pytest.fail(f"no exit within {SAFETY_S:.0f} s of the signal; stderr and stacks: {stacks[-6000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if feed is not None:
            feed.close()
        # every worker gone (a worker that outlived the stop would write until then), then no more links
        wait_for("the workers to end", lambda: not any(alive(w) for w in workers))
        if planter is not None:
            planter.close()
    r = subprocess.CompletedProcess(p.args, p.returncode, out.read_text(), err.read_text())
    r.planted = planter.planted if planter is not None else []
    return r


def _run_and_signal(tmp_path: Path, sig: int, group: bool, source: str,
                    victim: Path | None = None) -> subprocess.CompletedProcess:
    for i, records in enumerate(FILE_RECORDS):
        r = _attempt(tmp_path / f"try{i}", sig, group, source, records, victim)
        if r is not None:
            return r
    pytest.fail(f"prepare finished {FILE_RECORDS[-1]:,} records before it could be stopped: give it a larger input")


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")
@pytest.mark.parametrize("source", ["stdin", "file"])
def test_ctrl_c_with_workers_leaves_nothing_and_prints_no_traceback(tmp_path, source):
    r = _run_and_signal(tmp_path, signal.SIGINT, group=True, source=source)
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: interrupted; nothing was written to the output"
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr
    assert r.stdout == ""
    assert sorted(p.name for p in Path(r.args[r.args.index("-o") + 1]).parent.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")
@pytest.mark.parametrize("source", ["stdin", "file"])
def test_sigterm_removes_the_temporary_folder(tmp_path, source):
    r = _run_and_signal(tmp_path, signal.SIGTERM, group=False, source=source)
    assert r.returncode == 143, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: terminated (SIGTERM); nothing was written to the output"
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in Path(r.args[r.args.index("-o") + 1]).parent.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")
def test_ctrl_c_to_a_one_process_prepare_pref_leaves_nothing(tmp_path):
    """prepare-pref at one process (its chunks tokenized on a second thread, the collector
    held back: util/collector.py) stops on Ctrl-C as prepare-chat does: once it has written
    tokens of its pairs from an input that never ends, the signal, exit 130, one line."""
    pytest.importorskip("tokenizers")
    from sftdata.template import PRESETS
    from tests.helpers.templates import TOKENS, train_tokenizer

    specials, bos, eos, extra = TOKENS["chatml"]
    folder = train_tokenizer(tmp_path / "tok", specials, bos, eos, extra,
                             {"chat_template": PRESETS["chatml"], "pad_token": "<|endoftext|>"})
    pair = {"prompt": [{"role": "user", "content": "What is the weather in Paris in spring? " * 3}],
            "chosen": [{"role": "assistant", "content": "Mild, with showers and long bright spells. " * 3}],
            "rejected": [{"role": "assistant", "content": "Always snow, all day long, every day. " * 3}]}
    work = tmp_path / "work"
    work.mkdir()
    err = tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    with open(err, "wb") as e:
        p = subprocess.Popen([sys.executable, "-m", "sftdata", "prepare-pref", "-", "-o", str(work / "ds"),
                              "--tokenizer", str(folder)], cwd=work, env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=e, start_new_session=True)
    feed = EndlessInput(p, (json.dumps(pair) + "\n").encode() * 2000)
    try:
        wait_for("prepare-pref to write tokens of its pairs", lambda: p.poll() is not None or any(
            t.stat().st_size for t in work.glob(".ds.tmp-*/*/shard_*/tokens.bin")))
        assert p.poll() is None, err.read_text()[-2000:]
        os.killpg(p.pid, signal.SIGINT)
        try:
            p.wait(SAFETY_S)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGABRT)
            p.wait()
            pytest.fail(f"no exit within {SAFETY_S:.0f} s of Ctrl-C; stderr and stacks: {err.read_text()[-6000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        feed.close()
    stderr = err.read_text()
    assert p.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted; nothing was written to the output"
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert p.stdout.read() == b"" and sorted(x.name for x in work.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX resource limits")
def test_a_file_size_limit_stops_a_run_with_workers_and_leaves_nothing(tmp_path):
    """Issue 45.4 (`ulimit -f`): a worker's shard file passes the limit; the run stops with
    one line naming the file, its workers ended before its staging folder goes, and
    nothing is left beside the target for `clean` to find (8 of 8 runs left a `_parts`
    folder with no owner record before)."""
    import resource

    work = tmp_path / "work"
    work.mkdir()
    big = tmp_path / "in.jsonl"
    big.write_bytes(LINE * 12_000)  # 4 MB: ranges for both workers

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "sftdata", "prepare-chat", str(big), "-o", str(work / "ds"), "-j", "2"],
                       cwd=work, env=env, capture_output=True, text=True, preexec_fn=limit, timeout=SAFETY_S)
    assert r.returncode == 1, r.stderr
    assert re.fullmatch(r"error: \S+/\.ds\.tmp-[^/]+/_parts/part_\d+\.tmp-[^/]+/s/shard_00000/\w+\.bin: File too "
                        r"large; the file is larger than this process may write \(a file-size limit, ulimit -f, or "
                        r"the file system's largest file\): raise the limit, or choose another path\n", r.stderr)
    assert sorted(x.name for x in work.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")
def test_ctrl_c_with_a_link_planted_at_the_staging_name_writes_nothing_through_it(tmp_path):
    """Issue 45.1, as written: a process-group Ctrl-C of prepare-chat -j 2 reading a file
    (its workers in their partitions) while a watcher plants a link at the staging folder's
    name the moment it is removed. Nothing lands in the folder the link points to (before:
    18-27 files in 3 of 10 runs, the workers re-creating the staging path through it), and
    what is left beside the target is the planted link and what `clean` removes."""
    victim = tmp_path / "victim"
    victim.mkdir()
    r = _run_and_signal(tmp_path, signal.SIGINT, group=True, source="file", victim=victim)
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: interrupted; nothing was written to the output"
    assert "Traceback" not in r.stderr
    assert list(victim.iterdir()) == []
    work = Path(r.args[r.args.index("-o") + 1]).parent
    clean(work, remove=True)
    assert sorted(p.name for p in work.iterdir()) == sorted(r.planted)
    assert all(p.is_symlink() for p in work.iterdir())
