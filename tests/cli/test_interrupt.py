"""Ctrl-C and SIGTERM in the middle of a long prepare: a one-line message, the exit code
of the signal, no traceback (from the main process or its workers), and nothing left at
the target or beside it. Runs the real command in a child process, as a shell does."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT


def _big_input(path: Path, n: int = 150_000) -> Path:
    rec = {"messages": [{"role": "user", "content": "Tell me about the weather in Paris in spring. " * 3},
                        {"role": "assistant", "content": "Mild, with showers and long bright spells. " * 3}]}
    line = (json.dumps(rec) + "\n").encode()
    path.write_bytes(line * n)
    return path


def _run_and_signal(tmp_path: Path, sig: int, group: bool) -> subprocess.CompletedProcess:
    src = _big_input(tmp_path / "big.jsonl")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "sftdata", "prepare-chat", str(src), "-o", str(tmp_path / "ds"),
                          "-j", "2"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob(".ds.tmp-*")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # workers are busy now
    if group:  # Ctrl-C in a terminal signals the whole foreground process group
        os.killpg(p.pid, sig)
    else:  # `kill PID`
        p.send_signal(sig)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # it hung on the signal: end it, then fail
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"no exit within 60 s of the signal; stderr: {err.decode()[-2000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out.decode(), err.decode())


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")
def test_ctrl_c_with_workers_leaves_nothing_and_prints_no_traceback(tmp_path):
    r = _run_and_signal(tmp_path, signal.SIGINT, group=True)
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: interrupted; nothing was written to the output"
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr
    assert r.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")
def test_sigterm_removes_the_temporary_folder(tmp_path):
    r = _run_and_signal(tmp_path, signal.SIGTERM, group=False)
    assert r.returncode == 143, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: terminated (SIGTERM); nothing was written to the output"
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]
