"""A command started with standard input or output closed (``<&-``, ``>&-``), and a disk
that fills (or a file-size limit) mid-write: one line, naming the path (or the stream),
and an exit code true to whether the output was written, on every command.

Closed streams and the file-size limit need a process of their own (the shell's ``>&-``
and ``ulimit -f`` are a child's state): one child runs every command in turn, as the
shell would start them, and reports each exit code on its standard error."""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import sftdata.store.mixture as mixture
import sftdata.store.split_writer as split_writer
from sftdata.cli import app
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.data import random_conversation
from tests.helpers.paths import ROOT
from tests.helpers.processes import SAFETY_S

runner = CliRunner()

# runs each command of argv[1] (a JSON list of argument lists) as `sftdata ...` would,
# and says on stderr where each begins and how it ended
CHILD = """
import json, sys
from sftdata.cli.app import main
for args in json.loads(sys.argv[1]):
    sys.stderr.write("=== " + " ".join(args[:1]) + "\\n")
    sys.stderr.flush()
    sys.argv = ["sftdata", *args]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    sys.stderr.write(f"=== exit {code}\\n")
    sys.stderr.flush()
"""


def _children(commands: list[list], close: tuple[int, ...] = (), fsize: int | None = None) -> list[tuple[int, str]]:
    """Each command's (exit code, what it printed on stderr) in a child started with the
    descriptors ``close`` closed and a file-size limit of ``fsize`` bytes."""

    def setup():
        for fd in close:
            os.close(fd)
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps([[str(a) for a in c] for c in commands])],
                       stdin=None if 0 in close else subprocess.DEVNULL, stdout=None if 1 in close else subprocess.PIPE,
                       stderr=subprocess.PIPE, preexec_fn=setup, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=SAFETY_S, text=True)
    parts = re.split(r"^=== exit (-?\d+)\n", p.stderr, flags=re.M)
    out = [(int(code), re.sub(r"^=== \S+\n", "", text)) for text, code in zip(parts[::2], parts[1::2])]
    assert len(out) == len(commands), p.stderr
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("stdio")
    rng = np.random.default_rng(3)
    src = d / "chats.jsonl"
    src.write_text("".join(json.dumps(random_conversation(rng, i)) + "\n" for i in range(60)))
    prepare([src], d / "ds", PrepareOptions(workers=1, val_split=0.2))
    pack(d / "ds", d / "packed", PackOptions(block_size=512))
    return d


def test_every_command_with_standard_output_closed_says_so_in_one_line(data, tmp_path):
    """A command that has written its output exits 0 and says the printout was lost; one
    whose output is what it prints exits 1. Never "internal error"."""
    src, ds = data / "chats.jsonl", data / "ds"
    tools = ROOT / "sample_data" / "tools.jsonl"
    config = ROOT / "configs" / "sft" / "tiny.json"
    written = [
        (["prepare-chat", src, "-o", tmp_path / "a", "--json"], tmp_path / "a"),
        (["prepare-tool", tools, "-o", tmp_path / "b", "--json"], tmp_path / "b"),
        (["pack", ds, "-o", tmp_path / "c", "--block-size", "512", "--json"], tmp_path / "c"),
        (["export", ds, "-o", tmp_path / "d", "--json"], tmp_path / "d"),
        (["mix", f"{ds}:1", "-o", tmp_path / "m.json"], tmp_path / "m.json"),
        (["report", ds, "-o", tmp_path / "r.html", "--json"], tmp_path / "r.html"),
        (["clean", tmp_path, "--yes", "--json"], tmp_path),
    ]
    printed = [["verify", ds, "--json"], ["inspect", ds], ["replay-order", ds, "--config", config, "--step", "0"],
               ["clean", tmp_path, "--json"]]
    got = _children([c for c, _ in written] + printed, close=(1,))
    for (args, out), (code, err) in zip(written, got):
        assert (code, err) == (0, f"warning: standard output is closed, as with >&-: the result was not printed; "
                                  f"{out} was written\n"), args[0]
        assert Path(out).exists()
    for args, (code, err) in zip(printed, got[len(written):]):
        assert (code, err) == (1, "error: standard output is closed, as with >&-: nothing could be printed; run the "
                                  "command with it open (or redirected: > FILE)\n"), args[0]


def test_standard_input_closed_is_one_line_when_it_is_read_and_nothing_when_it_is_not(data, tmp_path):
    got = _children([["prepare-chat", "-", "-o", tmp_path / "a", "-q"],
                     ["prepare-chat", data / "chats.jsonl", "-o", tmp_path / "b", "-q"]], close=(0,))
    assert got == [(1, "error: input file <stdin> cannot be read (standard input is closed, as with <&-)\n"), (0, "")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # nothing of the failed run is left


def test_a_file_size_limit_on_pack_export_and_prepare_names_the_file(data, tmp_path):
    """RLIMIT_FSIZE (``ulimit -f``): the write that passes it fails with EFBIG; the error
    names the file, nothing is committed and nothing is left."""
    ds = data / "ds"
    big = tmp_path / "big.jsonl"
    big.write_bytes((data / "chats.jsonl").read_bytes() * 3)
    runs = [["pack", ds, "-o", tmp_path / "p", "--block-size", "64", "-q"],
            ["export", ds, "-o", tmp_path / "e", "-q"],
            ["export", ds, "-o", tmp_path / "j", "--format", "jsonl", "-q"],
            ["prepare-chat", big, "-o", tmp_path / "q", "-q", "-j", "1"]]
    got = _children(runs, fsize=4096)
    for args, (code, err) in zip(runs, got):
        out = args[args.index("-o") + 1]
        staged = re.escape(f"{out.parent}/.{out.name}.tmp-") + r"\d+-[0-9a-f]{8}/\S+"
        assert code == 1, (args[0], err)
        assert re.fullmatch(rf"error: {staged}: File too large( \(while [a-z]+ (to )?{re.escape(str(out))}\))?; the "
                            rf"file is larger than this process may write \(a file-size limit, ulimit -f, or the file "
                            rf"system's largest file\): raise the limit, or choose another path\n", err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]  # no output, no staging, no lock


class _FullDisk:
    """A file whose writes fail as on a full disk (ENOSPC, which names no file)."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self):
        self._f.close()


def test_a_full_disk_names_the_file_and_leaves_nothing(data, tmp_path, monkeypatch):
    real_init = split_writer._HashedFile.__init__

    def full(self, path):
        real_init(self, path)
        self._f = _FullDisk(self._f)

    monkeypatch.setattr(split_writer._HashedFile, "__init__", full)
    hint = "No space left on device; the disk is full: free some space, or choose another path\n"
    for args in (["prepare-chat", data / "chats.jsonl", "-o", tmp_path / "a", "-q", "-j", "1"],
                 ["pack", data / "ds", "-o", tmp_path / "b", "--block-size", "64", "-q"]):
        r = runner.invoke(app, [str(a) for a in args])
        out = args[args.index("-o") + 1]
        staged = re.escape(f"{out.parent}/.{out.name}.tmp-") + r"\d+-[0-9a-f]{8}/\S+"
        assert r.exit_code == 1
        assert re.fullmatch(rf"error: {staged}: No space left on device( \(while preparing {re.escape(str(out))}\))?; "
                            + re.escape(hint.split("; ", 1)[1]), r.output), r.output
    monkeypatch.setattr(mixture, "create_file", lambda path, data: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    r = runner.invoke(app, ["mix", f"{data / 'ds'}:1", "-o", str(tmp_path / "m.json")])
    assert r.exit_code == 1
    assert re.fullmatch(re.escape(f"error: {tmp_path}/.m.json.tmp-") + r"\d+-[0-9a-f]{8}" + re.escape(
        f": No space left on device (while writing {tmp_path / 'm.json'}); " + hint.split("; ", 1)[1]), r.output), \
        r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []
