"""Final shards put straight into object storage by the workers that write them
(``storage.object_upload``), the coordinator uploading only the metadata and the commit:
moto's S3 server in a thread, as tests/store/test_objects.py. The coordinator's file
system is wrapped to count every byte it sends."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from sftdata.errors import DatasetError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.storage import object_commit as oc
from sftdata.storage.object_upload import DirectUpload
from sftdata.store import METADATA_FILE
from tests.helpers.data import chat, write_jsonl
from tests.helpers.moto_s3 import count_coordinator, moto_s3, objects
from tests.helpers.zoo import trl_model_folder

BUCKET = "sftdata-direct-test"
OPTS = dict(val_split=0.2, shard_tokens=400)  # several shards per split
TOP = {"dataset_metadata.json", "tokenizer_state.json", "serving.json", "rejects.jsonl"}


@pytest.fixture(scope="module")
def s3():
    with moto_s3(BUCKET) as fs:
        yield fs


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    return write_jsonl(d / "in.jsonl", [chat(f"question {i}", f"answer {i} " * (i % 7 + 1)) for i in range(80)]
                       + ["{not json"])


@pytest.fixture(scope="module")
def local(source, tmp_path_factory) -> dict[str, bytes]:
    """The dataset one process writes into a local folder: every file's bytes."""
    out = tmp_path_factory.mktemp("local") / "ds"
    prepare([source], out, PrepareOptions(**OPTS))
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture
def counted(monkeypatch):
    return count_coordinator(monkeypatch)


def test_workers_put_the_shards_and_the_coordinator_only_the_metadata(s3, source, local, counted):
    url = f"s3://{BUCKET}/sft/direct"
    prepare([source], url, PrepareOptions(**OPTS, workers=2))
    got = objects(s3, url)
    assert got == local  # byte-identical to one process's local dataset
    shards = [k for k in got if k.startswith(("train/", "val/"))]
    assert len([k for k in shards if k.endswith("tokens.bin")]) > 4
    (fs,) = counted
    root, lock = f"{BUCKET}/sft/direct", f"{BUCKET}/sft/.direct.sftdata-lock"
    sent = {k.removeprefix(root + "/"): n for k, n in fs.sent.items() if k != lock}
    assert sent == {k: len(got[k]) for k in TOP}  # each metadata object once, no shard


def test_one_process_still_uploads_everything_itself(s3, source, local, counted):
    """Without workers the coordinator is the writer: it uploads the shards too (the baseline)."""
    url = f"s3://{BUCKET}/sft/single"
    prepare([source], url, PrepareOptions(**OPTS))
    got = objects(s3, url)
    assert got == local
    (fs,) = counted
    root = f"{BUCKET}/sft/single/"
    assert {k.removeprefix(root): n for k, n in fs.sent.items() if k.startswith(root)} == {
        k: len(v) for k, v in got.items()}


def test_the_lock_lists_the_workers_objects_and_a_failed_commit_removes_them(s3, source, monkeypatch):
    url = f"s3://{BUCKET}/sft/failed"
    lock = f"{BUCKET}/sft/.failed.sftdata-lock"
    seen = {}

    def fail(fs, local_path, remote):
        seen["writing"] = orjson.loads(s3.cat_file(lock))["writing"]
        seen["there"] = sorted(objects(s3, url))
        raise OSError("connection reset by peer")
    monkeypatch.setattr(oc, "put_commit", fail)
    with pytest.raises(OSError, match="connection reset by peer"):
        prepare([source], url, PrepareOptions(**OPTS, workers=2))
    shards = [k for k in seen["there"] if k.startswith(("train/", "val/"))]
    assert shards and set(seen["there"]) <= set(seen["writing"]) and METADATA_FILE not in seen["there"]
    assert objects(s3, url) == {} and not s3.exists(lock)


def test_overwrite_with_workers_leaves_exactly_the_new_dataset(s3, source, local, tmp_path):
    url = f"s3://{BUCKET}/sft/over"
    small = write_jsonl(tmp_path / "small.jsonl", [chat(f"q {i}", "a " * 40) for i in range(300)])
    prepare([small], url, PrepareOptions(val_split=0.2, shard_tokens=300, workers=2))
    assert len(objects(s3, url)) > len(local)  # more shards than the new dataset: some must go
    prepare([source], url, PrepareOptions(**OPTS, workers=2, overwrite=True))
    assert objects(s3, url) == local


def test_a_large_file_goes_up_in_parts_and_is_checked(s3, tmp_path):
    data = bytes(range(256)) * (11 * 4096)  # 11 MiB: three parts of 5 MiB (the least S3 takes)
    (tmp_path / "f").write_bytes(data)
    up = DirectUpload(f"s3://{BUCKET}/sft/parts", part_bytes=5 << 20)
    assert up.put(tmp_path / "f", "train/shard_00000/tokens.bin", hashlib.sha256(data).hexdigest()) == len(data)
    info = s3.info(f"{BUCKET}/sft/parts/train/shard_00000/tokens.bin")
    assert info["ETag"].strip('"').endswith("-3")  # a multipart upload's tag: the parts' count
    assert s3.cat_file(f"{BUCKET}/sft/parts/train/shard_00000/tokens.bin") == data


def test_an_object_that_differs_from_its_file_is_an_error_naming_it(s3, tmp_path):
    Path(tmp_path / "f").write_bytes(b"tokens")
    wrong = hashlib.sha256(b"other").hexdigest()
    up = DirectUpload(f"s3://{BUCKET}/sft/bad")
    with pytest.raises(DatasetError, match=(
            rf"^s3://{BUCKET}/sft/bad/val/shard_00002/mask.bin: the uploaded object's sha256 is "
            rf"{hashlib.sha256(b'tokens').hexdigest()}, but the file written was {wrong} \(6 bytes; the store gave "
            rf"back 6\): the upload was corrupted. Nothing was committed; run again$")):
        up.put(tmp_path / "f", "val/shard_00002/mask.bin", wrong)


def test_an_empty_file_is_an_empty_object(s3, tmp_path):
    """An empty split's shard files are empty: each still becomes an object."""
    (tmp_path / "f").write_bytes(b"")
    up = DirectUpload(f"s3://{BUCKET}/sft/empty")
    assert up.put(tmp_path / "f", "val/shard_00000/tokens.bin", hashlib.sha256(b"").hexdigest()) == 0
    assert s3.cat_file(f"{BUCKET}/sft/empty/val/shard_00000/tokens.bin") == b""


def test_a_worker_that_cannot_put_an_object_says_which_and_what_it_needs(s3, tmp_path):
    (tmp_path / "f").write_bytes(b"tokens")
    up = DirectUpload("s3://sftdata-no-such-bucket/sft/ds")
    with pytest.raises(DatasetError, match=(
            r"^s3://sftdata-no-such-bucket/sft/ds/train/shard_00000/tokens.bin: a worker could not put this object "
            r"\(.+\)\. The workers upload the shards they write themselves: each machine running them needs the "
            r"store's credentials and endpoint \(for S3: the AWS_\* variables, ~/.aws or an instance role\)$")):
        up.put(tmp_path / "f", "train/shard_00000/tokens.bin", hashlib.sha256(b"tokens").hexdigest())


THINK = {"messages": [{"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4.", "reasoning_content": "add them"},
                      {"role": "user", "content": "3+3?"},
                      {"role": "assistant", "content": "6.", "reasoning_content": "add again"}]}


def test_the_workers_put_the_last_reply_flags_of_the_shards_that_have_them(s3, tmp_path):
    """Under Qwen3's template a record with earlier reasoning becomes episodes flagged "last
    reply only": the shards holding one get last_reply.bin, put by the workers and known
    to the commit (an overwrite by a dataset without them leaves none behind)."""
    model = trl_model_folder(tmp_path / "model", "qwen3", [THINK])
    if model is None:
        pytest.skip("trl ships no qwen3.jinja")
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q {i}", f"a {i}") for i in range(40)] + [THINK] * 6)
    opts = dict(val_split=0.2, shard_tokens=400, tokenizer=str(model))
    prepare([src], tmp_path / "local", PrepareOptions(**opts))
    local = {p.relative_to(tmp_path / "local").as_posix(): p.read_bytes()
             for p in sorted((tmp_path / "local").rglob("*")) if p.is_file()}
    flags = sorted(k for k in local if k.endswith("/last_reply.bin"))
    assert flags and len(flags) < len([k for k in local if k.endswith("/tokens.bin")])  # only where one is flagged
    url = f"s3://{BUCKET}/sft/flags"
    prepare([src], url, PrepareOptions(**opts, workers=2))
    assert objects(s3, url) == local
    plain = write_jsonl(tmp_path / "plain.jsonl", [chat(f"q {i}", f"a {i}") for i in range(40)])
    prepare([plain], url, PrepareOptions(**opts, workers=2, overwrite=True))
    assert not [k for k in objects(s3, url) if k.endswith("last_reply.bin")]
