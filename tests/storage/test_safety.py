"""A user's files are sacred: what --overwrite may remove (the manifest), a target that
appears or changes mid-run, one writer per target, and stale staging folders."""

from __future__ import annotations

import fcntl
import logging
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import OutputExistsError
from sftdata.storage import lock
from sftdata.storage.leftovers import find_leftovers, sweep
from sftdata.storage.lock import OWNER_FILE, WriterLock, owner_record
from sftdata.storage.manifest import check_replaceable, manifest_of, survey
from sftdata.store.writer import DatasetWriter
from tests.helpers.data import chat, write_jsonl
from tests.helpers.paths import ROOT
from tests.helpers.processes import SAFETY_S, read_line

runner = CliRunner()


def _prepare(src: Path, out: Path, *extra) -> object:
    return runner.invoke(app, ["prepare-chat", str(src), "-o", str(out), "-j", "1", "-q", *map(str, extra)])


@pytest.fixture
def src(tmp_path):
    (tmp_path / "in").mkdir()
    return write_jsonl(tmp_path / "in" / "chats.jsonl", [chat(f"q{i}", f"a{i}") for i in range(6)])


@pytest.fixture
def ds(tmp_path, src):
    out = tmp_path / "ds"
    r = _prepare(src, out)
    assert r.exit_code == 0, r.output
    return out


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- the manifest (pure)

def test_manifest_lists_the_metadata_the_top_files_and_every_shard_file():
    meta = {"format": "sftdata", "files": {"tokenizer_state.json": {}, "rejects.jsonl": {}},
            "splits": {"train": {"shards": [{"name": "shard_00000", "files": {"tokens.bin": {}, "mask.bin": {}}}]},
                       "val": {"shards": []}}}
    assert manifest_of(meta) == (
        ["dataset_metadata.json", "rejects.jsonl", "tokenizer_state.json", "train/shard_00000/mask.bin",
         "train/shard_00000/tokens.bin"], ["train", "train/shard_00000", "val"])


@pytest.mark.parametrize("meta", [
    {"format": "sftdata"},                                           # lists no files: a stray metadata file
    {"format": "other", "files": {}, "splits": {}},
    {"format": "sftdata", "files": {"../thesis.txt": {}}, "splits": {}},  # a name leaving the folder
    {"format": "sftdata", "files": {}, "splits": {"train": {"shards": [{"name": "..", "files": {}}]}}},
    {"format": "sftdata", "files": {}, "splits": {"home": {"shards": []}}},
    [],
])
def test_a_metadata_that_does_not_list_a_datasets_own_files_owns_nothing(meta):
    assert manifest_of(meta) is None


def test_survey_names_what_is_not_the_datasets(ds):
    (ds / "NOTES.txt").write_text("mine")
    (ds / "mywork").mkdir()
    (ds / "mywork" / "a.py").write_text("x = 1")
    (ds / "train" / "shard_00000" / "extra.bin").write_bytes(b"1")
    s = survey(ds)
    assert s.is_dataset
    assert s.foreign == ["NOTES.txt", "mywork/", "train/shard_00000/extra.bin"]
    assert "train/shard_00000/tokens.bin" in s.files


# ---------------------------------------------------------------- --overwrite

def test_overwrite_refuses_a_dataset_holding_user_files_and_changes_nothing(tmp_path, src, ds):
    (ds / "NOTES.txt").write_text("mine")
    (ds / "mywork").mkdir()
    (ds / "mywork" / "a.py").write_text("x = 1")
    before = _snapshot(ds)
    assert _prepare(src, ds, "--overwrite").exit_code == 0  # up to date: nothing to replace, nothing touched
    assert _snapshot(ds) == before
    r = _prepare(src, ds, "--overwrite", "--seed", "7")  # another build: the dataset would be replaced
    assert r.exit_code == 1
    assert r.output == (f"error: {ds} holds files sftdata did not write: NOTES.txt, mywork/. --overwrite removes "
                        f"only a dataset's own files; move those out of the folder (or choose another --output-dir) "
                        f"and run again\n")
    assert _snapshot(ds) == before


def test_a_stray_metadata_file_does_not_make_a_home_folder_a_dataset(tmp_path, src):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dataset_metadata.json").write_text('{"format": "sftdata"}')
    (home / "thesis.txt").write_text("years of work")
    before = _snapshot(home)
    r = _prepare(src, home, "--overwrite")
    assert r.exit_code == 1
    assert r.output.startswith(f"error: {home} is not an sftdata dataset (its dataset_metadata.json is not an "
                               f"sftdata dataset's, or does not list its files): --overwrite replaces only a dataset")
    assert "It holds: dataset_metadata.json, thesis.txt." in r.output
    assert _snapshot(home) == before


def test_a_dataset_missing_a_listed_file_is_not_replaced(tmp_path, src, ds):
    (ds / "train" / "shard_00000" / "mask.bin").unlink()
    with pytest.raises(OutputExistsError, match=r"1 file\(s\) its dataset_metadata.json lists are missing "
                                                r"\(first: train/shard_00000/mask.bin\)"):
        check_replaceable(ds)


def test_overwrite_of_a_clean_dataset_replaces_it_and_leaves_its_neighbours(tmp_path, src, ds):
    (tmp_path / "beside.txt").write_text("mine")
    r = _prepare(src, ds, "--overwrite", "--seed", "7")
    assert r.exit_code == 0, r.output
    assert orjson.loads((ds / "dataset_metadata.json").read_bytes())["options"]["seed"] == 7
    assert (tmp_path / "beside.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beside.txt", "ds", "in"]  # no staging, no lock left


# ---------------------------------------------------------------- the target during a run

def _write_tiny(w: DatasetWriter) -> dict:
    sw = w.split("train", np.dtype("<u4"))
    sw.add_many(np.array([1, 2, 3], np.uint32), np.array([0, 1, 1], np.uint8), np.array([3]), np.array([0]))
    w.write_json("tokenizer_state.json", {})
    return {"splits": {"train": sw.close()}}


def test_a_target_that_appears_mid_run_is_left_alone_and_the_result_kept_beside_it(tmp_path):
    target = tmp_path / "out"
    with DatasetWriter(target) as w:
        meta = _write_tiny(w)
        target.mkdir()
        (target / "theirs.txt").write_text("another process")
        with pytest.raises(OutputExistsError, match=r"out appeared while this run was writing it, so it was left "
                                                    r"as it is. The finished dataset is in .*out\.sftdata-new-"):
            w.commit(meta)
    assert [p.name for p in target.iterdir()] == ["theirs.txt"]
    (kept,) = tmp_path.glob("out.sftdata-new-*")
    assert (kept / "dataset_metadata.json").is_file() and not (kept / OWNER_FILE).exists()


def test_a_dataset_changed_mid_run_is_not_replaced(tmp_path, src, ds):
    with DatasetWriter(ds, overwrite=True) as w:
        _write_tiny(w)
        (ds / "added.txt").write_text("a user's file, added while the run was writing")
        with pytest.raises(OutputExistsError, match="ds changed while this run was writing it"):
            w.commit({"splits": {}})
    assert (ds / "added.txt").is_file() and (ds / "dataset_metadata.json").is_file()


# ---------------------------------------------------------------- one writer per target

def test_a_second_writer_is_refused_at_once_naming_the_first(tmp_path, monkeypatch):
    """At once: the second writer only ever tries the lock without blocking (LOCK_NB), and is
    refused while this very thread still holds the first, which a waiting writer never
    would be."""
    target = tmp_path / "out"
    tries = []
    real_flock = lock.fcntl.flock
    monkeypatch.setattr(lock.fcntl, "flock", lambda fd, op: tries.append(op) or real_flock(fd, op))
    with WriterLock(target):
        tries.clear()
        with pytest.raises(OutputExistsError, match=rf"another sftdata \(pid {os.getpid()}, started "
                                                    rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\) is writing {target}; wait"):
            with DatasetWriter(target):
                pass
    assert tries and all(op & fcntl.LOCK_NB for op in tries)  # never a blocking try
    assert not list(tmp_path.iterdir())  # the lock file goes with the lock


def test_wait_waits_for_the_first_writer(tmp_path):
    """The second writer says it waits, then blocks until the first lets go: it takes the lock
    only after the release, observed by events, whatever the machine's speed."""
    target = tmp_path / "out"
    order = []
    waiting = threading.Event()

    class Said(logging.Handler):
        def emit(self, record):
            if "waiting for it to finish (--wait)" in record.getMessage():
                waiting.set()

    said = Said()
    logging.getLogger("sftdata.store").addHandler(said)
    first = WriterLock(target).__enter__()

    def second():
        with WriterLock(target, wait=True):
            order.append("second")

    t = threading.Thread(target=second, daemon=True)
    try:
        t.start()
        assert waiting.wait(SAFETY_S), "the second writer never said it was waiting"
        assert order == [] and t.is_alive()  # it waits: the first still holds the lock
        order.append("first done")
        first.__exit__(None, None, None)
        t.join(SAFETY_S)
        assert not t.is_alive(), "the second writer never took the released lock"
    finally:
        logging.getLogger("sftdata.store").removeHandler(said)
        first.__exit__(None, None, None)
    assert order == ["first done", "second"]


def test_the_lock_dies_with_its_process(tmp_path):
    target = tmp_path / "out"
    code = (f"import sys; from sftdata.storage.lock import WriterLock\n"
            f"with WriterLock({str(target)!r}):\n    print('held', flush=True); sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:  # the child holds the lock until it is killed (its standard input never ends)
        assert read_line(p.stdout, "the child to take the lock") == "held\n"
        with pytest.raises(OutputExistsError, match=rf"pid {p.pid}"):
            WriterLock(target).__enter__()
        p.kill()
        p.wait()
        with WriterLock(target):  # SIGKILL released it
            pass
    finally:
        p.kill()
        p.wait()
        p.stdin.close()


# ---------------------------------------------------------------- stale staging

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_staging_is_swept_by_the_next_run_and_a_live_one_is_kept(tmp_path, src):
    target = tmp_path / "ds"
    dead = tmp_path / f".ds.tmp-{_dead_pid()}-0badc0de"
    dead.mkdir()
    (dead / OWNER_FILE).write_bytes(orjson.dumps({"host": os.uname().nodename, "pid": _dead_pid(), "start": "1"}))
    (dead / "tokens.bin").write_bytes(b"\0" * 1000)
    live = tmp_path / f".ds.tmp-{os.getpid()}-0000beef"
    live.mkdir()
    (live / OWNER_FILE).write_bytes(orjson.dumps(owner_record()))
    other = tmp_path / f".other.tmp-{_dead_pid()}-11111111"  # another target's: not this run's business
    other.mkdir()
    (other / OWNER_FILE).write_bytes(orjson.dumps({"host": os.uname().nodename, "pid": _dead_pid(), "start": "1"}))
    assert sorted((x.path.name, x.state) for x in find_leftovers(tmp_path) if x.target == target) == sorted(
        [(dead.name, "stale"), (live.name, "live")])
    with DatasetWriter(target) as w:
        assert w.notes == [f"removed 1 stale staging folder(s) of {target} left by runs that died: {dead.name}"]
    assert not dead.exists() and live.is_dir() and other.is_dir()


def test_staging_from_another_host_is_never_taken_as_stale(tmp_path):
    far = tmp_path / ".ds.tmp-1-22222222"
    far.mkdir()
    (far / OWNER_FILE).write_bytes(orjson.dumps({"host": "elsewhere", "pid": 1, "start": "1"}))
    assert sweep(tmp_path / "ds", None, None) == [] and far.is_dir()


# ---------------------------------------------------------------- property: user files survive every command

def test_user_files_inside_and_beside_every_target_survive_every_writing_command(tmp_path, src, ds):
    rng = random.Random(20)
    tool_src = ROOT / "sample_data" / "tools.jsonl"
    commands = [
        lambda out, *f: ["prepare-chat", src, "-o", out, "-j", "1", *f],
        lambda out, *f: ["prepare-tool", tool_src, "-o", out, "-j", "1", *f],
        lambda out, *f: ["pack", ds, "-o", out, "--block-size", "32", *f],
    ]
    for case in range(12):
        root = tmp_path / f"case{case}"
        target = root / "target"
        target.mkdir(parents=True)
        # sometimes a real dataset at the target, sometimes not
        if rng.random() < 0.5:
            assert _prepare(src, target, "--overwrite").exit_code == 0
        for k in range(rng.randint(1, 4)):  # user files inside and beside the target
            where = rng.choice([root, target, target / "train", target / "sub"])
            where.mkdir(parents=True, exist_ok=True)
            (where / f"user{k}.txt").write_bytes(rng.randbytes(rng.randint(0, 64)))
        user = {p: p.read_bytes() for p in root.rglob("user*.txt")}
        for cmd in commands:
            for flags in ([], ["--overwrite"]):
                before = _snapshot(target)
                r = runner.invoke(app, [str(a) for a in cmd(target, *flags)] + ["-q"])
                if r.exit_code == 0:  # up to date (nothing changed), or replaced: only when nothing of the user's was inside
                    assert _snapshot(target) == before or (flags and not list(target.rglob("user*.txt")))
                    assert (target / "dataset_metadata.json").is_file()
                else:
                    assert r.exit_code == 1 and r.output.startswith("error: "), r.output
        assert {p: p.read_bytes() for p in root.rglob("user*.txt")} == user


# ---------------------------------------------------------------- value ranges in the metadata

def test_each_shard_records_its_token_id_and_mask_value_ranges(tmp_path):
    with DatasetWriter(tmp_path / "out") as w:
        sw = w.split("train", np.dtype("<u4"), shard_tokens=4)
        sw.add_many(np.array([7, 2, 9, 5, 100, 3], np.uint32), np.array([0, 1, 1, 0, 0, 0], np.uint8),
                    np.array([3, 3]), np.array([0, 1]))
        shards = sw.close()["shards"]
        empty = w.split("val", np.dtype("<u4")).close()["shards"]
    assert [(s["token_id_range"], s["mask_value_range"]) for s in shards] == [([2, 9], [0, 1]), ([3, 100], [0, 0])]
    assert "token_id_range" not in empty[0]  # an empty shard has no range
