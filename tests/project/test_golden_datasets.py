"""The bytes every kind of dataset is made of, pinned: episodes (chat and tool), packed rows,
preference pairs, KTO rows and RL prompts, at one and two workers and on Ray. A change to
how the pipelines are built (a refactoring) must leave these digests as they are; a change
that means to alter a dataset's bytes updates them here, in the same commit, and says why.

The digest covers every file of the dataset; the metadata without ``created_by``,
``build``, ``metadata_checksum`` and a packed dataset's ``source.metadata_sha256`` (the
version and the code's hash, which change with any commit) and ``files`` (each file is
digested itself), and the temp folder's and the checkout's paths replaced by ``TMP`` and ``ROOT`` wherever they appear."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from sftdata.engine.prepare_ray import ray_prepare_executor
from sftdata.pack import PackOptions, pack
from sftdata.pref import PrefOptions, Truncation
from sftdata.prepare import PrepareOptions, pool, prepare, prepare_pref
from tests.helpers.data import write_jsonl
from tests.helpers.paths import ROOT
from tests.helpers.pref_records import kto_rows, pair_rows, prompt_rows

SAMPLE = ROOT / "sample_data"

# kind -> the digest of its dataset (the same at 1 and 2 workers, and on Ray)
GOLDEN = {
    "chat": "3bf793a8e2a658b6b4468b69cc78a843fb11f987960eddc3aa9162d6cb115491",
    "tool": "0991be501a96407fad8c3cbe01c979b4c717a03633718ffe60c8a297bc735a37",
    "packed": "fd28750f4870ae8fc25769041b970ff6164d25337f7ee050452a8b8137200753",
    "pairs": "604493cf3d2289ce3086ef2fd3ade4ce807abc7ad026bfa9dcff571c359e991f",
    "kto": "c72116a447ba63f369556c3601fca2593fc3440ae0956d07714f0ca2ef899bbf",
    "prompts": "61df0f3933750c0c94da1f3d596c021f9827da0fb07379f2f1518157e4d7e433",
}


def digest(root, tmp) -> str:
    """The dataset at ``root``, written under the folder ``tmp`` (its name is ``TMP``)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        data = p.read_bytes()
        if p.name == "dataset_metadata.json":
            meta = orjson.loads(data)
            meta.pop("created_by", None)
            meta.pop("build", None)
            meta.pop("metadata_checksum", None)
            meta.pop("files", None)  # every file is in the digest itself
            meta.get("source", {}).pop("metadata_sha256", None)  # a packed dataset's: its source's build above
            data = orjson.dumps(meta, option=orjson.OPT_SORT_KEYS)
        data = data.replace(str(tmp).encode(), b"TMP").replace(str(ROOT).encode(), b"ROOT")
        h.update(str(p.relative_to(root)).encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _chat(tmp, workers, executor=None, mode="chat"):
    inputs = [SAMPLE / "chat.jsonl", SAMPLE / "reasoning.jsonl"] if mode == "chat" else [SAMPLE / "tools.jsonl"]
    out = tmp / "ds"
    prepare(inputs, out, PrepareOptions(mode=mode, val_split=0.2, seed=3, shard_tokens=1500, dedup="exact",
                                        workers=workers), executor=executor)
    return out


def _pref(tmp, kind, workers, executor=None):
    make = {"pairs": pair_rows, "kto": kto_rows, "prompts": prompt_rows}[kind]
    src = write_jsonl(tmp / "in.jsonl", make(23))
    out = tmp / "ds"
    trunc = Truncation(None, 12, "drop") if kind == "prompts" else Truncation(26, 14, "keep-end")
    prepare_pref([src], out, PrefOptions(val_split=0.3, seed=5, shard_tokens=90, dedup="exact", workers=workers,
                                         truncation=trunc), rl=kind == "prompts", executor=executor)
    return out


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 3)  # many chunks, more than the tasks in flight


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("mode", ["chat", "tool"])
def test_episodes_datasets_keep_their_bytes(tmp_path, small_chunks, mode, workers):
    assert digest(_chat(tmp_path, workers, mode=mode), tmp_path) == GOLDEN[mode]


@pytest.mark.parametrize("workers", [1, 2])
def test_packed_datasets_keep_their_bytes(tmp_path, small_chunks, workers):
    pack(_chat(tmp_path, workers), tmp_path / "packed", PackOptions(block_size=512, seed=7, shard_tokens=4000))
    assert digest(tmp_path / "packed", tmp_path) == GOLDEN["packed"]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kind", ["pairs", "kto", "prompts"])
def test_row_datasets_keep_their_bytes(tmp_path, small_chunks, kind, workers):
    assert digest(_pref(tmp_path, kind, workers), tmp_path) == GOLDEN[kind]


def test_every_kind_keeps_its_bytes_on_ray(ray_cluster, tmp_path, small_chunks):
    base = tmp_path / "chat"
    base.mkdir()
    assert digest(_chat(base, 1, ray_prepare_executor(part_bytes=2048)), base) == GOLDEN["chat"]
    for kind in ("pairs", "kto", "prompts"):
        base = tmp_path / kind
        base.mkdir()
        assert digest(_pref(base, kind, 1, ray_prepare_executor()), base) == GOLDEN[kind], kind
