import pickle

import numpy as np
import pytest

from sftdata.errors import DatasetError, OutputExistsError
from sftdata.store import DatasetWriter, open_dataset


def write(root, episodes, shard_tokens=1000, dtype=np.uint16):
    with DatasetWriter(root) as w:
        sw = w.split("train", np.dtype(dtype), shard_tokens)
        ids = np.concatenate([np.asarray(e, dtype=np.uint32) for e in episodes])
        sw.add_many(ids, (ids % 2).astype(np.uint8), [len(e) for e in episodes], list(range(len(episodes))))
        meta = sw.close()
        w.commit({"kind": "episodes", "token_dtype": np.dtype(dtype).name, "splits": {"train": meta}})
    return meta


def test_round_trip_and_shard_layout(tmp_path):
    meta = write(tmp_path / "ds", [[1, 2, 3], [4, 5], [6, 7, 8, 9]], shard_tokens=5)
    assert [(s["episodes"], s["tokens"]) for s in meta["shards"]] == [(2, 5), (1, 4)]
    split = open_dataset(tmp_path / "ds").split("train")
    assert split.num_episodes == 3 and split.num_tokens == 9
    assert [split.episode(g)[0].tolist() for g in range(3)] == [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    assert split.episode(2, limit=2)[0].tolist() == [6, 7]
    assert split.episode(1)[1].tolist() == [0, 1]
    assert split.shard_of([0, 1, 2]).tolist() == [0, 0, 1]
    with pytest.raises(DatasetError, match="episode 3 does not exist in split 'train', which has 3 episodes"):
        split.episode(3)


def test_writer_leaves_nothing_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with DatasetWriter(tmp_path / "ds") as w:
            w.split("train", np.dtype(np.uint16), 10).add_many(
                np.array([1, 2], np.uint32), np.array([0, 1], np.uint8), [2], [0])
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_refuses_existing_target(tmp_path):
    (tmp_path / "ds").mkdir()
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        DatasetWriter(tmp_path / "ds").__enter__()


def test_shards_pickle_by_path(tmp_path):
    write(tmp_path / "ds", [[1, 2, 3]])
    split = open_dataset(tmp_path / "ds").split("train")
    blob = pickle.dumps(split.shards[0])
    assert len(blob) < 500
    assert pickle.loads(blob).tokens.tolist() == [1, 2, 3]


def test_flat_layout_with_float32_mask(tmp_path):
    d = tmp_path / "old" / "train"
    d.mkdir(parents=True)
    np.array([5, 6, 7, 8], np.uint32).tofile(d / "tokens.bin")
    np.array([0, 0, 1, 1], np.float32).tofile(d / "mask.bin")
    np.array([[0, 2], [2, 2]], np.uint64).tofile(d / "episodes.idx")
    ds = open_dataset(tmp_path / "old")
    assert ds.layout == "flat" and ds.metadata is None
    split = ds.split("train")
    assert split.shards[0].mask_dtype == np.float32
    assert split.episode(1)[0].tolist() == [7, 8] and split.episode(1)[1].tolist() == [1.0, 1.0]
    assert split.sources is None


def test_reader_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        open_dataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="holds no dataset"):
        open_dataset(tmp_path / "empty")
    d = tmp_path / "bad" / "train"
    d.mkdir(parents=True)
    np.array([5, 6], np.uint32).tofile(d / "tokens.bin")
    np.array([1, 2, 3], np.uint8).tofile(d / "mask.bin")
    np.array([[0, 2]], np.uint64).tofile(d / "episodes.idx")
    with pytest.raises(DatasetError, match=r"bad: train/mask.bin: 3 mask bytes for the 2 tokens of tokens.bin: tokens "
                       r"and mask differ in count .*\. Run `sftdata verify .*bad` for the full report$"):
        open_dataset(tmp_path / "bad")
    (d / "mask.bin").unlink()
    (d / "episodes.idx").write_bytes(b"x" * 20)
    with pytest.raises(DatasetError, match="not a multiple of 16"):
        open_dataset(tmp_path / "bad")
    write(tmp_path / "ds", [[1, 2]])
    (tmp_path / "ds" / "dataset_metadata.json").unlink()
    with pytest.raises(DatasetError, match="dataset_metadata.json is missing"):
        open_dataset(tmp_path / "ds")


def test_dataset_rebuilds_its_tokenizer(tmp_path, tok):
    with DatasetWriter(tmp_path / "ds") as w:
        sw = w.split("train", np.dtype(np.uint32), 100)
        sw.add_many(np.array([tok.ids.user, tok.eos_id], np.uint32), np.zeros(2, np.uint8), [2], [0])
        w.write_json("tokenizer_state.json", tok.state())
        w.commit({"kind": "episodes", "token_dtype": "uint32", "splits": {"train": sw.close()}})
    assert open_dataset(tmp_path / "ds").tokenizer().special_tokens == tok.special_tokens
    (tmp_path / "ds" / "tokenizer_state.json").unlink()
    with pytest.raises(DatasetError, match="has no tokenizer_state.json"):
        open_dataset(tmp_path / "ds").tokenizer()


def _tiny(w):
    sw = w.split("train", np.dtype(np.uint16), 10)
    sw.add_many(np.array([1, 2], np.uint32), np.array([0, 1], np.uint8), [2], [0])
    return {"kind": "episodes", "token_dtype": "uint16", "splits": {"train": sw.close()}}


def test_a_failed_final_rename_puts_the_old_dataset_back(tmp_path, monkeypatch):
    """commit moves the old dataset aside, then the new one in; if the second move fails,
    the old dataset must be back at the target, not left in a hidden folder."""
    with DatasetWriter(tmp_path / "ds") as w:
        w.commit(_tiny(w))
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    import sftdata.store.writer as writer

    real = writer.os.replace
    calls = []

    def failing(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise OSError("disk trouble")
        real(a, b)

    monkeypatch.setattr(writer.os, "replace", failing)
    with pytest.raises(OSError, match="disk trouble"):
        with DatasetWriter(tmp_path / "ds", overwrite=True) as w:
            w.commit(_tiny(w))
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
