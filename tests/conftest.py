"""What every test may use: the terminal and temp folders pinned, the user's cache kept out,
and the fixtures several folders share (the tokenizer, a prepared dataset, a trained
tokenizer.json, the Ray cluster). Helpers that are functions, not fixtures, live in
tests/helpers/; a folder's own fixtures in its conftest.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from sftdata.chat.tokenizer import load_tokenizer
from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.data import random_conversation


def pytest_configure(config):
    """The user's cache of converted tokenizer tables (``sftdata.util.cache``) goes to a fresh
    temporary folder: tests neither read nor fill the real one.

    The shell's terminal size is dropped before any test module imports the CLI: its consoles
    take their width once, when sftdata.cli is imported (a pipe's PIPE_WIDTH, unless COLUMNS
    is set then), so COLUMNS=50 or 300 in the shell would otherwise fix every command's
    output at that width for the whole session, whatever ``_fixed_terminal`` says later."""
    import os
    import tempfile

    os.environ["SFTDATA_CACHE_DIR"] = tempfile.mkdtemp(prefix="sftdata-test-cache-")
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    _interruptible()


def _interruptible() -> None:
    """A suite started in the background of a non-interactive shell (``bash .ci/run &`` in a
    script) inherits Ctrl-C ignored, and so would every command a test starts: the Ctrl-C
    tests (tests/cli/test_interrupt.py) would see their signal lost. A terminal's Ctrl-C
    reaches a command with Python's own handler, so the suite takes it back."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
    multiprocessing, torch and Ray make go to a short private folder of this session (Ray
    reads TMPDIR itself, not tempfile's: RAY_TMPDIR points it there)."""
    import os
    import shutil
    import tempfile

    tmp_path_factory.getbasetemp()
    if len(tempfile.gettempdir()) <= SOCKET_SAFE_TEMP:
        yield
        return
    short = tempfile.mkdtemp(prefix="sftdata-sock-", dir="/tmp")
    saved, tempfile.tempdir = tempfile.tempdir, short
    saved_ray = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = short
    try:
        yield
    finally:
        tempfile.tempdir = saved
        if saved_ray is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved_ray
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
        # address "local": the session's own cluster, even when another local one runs on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """An episodes dataset prepared from 120 seeded conversations (val 20 %, several shards):
    what the pack, loader, replay, export and CLI tests pack and read. One per module, as a
    module may change what it is given."""
    d = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(0)
    lines = [orjson.dumps(random_conversation(rng, i)) for i in range(120)]
    (d / "chats.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    prepare([d / "chats.jsonl"], d / "ds", PrepareOptions(val_split=0.2, seed=3, workers=1, shard_tokens=3000))
    return d / "ds"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A folder with a byte-level BPE tokenizer.json (vocabulary 800, ChatML's special tokens)
    trained here: what the fast engine's tests and verify --retokenize read. Skipped without
    the hf extra (tokenizers)."""
    from tests.helpers.templates import TOKENS, train_tokenizer  # lazy: it skips without tokenizers

    specials, bos, eos, extra = TOKENS["chatml"]
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "chatml", specials, bos, eos, extra, vocab_size=800)


FLOORS = "SFTDATA_FLOORS"  # set by .ci/run's second run, on the oldest declared versions (.ci/floors.txt)


def pytest_sessionfinish(session, exitstatus):
    """CI installs everything the tests need, so a skipped test there is a missing
    install step, not a pass: with CI=true any skip fails the run, naming the reasons.
    The floors run (SFTDATA_FLOORS=1) installs the base and three extras alone: what it
    lacks (torch, Ray, transformers...) is skipped there by design."""
    import os

    if os.environ.get("CI") != "true" or os.environ.get(FLOORS) == "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        reasons = sorted({str(r.longrepr[2]) if isinstance(r.longrepr, tuple) else str(r.longrepr) for r in skipped})
        reporter.write_line(f"CI must not skip tests: {len(skipped)} skipped; reasons: " + "; ".join(reasons), red=True)
        session.exitstatus = 1
