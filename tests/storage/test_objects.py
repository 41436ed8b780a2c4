"""Datasets in object storage, over a real S3 protocol: moto's S3 server in a thread,
reached through s3fs as any bucket is. Written through a local staging folder and
uploaded with the metadata last; read through the local cache."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import DatasetError, OutputExistsError
from sftdata.interop.export import ExportOptions, export
from sftdata.loader import LoaderConfig, make_loader
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.storage import object_commit as oc
from sftdata.storage.object_cache import fetch_dataset
from sftdata.store import METADATA_FILE, open_dataset
from tests.helpers.data import chat, write_jsonl
from tests.helpers.moto_s3 import moto_s3, objects
from tests.helpers.paths import ROOT
from tests.helpers.processes import SAFETY_S, read_line

runner = CliRunner()
BUCKET = "sftdata-test"


@pytest.fixture(scope="module")
def s3():
    """An S3 endpoint (moto's server on a free port) and an s3fs file system on it."""
    with moto_s3(BUCKET) as fs:
        yield fs


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    return write_jsonl(d / "in.jsonl", [chat(f"question {i}", f"answer {i} " * (i % 7 + 1)) for i in range(60)]
                       + ["{not json"])


OPTS = dict(val_split=0.2, shard_tokens=400)  # several shards per split


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def both(s3, source, tmp_path_factory):
    """The same input prepared locally and to s3://."""
    local = tmp_path_factory.mktemp("local") / "ds"
    prepare([source], local, PrepareOptions(**OPTS))
    url = f"s3://{BUCKET}/sft/both"
    summary = prepare([source], url, PrepareOptions(**OPTS))
    assert summary.output_dir == url
    return local, url


def test_prepare_to_s3_writes_the_same_bytes_as_local(s3, both):
    local, url = both
    got = objects(s3, url)
    assert got == files(local)
    assert len([k for k in got if k.endswith("tokens.bin")]) > 2  # several shards: a real layout
    assert not s3.exists(f"{BUCKET}/sft/.both.sftdata-lock")  # the lock object is gone after the commit


def _strip(obj, keys=("path", "dataset", "dataset_dir", "root", "source", "rejects_file", "seconds")):
    if isinstance(obj, dict):
        return {k: _strip(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [_strip(v, keys) for v in obj]
    return obj


@pytest.mark.parametrize("command", [["verify"], ["inspect"], ["replay-order", "--batch-size", "3", "--step", "2"]])
def test_readers_on_s3_equal_local(both, command):
    local, url = both
    a, b = cli(command[0], local, *command[1:], "--json"), cli(command[0], url, *command[1:], "--json")
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    want, got = json.loads(a.stdout), json.loads(b.stdout)
    assert _strip(got) == _strip(want) and got != {}
    assert str(local) not in b.stdout


def test_loader_and_open_dataset_on_s3_equal_local(both):
    local, url = both
    cfg = LoaderConfig(batch_size=4, block_size=16, epoch_seed=3)
    la, lb = make_loader(cfg, local, backend="numpy"), make_loader(cfg, url, backend="numpy")
    for _ in range(5):
        x, y = la.get_batch("train"), lb.get_batch("train")
        assert np.array_equal(x.x, y.x) and np.array_equal(x.y, y.y) and np.array_equal(x.mask, y.mask)
    a, b = open_dataset(local), open_dataset(url)
    assert b.split("train").num_episodes == a.split("train").num_episodes == 48
    assert b.metadata == a.metadata


def test_a_second_open_reads_the_metadata_alone_and_a_changed_dataset_is_fetched_again(s3, source, tmp_path):
    url = f"s3://{BUCKET}/sft/cache"
    prepare([source], url, PrepareOptions(**OPTS))
    first = fetch_dataset(url)
    assert not first.hit and first.files == len(objects(s3, url)) - 1 and first.requests >= first.files - 1
    again = fetch_dataset(url)
    assert again.hit and again.path == first.path and again.files == 0
    prepare([source], url, PrepareOptions(val_split=0.5, overwrite=True))  # the same URL, another dataset
    new = fetch_dataset(url)
    assert not new.hit and new.path != first.path and not first.path.exists()  # the older copy is removed
    assert open_dataset(url).split("val").num_episodes == 30
    assert files(new.path) == objects(s3, url)


def test_ranges_a_large_file(s3, source, monkeypatch):
    url = f"s3://{BUCKET}/sft/ranged"
    prepare([source], url, PrepareOptions(val_split=0.0))
    monkeypatch.setattr("sftdata.storage.object_cache.RANGE_BYTES", 100)
    got = fetch_dataset(url)
    sizes = {k: len(v) for k, v in objects(s3, url).items() if k != METADATA_FILE}
    assert got.requests == sum(-(-n // 100) for n in sizes.values()) and got.bytes == sum(sizes.values())
    assert files(got.path) == objects(s3, url)


def test_pack_from_s3_to_s3_equals_local(s3, both, tmp_path):
    local, url = both
    opts = PackOptions(block_size=64)
    pack(local, tmp_path / "packed", opts)
    r = pack(url, f"s3://{BUCKET}/sft/packed", opts)
    assert r.output_dir == f"s3://{BUCKET}/sft/packed"
    got, want = objects(s3, r.output_dir), files(tmp_path / "packed")
    assert got.keys() == want.keys()
    assert {k: v for k, v in got.items() if k != METADATA_FILE} == {k: v for k, v in want.items() if k != METADATA_FILE}
    a, b = orjson.loads(want[METADATA_FILE]), orjson.loads(got[METADATA_FILE])
    assert _strip(a, ("path", "metadata_checksum", "key")) == _strip(b, ("path", "metadata_checksum", "key"))
    assert b["source"]["path"] == url and a["source"]["path"] == str(local.resolve())
    v = cli("verify", r.output_dir, "--json")
    assert v.exit_code == 0, v.output
    assert "not there" not in v.stdout and "cannot be read" not in v.stdout  # compared with the source episodes


def test_cli_pack_of_an_s3_dataset_records_its_url_as_the_source(s3, both, tmp_path):
    """The command fetches the URL's copy to check it, but the packed dataset names the URL
    (not this machine's cache folder) as its source, as pack() called from Python does."""
    _, url = both
    r = cli("pack", url, "-o", str(tmp_path / "packed"), "--block-size", "64", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["source"] == url
    meta = orjson.loads((tmp_path / "packed" / METADATA_FILE).read_bytes())
    assert meta["source"]["path"] == url


def test_cli_prepare_to_s3(s3, source):
    url = f"s3://{BUCKET}/sft/cli"
    r = cli("prepare-chat", source, "-o", url, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["output_dir"] == url and METADATA_FILE in objects(s3, url)
    key = json.loads(r.stdout)["build_key"]
    r = cli("prepare-chat", source, "-o", url)  # the same build: up to date, read from the metadata object
    assert r.exit_code == 0 and r.output == f"{url}: up to date (build key {key[:12]}...); nothing to do (--force " \
                                            f"rebuilds it)\n"
    r = cli("prepare-chat", source, "-o", url, "--seed", "7")
    assert r.exit_code == 1
    assert r.output == (f"error: {url} already exists and is not up to date: the option --seed changed (1337 -> 7). "
                        f"Pass --overwrite to rebuild it, or choose another --output-dir\n")
    r = cli("prepare-chat", source, "-o", url, "--force")  # replaced as --overwrite replaces it
    assert r.exit_code == 0 and r.output.startswith(f"rebuilding {url}: --force rebuilds it whatever its build key "
                                                    f"says\n")


# -- a run that stops before its commit ----------------------------------------------------------
def _fail_commit(*args):
    raise OSError("connection reset while sending dataset_metadata.json")


def test_a_failed_commit_leaves_nothing(s3, source, monkeypatch):
    url = f"s3://{BUCKET}/sft/failed"
    monkeypatch.setattr(oc, "put_commit", _fail_commit)
    with pytest.raises(OSError, match="connection reset"):
        prepare([source], url, PrepareOptions(**OPTS))
    assert objects(s3, url) == {} and not s3.exists(f"{BUCKET}/sft/.failed.sftdata-lock")
    with pytest.raises(DatasetError, match=rf"^dataset {url} does not exist \(no object under it\); check the URL"):
        open_dataset(url)


def test_a_killed_writer_leaves_no_readable_dataset_and_the_next_run_clears_it(s3, source, monkeypatch, caplog):
    url = f"s3://{BUCKET}/sft/killed"
    monkeypatch.setattr(oc, "put_commit", _fail_commit)
    monkeypatch.setattr(oc.ObjectCommit, "abort", lambda self: None)  # killed: no clean-up runs
    with pytest.raises(OSError):
        prepare([source], url, PrepareOptions(**OPTS))
    monkeypatch.undo()
    left = objects(s3, url)
    assert METADATA_FILE not in left and len(left) == 19
    lock = f"{BUCKET}/sft/.killed.sftdata-lock"
    with pytest.raises(DatasetError, match=(
            rf"^{url} is not a committed sftdata dataset: it has no dataset_metadata.json, the object a writer puts "
            rf"last, yet holds 19 object\(s\): rejects.jsonl, serving.json, tokenizer_state.json, "
            rf"train/shard_00000/episodes.idx, train/shard_00000/mask.bin \(and 14 more\). A write still running or "
            rf"one that died leaves this \(s3://{lock} names the run writing it\). Wait for the writer, or remove "
            rf"these objects \(if they are not someone else's\) and write the dataset again$")):
        open_dataset(url)
    r = cli("verify", url)
    assert r.exit_code == 1 and "is not a committed sftdata dataset" in r.output
    # its owner is still this (live) process: the next writer is refused
    with pytest.raises(OutputExistsError, match=rf"^another sftdata \(host .*, pid {os.getpid()}, started .*\) is "
                                                rf"writing {url}; wait for it to finish, pass --wait"):
        prepare([source], url, PrepareOptions(**OPTS))
    # the writer died: the lock names a pid that no longer runs, and the next run removes what it left
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    rec = orjson.loads(s3.cat_file(lock))
    s3.pipe_file(lock, orjson.dumps({**rec, "pid": int(dead.stdout), "start": None}))
    with caplog.at_level(logging.WARNING, logger="sftdata.store"):
        prepare([source], url, PrepareOptions(**OPTS))
    assert objects(s3, url) == objects(s3, f"s3://{BUCKET}/sft/both") and not s3.exists(lock)
    assert (f"removed 19 object(s) of {url} left by a run that died before its commit (pid {int(dead.stdout)}): "
            f"rejects.jsonl, serving.json, tokenizer_state.json, train/shard_00000/episodes.idx, "
            f"train/shard_00000/mask.bin (and 14 more)") in caplog.messages


KILLED_WRITER = """
import sys
from sftdata.prepare import PrepareOptions, prepare
from sftdata.storage import object_commit as oc
def hang(*args):
    print("uploaded", flush=True)
    sys.stdin.read()  # until it is killed: the test holds this pipe open
oc.put_commit = hang
prepare([sys.argv[1]], sys.argv[2], PrepareOptions(val_split=0.2, shard_tokens=400))
"""


def test_a_writer_killed_with_sigkill_before_its_commit(s3, both, source, caplog):
    url = f"s3://{BUCKET}/sft/sigkill"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(source), url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:  # every file is up; the metadata is not
        assert read_line(proc.stdout, "the writer to upload every file but the metadata") == "uploaded\n"
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
    assert sorted(objects(s3, url)) == sorted(k for k in objects(s3, f"s3://{BUCKET}/sft/both") if k != METADATA_FILE)
    with pytest.raises(DatasetError, match=rf"^{url} is not a committed sftdata dataset: it has no "
                                           rf"dataset_metadata.json, the object a writer puts last, yet holds 19 "):
        make_loader(LoaderConfig(batch_size=2, block_size=8), url, backend="numpy")
    with caplog.at_level(logging.WARNING, logger="sftdata.store"):
        prepare([source], url, PrepareOptions(**OPTS))  # its lock names a dead pid: taken over, its objects removed
    assert objects(s3, url) == objects(s3, f"s3://{BUCKET}/sft/both")
    assert [m for m in caplog.messages if m.startswith("removed 19 object(s)")] == [
        f"removed 19 object(s) of {url} left by a run that died before its commit (pid {proc.pid}): rejects.jsonl, "
        f"serving.json, tokenizer_state.json, train/shard_00000/episodes.idx, train/shard_00000/mask.bin "
        f"(and 14 more)"]


def test_another_hosts_lock_is_never_taken(s3, source):
    url = f"s3://{BUCKET}/sft/busy"
    lock = f"{BUCKET}/sft/.busy.sftdata-lock"
    s3.pipe_file(lock, orjson.dumps({"host": "elsewhere", "pid": 1, "start": "1", "created": 0}))
    try:
        with pytest.raises(OutputExistsError, match=(
                rf"^another sftdata \(host elsewhere, pid 1, started .*\) is writing {url}; .* If that run is dead "
                rf"\(it ran on another machine\), remove s3://{lock} and what it lists$")):
            prepare([source], url, PrepareOptions(**OPTS))
        assert objects(s3, url) == {}
    finally:
        s3.rm_file(lock)


def test_wait_waits_for_the_lock_object(s3, source, monkeypatch, caplog):
    url = f"s3://{BUCKET}/sft/waited"
    lock = f"{BUCKET}/sft/.waited.sftdata-lock"
    s3.pipe_file(lock, orjson.dumps({"host": "elsewhere", "pid": 7, "start": "1", "created": 0}))
    monkeypatch.setattr(oc, "WAIT_POLL_S", 0.05)
    removed_by: list[str] = []

    def finish(why: str):  # the other host's run ends: its lock object goes
        if not removed_by:
            removed_by.append(why)
            s3.rm_file(lock)

    class FinishWhenWaiting(logging.Handler):
        def emit(self, record):
            if "waiting for it to finish" in record.getMessage():
                threading.Thread(target=finish, args=("this run waited",)).start()

    handler = FinishWhenWaiting()
    logging.getLogger("sftdata.store").addHandler(handler)
    safety = threading.Timer(SAFETY_S, finish, args=("the safety net",))  # never a hung test: it fails below
    safety.start()
    try:
        with caplog.at_level(logging.WARNING, logger="sftdata.store"):
            prepare([source], url, PrepareOptions(wait=True, **OPTS))
    finally:
        logging.getLogger("sftdata.store").removeHandler(handler)
        safety.cancel()
    assert removed_by == ["this run waited"]
    assert objects(s3, url) == objects(s3, f"s3://{BUCKET}/sft/both")
    assert [m for m in caplog.messages if "waiting" in m] == [
        f"another sftdata (host elsewhere, pid 7, started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(0))}) "
        f"is writing {url}; waiting for it to finish (--wait)"]


def test_export_to_s3_equals_local_and_overwrites_only_an_export(s3, both, tmp_path):
    local, _ = both
    export(local, tmp_path / "exp", ExportOptions(format="jsonl"))
    url = f"s3://{BUCKET}/exports/jsonl"
    report = export(local, url, ExportOptions(format="jsonl"))
    assert report.output_dir == url and objects(s3, url) == files(tmp_path / "exp")
    export(local, url, ExportOptions(format="jsonl", overwrite=True))
    with pytest.raises(OutputExistsError, match=rf"^s3://{BUCKET}/sft/both is not an earlier export of sftdata: "
                                                rf"--overwrite replaces only an export"):
        export(local, f"s3://{BUCKET}/sft/both", ExportOptions(format="jsonl", overwrite=True))


# -- --overwrite only replaces an sftdata dataset ------------------------------------------------
def test_overwrite_of_a_prefix_that_is_not_a_dataset_is_refused_and_nothing_deleted(s3, source):
    url = f"s3://{BUCKET}/user/notes"
    mine = {"README.md": b"my notes", "data/a.csv": b"1,2\n"}
    for k, v in mine.items():
        s3.pipe_file(f"{BUCKET}/user/notes/{k}", v)
    with pytest.raises(OutputExistsError, match=(
            rf"^{url} is not an sftdata dataset \(no dataset_metadata.json\): --overwrite replaces only a dataset, "
            rf"never other objects \(they would be deleted\). It holds: README.md, data/a.csv. Choose another "
            rf"--output-dir, or remove them yourself$")):
        prepare([source], url, PrepareOptions(overwrite=True))
    assert objects(s3, url) == mine and not s3.exists(f"{BUCKET}/user/.notes.sftdata-lock")


def test_overwrite_of_a_dataset_holding_a_users_object_is_refused(s3, source):
    url = f"s3://{BUCKET}/sft/annotated"
    prepare([source], url, PrepareOptions(**OPTS))
    s3.pipe_file(f"{BUCKET}/sft/annotated/NOTES.txt", b"keep me")
    before = objects(s3, url)
    with pytest.raises(OutputExistsError, match=rf"^{url} holds objects sftdata did not write: NOTES.txt. "
                                                rf"--overwrite removes only a dataset's own objects"):
        prepare([source], url, PrepareOptions(overwrite=True))
    assert objects(s3, url) == before


def test_overwrite_replaces_exactly_the_old_datasets_objects(s3, source, tmp_path):
    url = f"s3://{BUCKET}/sft/replaced"
    prepare([source], url, PrepareOptions(**OPTS))
    assert len(objects(s3, url)) == 20
    prepare([source], tmp_path / "one", PrepareOptions(val_split=0.0))
    prepare([source], url, PrepareOptions(val_split=0.0, overwrite=True))  # one shard, no val: fewer objects
    assert objects(s3, url) == files(tmp_path / "one")


def test_a_failed_overwrite_leaves_no_dataset_and_says_so(s3, source, monkeypatch, caplog):
    url = f"s3://{BUCKET}/sft/lost"
    prepare([source], url, PrepareOptions(**OPTS))
    monkeypatch.setattr(oc, "put_commit", _fail_commit)
    with pytest.raises(OSError):
        prepare([source], url, PrepareOptions(val_split=0.0, overwrite=True))
    assert objects(s3, url) == {}
    assert (f"{url}: the run stopped after it had removed the replaced dataset's dataset_metadata.json; that "
            f"dataset's objects were removed too, and nothing is left there") in caplog.text


# -- without the protocol's package ----------------------------------------------------------------
@pytest.mark.parametrize("command, verb", [(["prepare-chat", "{src}", "-o", "s3://b/sft"], "writing"),
                                           (["verify", "s3://b/sft"], "reading"),
                                           (["pack", "s3://b/sft", "-o", "out", "--block-size", "64"], "reading")])
def test_without_s3fs_a_url_is_one_line_naming_the_extra(monkeypatch, source, command, verb):
    pytest.importorskip("fsspec")
    monkeypatch.setitem(sys.modules, "s3fs", None)
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3", raising=False)  # its class, once imported
    r = cli(*[str(source) if a == "{src}" else a for a in command])
    assert r.exit_code == 1
    assert r.output == (f"error: s3://b/sft: {verb} s3:// URLs needs s3fs: pip install 'sftdata[cloud]' (or pip "
                        f"install s3fs)\n")


def test_a_bucket_alone_is_refused(s3, source):
    with pytest.raises(DatasetError, match=rf"^s3://{BUCKET}: give a folder inside the bucket \(s3://{BUCKET}/sft, "
                                           rf"say\): a dataset is written under a prefix"):
        prepare([source], f"s3://{BUCKET}", PrepareOptions())


def test_the_loader_imports_no_fsspec():
    code = "import sys, sftdata.loader; print(sorted(m for m in ('fsspec', 's3fs', 'typer') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


def test_no_credentials_is_one_line_naming_the_url_and_how_to_give_them(tmp_path, monkeypatch):
    """Nothing is sent: the request cannot be signed (the endpoint is a closed local port)."""
    s3fs = pytest.importorskip("s3fs")
    src = write_jsonl(tmp_path / "c.jsonl", [chat("q", "a")])
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        for args in (["prepare-chat", str(src), "-o", "s3://bucket/sft", "-q"], ["verify", "s3://bucket/sft"]):
            r = runner.invoke(app, args)
            assert (r.exit_code, r.output) == (1, "error: s3://bucket/sft: no credentials for the object store "
                                                  "(NoCredentialsError: Unable to locate credentials); give them as "
                                                  "for any s3 client: the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                                                  "variables (or AWS_PROFILE, ~/.aws/credentials, an instance role; "
                                                  "AWS_ENDPOINT_URL for another S3 service)\n"), args[0]
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
