import hashlib
import pickle

import numpy as np
import pytest

from sftdata.chat.tokenizer import recorded_tokenizer
from sftdata.errors import DatasetError, OutputExistsError, UsageError
from sftdata.store import open_dataset, open_token_stream, scan_dataset
from sftdata.store.format import choose_token_dtype
from sftdata.store.writer import DatasetWriter
from sftdata.util.hashing import sha256_file


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


def test_an_episodes_split_names_its_items_episodes_and_refuses_row_names(tmp_path):
    write(tmp_path / "ds", [[1, 2, 3], [4, 5], [6, 7, 8, 9]], shard_tokens=5)
    split = open_dataset(tmp_path / "ds").split("train")
    assert not split.packed and split.what == "episode"
    assert split.num_items == split.num_episodes == 3 and split.item_offsets.tolist() == [0, 2, 3]
    assert split.item(2, limit=3)[0].tolist() == split.episode(2, limit=3)[0].tolist() == [6, 7, 8]
    assert split.episode_offsets.tolist() == [0, 2, 3]
    shard = split.shards[1]
    assert shard.num_items == shard.num_episodes == 1 and shard.index.tolist() == shard.episodes.tolist() == [[0, 4]]
    with pytest.raises(DatasetError, match=r"split 'train' holds episodes, not packed rows: use Split.num_episodes "
                       r"/ Split.episode\(i\) \(or num_items / item\(i\)\) instead of Split.num_rows"):
        _ = split.num_rows
    with pytest.raises(DatasetError, match=r"instead of Split.row\(i\)"):
        split.row(0)


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
    assert len(blob.replace(str(tmp_path).encode(), b"")) < 500  # its path and a few fields, whatever the temp folder
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
    assert recorded_tokenizer(tmp_path / "ds", open_dataset(tmp_path / "ds").tokenizer_state).special_tokens == tok.special_tokens
    (tmp_path / "ds" / "tokenizer_state.json").unlink()
    with pytest.raises(DatasetError, match="has no tokenizer_state.json"):
        recorded_tokenizer(tmp_path / "ds", open_dataset(tmp_path / "ds").tokenizer_state)


def _tiny(w):
    sw = w.split("train", np.dtype(np.uint16), 10)
    sw.add_many(np.array([1, 2], np.uint32), np.array([0, 1], np.uint8), [2], [0])
    return {"kind": "episodes", "token_dtype": "uint16", "splits": {"train": sw.close()}}


def test_a_failed_final_rename_puts_the_old_dataset_back(tmp_path, monkeypatch):
    """Where the two folders cannot be swapped in one step (no renameat2), commit moves the
    old dataset aside, then the new one in; if the second move fails, the old dataset must
    be back at the target, not left in a hidden folder."""
    with DatasetWriter(tmp_path / "ds") as w:
        w.commit(_tiny(w))
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    import sftdata.store.writer as writer

    real = writer.rename_noreplace
    calls = []

    def failing(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise OSError("disk trouble")
        real(a, b)

    monkeypatch.setattr(writer, "exchange", lambda a, b: False)
    monkeypatch.setattr(writer, "rename_noreplace", failing)
    with pytest.raises(OSError, match="disk trouble"):
        with DatasetWriter(tmp_path / "ds", overwrite=True) as w:
            w.commit(_tiny(w))
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before


# ---------------------------------------------------------------- one reader: tolerant and strict
def test_scan_opens_what_it_can_and_lists_the_problems(tmp_path):
    """scan_dataset never stops at a damaged shard: it maps what exists and says what is
    wrong; open_dataset refuses the same dataset with the first of those problems."""
    write(tmp_path / "ds", [[1, 2, 3], [4, 5], [6, 7, 8, 9]], shard_tokens=5)
    (tmp_path / "ds" / "train" / "shard_00000" / "tokens.bin").unlink()
    scan = scan_dataset(tmp_path / "ds")
    first, second = scan.dataset.split("train").shards
    assert first.tokens is None and first.num_episodes == 2 and second.tokens.tolist() == [6, 7, 8, 9]
    assert (second.split, second.first_gid, second.rel) == ("train", 2, "train/shard_00001")
    assert [(p.check, p.file, p.code) for p in scan.problems] == [
        ("files", "train/shard_00000/tokens.bin", ""),
        ("index", "train/shard_00000/episodes.idx", "out_of_bounds"),
        ("counts", "train/shard_00000", ""),
        ("counts", "dataset_metadata.json", "")]
    assert scan.problems[1].message == ("episode 0 spans tokens [0, 3) but the shard holds 0 tokens: the record points "
                                        "past the end (1 more episodes like it in this shard)")
    with pytest.raises(DatasetError, match=r"^.*/ds: train/shard_00000/tokens.bin: train/shard_00000/tokens.bin is "
                                           r"missing\. To fix: restore the file from a good copy of the dataset, or "
                                           r"re-create .* \(3 more problem\(s\)\)\. Run `sftdata verify .*/ds` for "
                                           r"the full report$"):
        open_dataset(tmp_path / "ds")


def test_strict_open_checks_eos_endings_with_the_recorded_markers(tmp_path, tok):
    with DatasetWriter(tmp_path / "ds") as w:
        sw = w.split("train", np.dtype(np.uint32), 100)
        sw.add_many(np.array([tok.ids.user, tok.eos_id, tok.ids.user, 7], np.uint32), np.zeros(4, np.uint8), [2, 2],
                    [0, 1])
        w.write_json("tokenizer_state.json", tok.state())
        w.commit({"kind": "episodes", "token_dtype": "uint32", "splits": {"train": sw.close()}})
    with pytest.raises(DatasetError, match=r"train/shard_00000/tokens.bin \(episode 1 of train, byte 12 of tokens.bin\)"
                                           r": episode 1 ends with id 7, not <\|EOS\|> \(id 100257\)"):
        open_dataset(tmp_path / "ds")
    (tmp_path / "ds" / "tokenizer_state.json").unlink()  # no markers known: the endings cannot be checked
    assert open_dataset(tmp_path / "ds").split("train").num_episodes == 2


def test_a_shard_unpickled_after_its_files_changed_is_refused(tmp_path):
    write(tmp_path / "ds", [[1, 2, 3]])
    blob = pickle.dumps(open_dataset(tmp_path / "ds").split("train").shards[0])
    mask = tmp_path / "ds" / "train" / "shard_00000" / "mask.bin"
    mask.write_bytes(mask.read_bytes()[:2])
    with pytest.raises(DatasetError, match=r"/ds: train/shard_00000/mask.bin: 2 mask bytes for the 3 tokens of "
                                           r"tokens.bin: tokens and mask differ in count"):
        pickle.loads(blob)


def test_read_range_reads_fresh_arrays(tmp_path):
    write(tmp_path / "ds", [[1, 2, 3], [4, 5]])
    sh = open_dataset(tmp_path / "ds").split("train").shards[0]
    toks, mask = sh.read_range(1, 4)
    assert toks.tolist() == [2, 3, 4] and mask.tolist() == [0, 1, 0]
    assert not isinstance(toks, np.memmap) and toks.dtype == np.uint16 and mask.dtype == np.uint8


@pytest.mark.parametrize("meta, state, override, expected", [
    ({"token_dtype": "uint16"}, None, None, ("<u2", [], False)),
    ({"token_dtype": "uint16"}, {"vocab_size": 100283}, None,
     ("<u2", ["token_dtype uint16 cannot hold the 100,283 ids of the tokenizer"], False)),
    ({"token_dtype": "bogus"}, None, None, ("<u4", ["token_dtype 'bogus' is not a numpy dtype"], False)),
    (None, None, "uint16", ("<u2", [], False)),
    (None, {"vocab_size": 300}, None, ("<u2", [], False)),
    (None, {"vocab_size": 100283}, None, ("<u4", [], False)),
    (None, None, None, ("<u4", [], True)),
])
def test_the_token_dtype_rule(meta, state, override, expected):
    dtype, errors, guessed = choose_token_dtype(meta, state, override)
    assert (dtype.str, errors, guessed) == expected


def test_an_unknown_token_dtype_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="token dtype must be uint16 or uint32, got 'foo'"):
        choose_token_dtype(None, None, "foo")


def test_token_stream_errors(tmp_path):
    d = tmp_path / "stream" / "train"
    d.mkdir(parents=True)
    np.arange(10, dtype="<u2").tofile(d / "tokens.bin")
    assert open_token_stream(tmp_path / "stream", "train", token_dtype="uint16")[0].tolist() == list(range(10))
    with pytest.raises(DatasetError, match=r"tokens.bin: 20 bytes is not a whole number of float64 values"):
        open_token_stream(tmp_path / "stream", "train", token_dtype="float64")
    with pytest.raises(DatasetError, match="has no tokens for split 'val'"):
        open_token_stream(tmp_path / "stream", "val")


def test_sha256_file_hashes_every_byte(tmp_path):
    data = bytes(range(256)) * 4100  # 1,049,600 bytes: several of hashlib.file_digest's reads and a short one
    (tmp_path / "f").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
