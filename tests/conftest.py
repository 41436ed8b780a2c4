"""Shared fixtures: the tokenizer (built once) and helpers to write small inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sftdata.chat.tokenizer import load_tokenizer


def pytest_configure(config):
    """The user's cache of converted tokenizer tables (``sftdata.util.cache``) goes to a fresh
    temporary folder: tests neither read nor fill the real one."""
    import os
    import tempfile

    os.environ["SFTDATA_CACHE_DIR"] = tempfile.mkdtemp(prefix="sftdata-test-cache-")


# CLI output under test is never wrapped, whatever the terminal (COLUMNS=50 in the shell) or
# the temp path's length: tests that check a layout at a width pass their own COLUMNS
TEST_COLUMNS = "1000"


@pytest.fixture(autouse=True)
def _fixed_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", TEST_COLUMNS)
    monkeypatch.delenv("LINES", raising=False)


# the longest temp folder a Unix socket can live under (sun_path holds 107 bytes, and
# multiprocessing, torch's DataLoader workers and Ray put sockets a few names below it)
SOCKET_SAFE_TEMP = 60


@pytest.fixture(scope="session", autouse=True)
def _short_socket_folder(tmp_path_factory):
    """A temp folder too long for a Unix socket (TMPDIR of 150 characters) still holds every
    test's files (pytest's base temp is fixed first, below it), while the sockets that
    multiprocessing, torch and Ray make go to a short private folder of this session."""
    import shutil
    import tempfile

    tmp_path_factory.getbasetemp()
    if len(tempfile.gettempdir()) <= SOCKET_SAFE_TEMP:
        yield
        return
    short = tempfile.mkdtemp(prefix="sftdata-sock-", dir="/tmp")
    saved, tempfile.tempdir = tempfile.tempdir, short
    try:
        yield
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture(scope="session")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="session")
def ray_cluster():
    """ONE local Ray cluster of 2 CPUs for the whole test session (starting one costs
    seconds): the Ray engine's tests share it."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def write_jsonl(path: Path, records) -> Path:
    """Write records (dicts, or raw strings written as they are) one per line."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def chat(*pairs, system=None) -> dict:
    """An OpenAI-format record from (user, assistant, user, assistant, ...) texts."""
    msgs = [{"role": "system", "content": system}] if system else []
    for i, text in enumerate(pairs):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"messages": msgs}


def pytest_sessionfinish(session, exitstatus):
    """CI installs everything the tests need, so a skipped test there is a missing
    install step, not a pass: with CI=true any skip fails the run, naming the reasons."""
    import os

    if os.environ.get("CI") != "true":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        reasons = sorted({str(r.longrepr[2]) if isinstance(r.longrepr, tuple) else str(r.longrepr) for r in skipped})
        reporter.write_line(f"CI must not skip tests: {len(skipped)} skipped; reasons: " + "; ".join(reasons), red=True)
        session.exitstatus = 1
