"""Worker processes (prepare/pool.py): the same bytes whatever the number of workers, a
worker that dies is an error naming where its records came from, not a hang, and a stopped
run's workers end before its staging area goes (the runner itself: tests/tasks)."""

import os
import signal
import subprocess
import sys
import threading

import pytest

from sftdata.errors import RecordError, SftDataError
from sftdata.prepare import PrepareOptions, chunk, pool, prepare
from sftdata.store.format import PARTS_DIR, STOP_FILE
from tests.helpers.data import chat, write_jsonl
from tests.helpers.paths import ROOT
from tests.helpers.processes import SAFETY_S, alive, hold, pool_threads_closed, wait_for


def records(n):
    return [chat(f"question {i}", f"answer number {i} " + "x" * (i % 7)) for i in range(n)]


def tree_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_input_same_bytes_and_workers_do_not_matter(tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 3)  # many chunks, so workers really share the work
    src = write_jsonl(tmp_path / "in.jsonl", records(40) + ["bad line"])
    opts = dict(val_split=0.2, seed=3, shard_tokens=200)
    prepare([src], tmp_path / "a", PrepareOptions(workers=1, **opts))
    prepare([src], tmp_path / "b", PrepareOptions(workers=2, **opts))
    prepare([src], tmp_path / "c", PrepareOptions(workers=1, **opts))
    a, b, c = tree_bytes(tmp_path / "a"), tree_bytes(tmp_path / "b"), tree_bytes(tmp_path / "c")
    assert a == b == c
    assert len([k for k in a if k.endswith("tokens.bin")]) > 2


def test_a_worker_killed_midway_is_an_error_not_a_hang(tmp_path, monkeypatch):
    """A worker process killed by the system (out of memory) used to leave prepare waiting
    forever for its chunk; now prepare stops with a message and leaves nothing behind."""
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 3)
    real = chunk.process_chunk  # workers=2 on plain JSONL: each reads its own range

    def dying(items, *args):
        if any(r.record == 30 for r in items):
            os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does
        return real(items, *args)

    monkeypatch.setattr(chunk, "process_chunk", dying)
    src = write_jsonl(tmp_path / "in.jsonl", records(60))

    def too_slow(*_):
        raise TimeoutError("prepare hangs on a dead worker")

    old = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(int(SAFETY_S))  # a safety net: a hang fails the test
    try:
        with pytest.raises(SftDataError, match=r"a worker process stopped unexpectedly .* rerun with fewer "
                                               r"--workers") as e:
            prepare([src], tmp_path / "out" / "ds", PrepareOptions(workers=2))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert "in.jsonl:line" in str(e.value)
    assert list((tmp_path / "out").iterdir()) == []


# ---------------------------------------------------------------- a stop: no worker outlives it

def test_a_stopped_partitioned_run_waits_for_its_workers_before_its_staging_goes(tmp_path, monkeypatch):
    """Issue 45.1 / 45.4: Ctrl-C while a worker is in the middle of its partition. The run
    tells its tasks to stop (the STOP file in its staging area), waits for the held worker
    to go on and return (its staging area still there when it does), and for every worker
    to end, and only then removes its staging area: nothing can re-create it afterwards
    (a link planted at its name would be written through), nothing is left beside it."""
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 3)
    pid_file, seen = tmp_path / "pid", tmp_path / "seen"
    real = chunk.process_chunk
    stop = tmp_path / "out" / ".ds.tmp-*" / PARTS_DIR / STOP_FILE

    def held(items, *args):
        if any(r.record == 4 for r in items):
            hold(pid_file, stop)
            seen.write_text(",".join(p.name for p in stop.parent.parent.parent.glob(".ds.tmp-*")))
        return real(items, *args)

    monkeypatch.setattr(chunk, "process_chunk", held)
    src = write_jsonl(tmp_path / "in.jsonl", records(60))

    def interrupt():  # Ctrl-C to the main thread once a worker holds its partition
        wait_for("a worker to hold its partition", pid_file.exists)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        prepare([src], tmp_path / "out" / "ds", PrepareOptions(workers=2))
    assert seen.read_text().startswith(".ds.tmp-")  # released by the stop, its staging area still there
    assert not alive(int(pid_file.read_text()))  # ended before prepare returned, not later
    assert list((tmp_path / "out").iterdir()) == [] and pool_threads_closed()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the race is of forked workers' pools")
def test_the_exit_is_clean_on_every_run(tmp_path):
    """Issue 44.4: ``Exception ignored in: <module 'threading'> ... OSError: [Errno 9] Bad
    file descriptor`` at exit, from CPython 3.11's ``_python_exit`` waking a pool's manager
    thread through the pipe that thread was closing (a pool shut down without waiting).
    Seen in 2 of 12 runs of this very command before; every run must now end silently."""
    src = write_jsonl(tmp_path / "in.jsonl", records(3))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for i in range(10):
        r = subprocess.run([sys.executable, "-m", "sftdata", "prepare-chat", str(src), "--output-dir",
                            str(tmp_path / "ds"), "--val-split", "0.1", "--overwrite", "-q", "--force", "-j", "2"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=SAFETY_S)
        assert (i, r.returncode, r.stdout, r.stderr) == (i, 0, "", "")


def test_a_strict_stop_of_a_partitioned_run_ends_its_workers_and_leaves_nothing(tmp_path, monkeypatch):
    """Issue 45.4: --strict stops at the first bad record while the workers still read
    their partitions; every worker process has ended when prepare returns, and nothing is
    left beside the target (the workers wrote only inside the staging area, now gone)."""
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 3)
    monkeypatch.setattr(pool, "MIN_PART_BYTES", 2000)
    monkeypatch.setattr(pool, "MAX_PART_BYTES", 2000)
    pids = tmp_path / "pids"
    pids.mkdir()
    real = chunk.process_chunk

    def noted(items, *args):
        (pids / str(os.getpid())).touch()
        return real(items, *args)

    monkeypatch.setattr(chunk, "process_chunk", noted)
    src = write_jsonl(tmp_path / "in.jsonl", records(5) + ["bad line"] + records(300))
    with pytest.raises(RecordError, match=r"in.jsonl:line 6: .*--strict stops at the first bad record"):
        prepare([src], tmp_path / "out" / "ds", PrepareOptions(workers=2, strict=True))
    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) >= 1 and [w for w in workers if alive(w)] == []
    assert list((tmp_path / "out").iterdir()) == [] and pool_threads_closed()
