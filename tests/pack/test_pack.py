"""The pack pipeline: episodes dataset -> packed dataset (layout, rebuild, report, errors).
``source`` is the prepared dataset of tests/conftest.py."""

from __future__ import annotations

import shutil

import numpy as np
import orjson
import pytest

from sftdata.chat.markers import MarkerIds
from sftdata.chat.masking import loss_mask
from sftdata.errors import DatasetError, OutputExistsError, UsageError
from sftdata.pack import PackOptions, pack
from sftdata.pack import rows as pack_rows
from sftdata.packing import row_layout
from sftdata.store import METADATA_FILE, TOKENIZER_FILE, open_dataset, split_segments
from sftdata.store.format import SEGMENTS_FILE, iter_files
from sftdata.util.hashing import sha256_file


def markers(ds) -> MarkerIds:
    return MarkerIds.from_special_tokens(ds.tokenizer_state["special_tokens"])


def check_rebuild(src_path, out_path):
    """Every segment of every row is exactly its source episode slice, with the mask
    of the rule over it, and padding is pad_id with mask 0."""
    src, out = open_dataset(src_path), open_dataset(out_path)
    m = markers(src)
    L = out.packing["row_len"]
    pad = out.packing["pad_token_id"]
    for name, split in out.splits.items():
        s_split = src.split(name)
        seg = split_segments(split)
        rows_tok = np.concatenate([np.asarray(sh.tokens) for sh in split.shards]).reshape(-1, L)
        rows_mask = np.concatenate([np.asarray(sh.mask) for sh in split.shards]).reshape(-1, L)
        assert rows_tok.shape[0] == split.num_rows
        for j in range(seg.row.size):
            r, o, n, p = (int(v[j]) for v in (seg.row, seg.offset, seg.length, seg.prefix))
            ep_toks, _ = s_split.episode(int(seg.episode[j]))
            s = int(seg.episode_start[j])
            np.testing.assert_array_equal(rows_tok[r, o + p:o + n], ep_toks[s:s + n - p])
            expect = np.concatenate([np.zeros(p, np.uint8), loss_mask(rows_tok[r, o + p:o + n], m)])
            np.testing.assert_array_equal(rows_mask[r, o:o + n], expect)
            assert seg.source[j] == s_split.sources[seg.episode[j]]
        seq, _ = row_layout(seg.row, seg.offset, seg.length, rows_tok.shape[0], L)
        assert (rows_tok[seq == -1] == pad).all() and (rows_mask[seq == -1] == 0).all()
    return out


def test_bfd_output_layout_metadata_and_rebuild(source, tmp_path):
    rep = pack(source, tmp_path / "p", PackOptions(block_size=255, seed=1))
    out = check_rebuild(source, tmp_path / "p")
    assert out.kind == "packed" and out.layout == "sharded" and sorted(out.splits) == ["train", "val"]
    meta = out.metadata
    assert meta["packing"] == {"block_size": 255, "row_len": 256, "strategy": "bfd", "overlong": "truncate",
                               "pad_token_id": 100257, "seed": 1, "shard_tokens": 16_000_000, "pad_seq_id": -1,
                               "segment_fields": ["row", "offset", "length", "prefix", "episode",
                                                  "episode_start", "source"]}
    assert meta["source"]["path"] == str(source.resolve())
    assert meta["source"]["metadata_sha256"] == sha256_file(source / METADATA_FILE)
    assert (tmp_path / "p" / TOKENIZER_FILE).read_bytes() == (source / TOKENIZER_FILE).read_bytes()
    src = open_dataset(source)
    for name, r in rep.splits.items():
        assert r.episodes == src.split(name).num_episodes
        assert meta["splits"][name]["rows"] == r.rows == out.split(name).num_rows
        # every episode placed whole exactly once (none is longer than a row here)
        seg = split_segments(out.split(name))
        assert sorted(seg.episode.tolist()) == list(range(r.episodes))
        assert r.tokens_lost == 0 and r.trained_lost == 0 and r.overlong_episodes == 0
        assert r.tokens_packed == r.tokens_in == src.split(name).num_tokens
        assert r.trained_in == r.trained_packed == meta["splits"][name]["trained_tokens"]
        assert r.lower_bound_rows == -(-r.tokens_in // 256) and r.bound_ratio >= 0.9
        assert r.fill == pytest.approx(r.tokens_in / (r.rows * 256))
        lengths = src.split(name).lengths
        assert r.padding_rows == lengths.size
        assert r.padding_fill == pytest.approx(np.minimum(lengths, 256).sum() / (lengths.size * 256))


def test_checksums_and_byte_identical_output(source, tmp_path):
    opts = PackOptions(block_size=200, seed=4, shard_tokens=2000)
    pack(source, tmp_path / "a", opts)
    pack(source, tmp_path / "b", opts)
    files_a = [p.relative_to(tmp_path / "a") for p in iter_files(tmp_path / "a")]
    assert files_a == [p.relative_to(tmp_path / "b") for p in iter_files(tmp_path / "b")]
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    meta = open_dataset(tmp_path / "a").metadata
    shards = meta["splits"]["train"]["shards"]
    assert len(shards) > 1 and all(s["rows"] <= 2000 // 201 for s in shards)
    for split, sm in meta["splits"].items():
        for sh in sm["shards"]:
            for fn, info in sh["files"].items():
                path = tmp_path / "a" / split / sh["name"] / fn
                assert sha256_file(path) == info["sha256"] and path.stat().st_size == info["bytes"]
    check_rebuild(source, tmp_path / "a")


def test_overlong_truncation_reports_tokens_and_trained_tokens_lost(source, tmp_path):
    rep = pack(source, tmp_path / "t", PackOptions(block_size=63))
    src, out = open_dataset(source), open_dataset(tmp_path / "t")
    m = markers(src)
    r = rep.splits["train"]
    lengths = src.split("train").lengths
    assert r.overlong_episodes == int((lengths > 64).sum()) > 0
    assert r.tokens_lost == int(np.maximum(lengths - 64, 0).sum())
    trained_in = sum(int(loss_mask(src.split("train").episode(i)[0], m).sum()) for i in range(lengths.size))
    trained_out = sum(int(np.count_nonzero(sh.mask)) for sh in out.split("train").shards)
    assert (r.trained_in, r.trained_packed, r.trained_lost) == (trained_in, trained_out, trained_in - trained_out)
    assert r.trained_lost > 0
    check_rebuild(source, tmp_path / "t")


def test_split_and_drop_policies(source, tmp_path):
    src = open_dataset(source)
    lengths = src.split("train").lengths
    rs = pack(source, tmp_path / "s", PackOptions(block_size=63, overlong="split")).splits["train"]
    assert rs.tokens_lost == 0 and rs.tokens_packed == lengths.sum()
    check_rebuild(source, tmp_path / "s")
    rd = pack(source, tmp_path / "d", PackOptions(block_size=63, overlong="drop")).splits["train"]
    assert rd.dropped_episodes == int((lengths > 64).sum())
    assert rd.tokens_lost == int(lengths[lengths > 64].sum())
    seg = split_segments(open_dataset(tmp_path / "d").split("train"))
    assert set(seg.episode.tolist()) == set(np.flatnonzero(lengths <= 64).tolist())


def test_stream_output_rebuilds_with_injected_prefixes(source, tmp_path):
    rep = pack(source, tmp_path / "st", PackOptions(block_size=50, strategy="stream"))
    out = check_rebuild(source, tmp_path / "st")
    src = open_dataset(source)
    m = markers(src)
    r = rep.splits["train"]
    seg = split_segments(out.split("train"))
    assert r.tokens_injected == int(seg.prefix.sum()) > 0
    rows = np.concatenate([np.asarray(sh.tokens) for sh in out.split("train").shards]).reshape(-1, 51)
    for j in np.flatnonzero(seg.prefix):
        first = rows[seg.row[j], seg.offset[j]]
        assert first in (m.system, m.user)
        assert rows[seg.row[j], seg.offset[j] + seg.prefix[j] - 1] in (m.user, m.end)
    # stream order: episodes appear in order
    assert np.all(np.diff(seg.episode) >= 0)
    assert r.tokens_packed == r.tokens_in - r.tokens_lost + r.tokens_injected


def test_packed_rows_read_back_as_fixed_length_items(source, tmp_path):
    pack(source, tmp_path / "p", PackOptions(block_size=127, shard_tokens=1000))
    split = open_dataset(tmp_path / "p").split("train")
    assert (split.lengths == 128).all() and len(split.shards) > 1
    toks, mask = split.row(split.num_rows - 1)
    assert toks.shape == (128,) and mask.shape == (128,)
    seg = split_segments(split)
    assert seg.row[-1] == split.num_rows - 1
    sub = seg.of_rows([3, 0])
    assert sub.row.tolist() == [3] * int((seg.row == 3).sum()) + [0] * int((seg.row == 0).sum())


def test_pack_errors(source, tmp_path):
    pack(source, tmp_path / "p", PackOptions(block_size=127))
    with pytest.raises(DatasetError, match="is a 'packed' dataset; pack reads an episodes dataset"):
        pack(tmp_path / "p", tmp_path / "pp", PackOptions())
    assert pack(source, tmp_path / "p", PackOptions(block_size=127)).up_to_date
    with pytest.raises(OutputExistsError, match=r"already exists and is not up to date: the option --block-size "
                                                r"changed \(127 -> 64\)\. Pass --overwrite"):
        pack(source, tmp_path / "p", PackOptions(block_size=64))
    pack(source, tmp_path / "p", PackOptions(block_size=64, overwrite=True))
    assert open_dataset(tmp_path / "p").packing["block_size"] == 64
    with pytest.raises(UsageError, match=r"--pad-id 100286 is not a token id of this dataset \(0..100285\)"):
        pack(source, tmp_path / "x", PackOptions(pad_id=100286))
    with pytest.raises(UsageError, match=r"--block-size must be at least 3 \(a row of 4 tokens, <\|USER\|> <\|END\|> "
                                         r"<\|ASSISTANT\|> <\|END\|>, is the smallest that can train a reply\), got 0"):
        pack(source, tmp_path / "x", PackOptions(block_size=0))
    with pytest.raises(UsageError, match="--strategy must be one of bfd, stream, not 'ffd'"):
        pack(source, tmp_path / "x", PackOptions(strategy="ffd"))
    with pytest.raises(UsageError, match="--overlong must be one of truncate, keep_end, split, drop, not .keep."):
        pack(source, tmp_path / "x", PackOptions(overlong="keep"))
    with pytest.raises(UsageError, match="--shard-tokens must be positive"):
        pack(source, tmp_path / "x", PackOptions(shard_tokens=0))
    with pytest.raises(UsageError, match="is the source dataset"):
        pack(source, source, PackOptions(overwrite=True))
    with pytest.raises(DatasetError, match="does not exist"):
        pack(tmp_path / "missing", tmp_path / "x", PackOptions())
    assert not (tmp_path / "x").exists()


def test_source_without_markers_or_metadata_is_refused(source, tmp_path):
    shutil.copytree(source, tmp_path / "nots")
    state = orjson.loads((tmp_path / "nots" / TOKENIZER_FILE).read_bytes())
    del state["special_tokens"]
    (tmp_path / "nots" / TOKENIZER_FILE).write_bytes(orjson.dumps(state))
    with pytest.raises(DatasetError, match="tokenizer_state.json records neither sftdata's chat markers "
                                           r"\(special_tokens\) nor a template's mask_rule"):
        pack(tmp_path / "nots", tmp_path / "x", PackOptions())
    (tmp_path / "nots" / TOKENIZER_FILE).unlink()
    with pytest.raises(DatasetError, match="has no tokenizer_state.json, so its mask rule is unknown"):
        pack(tmp_path / "nots", tmp_path / "x", PackOptions())
    flat = tmp_path / "flat" / "train"
    flat.mkdir(parents=True)
    np.arange(10, dtype="<u4").tofile(flat / "tokens.bin")
    np.array([[0, 10]], dtype="<u8").tofile(flat / "episodes.idx")
    with pytest.raises(DatasetError, match="no dataset_metadata.json .an older flat layout"):
        pack(tmp_path / "flat", tmp_path / "x", PackOptions())


def test_a_failure_midway_leaves_nothing(source, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(pack_rows, "assemble_rows", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        pack(source, tmp_path / "p", PackOptions())
    assert list(tmp_path.iterdir()) == []


def test_damaged_packed_datasets_are_refused(source, tmp_path):
    pack(source, tmp_path / "p", PackOptions(block_size=127))
    shard = tmp_path / "p" / "train" / "shard_00000"
    data = (shard / SEGMENTS_FILE).read_bytes()
    (shard / SEGMENTS_FILE).write_bytes(data[:-8])
    with pytest.raises(DatasetError, match="not a multiple of 56 .7 uint64 per segment"):
        open_dataset(tmp_path / "p")
    (shard / SEGMENTS_FILE).unlink()
    with pytest.raises(DatasetError, match="train/shard_00000/segments.idx is missing. To fix: restore the file"):
        open_dataset(tmp_path / "p")
    pack(source, tmp_path / "q", PackOptions(block_size=127))
    meta_path = tmp_path / "q" / METADATA_FILE
    meta = orjson.loads(meta_path.read_bytes())
    meta["packing"]["row_len"] = 100
    meta_path.write_bytes(orjson.dumps(meta))
    with pytest.raises(DatasetError, match=r"tokens are not whole rows of 100 \(packing.row_len\): the file is truncated"):
        open_dataset(tmp_path / "q")
    del meta["packing"]
    meta_path.write_bytes(orjson.dumps(meta))
    with pytest.raises(DatasetError, match="needs packing.row_len"):
        open_dataset(tmp_path / "q")
