"""Workers die with their parent: SIGKILL of a parent leaves no orphan behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from sftdata.util.lifetime import _watch
from tests.helpers.paths import ROOT


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose (reaped by init soon)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_pool_workers_die_within_a_second_of_a_sigkilled_parent():
    code = textwrap.dedent("""
        import os, time
        from concurrent.futures import ProcessPoolExecutor
        from sftdata.util.lifetime import die_with_parent
        def pid(_): time.sleep(0.2); return os.getpid()
        pool = ProcessPoolExecutor(2, initializer=die_with_parent, initargs=(os.getpid(),))
        print(" ".join(map(str, sorted(set(pool.map(pid, range(8)))))), flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    workers = [int(w) for w in p.stdout.readline().split()]
    assert len(workers) == 2 and all(_alive(w) for w in workers)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    deadline = time.monotonic() + 1.0
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [w for w in workers if _alive(w)]


def test_a_parent_that_died_before_the_call_ends_the_worker_at_once():
    code = "import os; from sftdata.util.lifetime import die_with_parent; die_with_parent(os.getppid() + 1); print('survived')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (r.returncode, r.stdout) == (1, "")


def test_the_linux_mechanism_is_the_kernels():
    if sys.platform.startswith("linux"):
        code = "import os; from sftdata.util.lifetime import die_with_parent; print(die_with_parent(os.getppid()))"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.stdout == "pdeathsig\n"


def test_the_watch_thread_exits_when_the_parent_changes(monkeypatch):
    exits = []
    monkeypatch.setattr(os, "getppid", lambda: 1)
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    _watch(parent_pid=4242, poll_s=0.01)
    assert exits == [1]


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def test_sigkill_of_prepare_leaves_no_worker_keeps_the_old_dataset_and_the_next_run_sweeps(tmp_path):
    import json
    src = tmp_path / "big.jsonl"
    words = "the quick brown fox jumps over a lazy dog while sixty zebras quietly graze".split()
    with open(src, "w") as f:
        for i in range(60_000):
            text = " ".join(words[(i + k) % len(words)] for k in range(60))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{i} {text}"},
                                             {"role": "assistant", "content": text}]}) + "\n")
    out = tmp_path / "ds"
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"messages": [{"role": "user", "content": "q"},
                                              {"role": "assistant", "content": "a"}]}) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "sftdata", "prepare-chat"]
    subprocess.run([*cli, str(small), "-o", str(out), "-q"], check=True, env=env, timeout=120)
    old = (out / "dataset_metadata.json").read_bytes()
    p = subprocess.Popen([*cli, str(src), "-o", str(out), "--overwrite", "--workers", "2", "-q"], env=env)
    try:
        deadline = time.monotonic() + 60
        while len(_children(p.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _children(p.pid)
        assert len(workers) >= 2
        time.sleep(0.5)  # let them work
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        deadline = time.monotonic() + 1.5
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not [w for w in workers if _alive(w)]
    finally:
        p.kill()
    assert (out / "dataset_metadata.json").read_bytes() == old  # the old dataset is intact
    (staging,) = tmp_path.glob(".ds.tmp-*")  # the killed run's staging is left ...
    r = subprocess.run([*cli, str(small), "-o", str(out), "--overwrite", "--json"], env=env, timeout=120,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not staging.exists()  # ... and swept by the next run to that target, which says so
    assert r.stderr == (f"warning: removed 1 stale staging folder(s) of {out} left by runs that died: "
                        f"{staging.name}\n")
    assert not list(tmp_path.glob(".ds.*"))
