"""inspect on packed datasets: the overview's packing figures, and rows with their
segments, positions, padding and trained tokens exactly as stored."""

from __future__ import annotations

import numpy as np
import pytest
from audit_data import make_packed, shard

from sftdata import inspect as sft_inspect
from sftdata.errors import DatasetError, UsageError
from sftdata.inspect_packed import RowView
from sftdata.store import open_dataset, split_segments
from sftdata.tokenizer import load_tokenizer

# bfd, block 63 (rows of 64), val_split 0, 8 episodes in 4 rows (see test_verify_packed);
# row 0: episode 1 at [0, 28), episode 5 at [28, 53), padding [53, 64).


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    t = tmp_path_factory.mktemp("packed")
    make_packed(t, "bfd", block_size=63, shard_tokens=128)
    make_packed(t, "stream", source=t / "bfd_src", block_size=40, strategy="stream")
    return t


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_packed_overview(built):
    ov = sft_inspect.overview(built / "bfd")
    assert ov.kind == "packed" and ov.packing["row_len"] == 64 and ov.packing["strategy"] == "bfd"
    assert ov.packed_from["path"] == str((built / "bfd_src").resolve())
    (train,) = ov.splits
    seg = split_segments(open_dataset(built / "bfd").split("train"))
    p = train.packed
    assert (p.rows, p.segments, p.row_len) == (4, 8, 64)
    assert p.real_tokens == int(seg.length.sum()) == 179 and p.padding_tokens == 4 * 64 - 179
    assert p.fill == pytest.approx(179 / 256) and p.injected_tokens == 0
    assert p.segments_per_row == {"p0": 1.0, "p50": 2.0, "p100": 3.0, "mean": 2.0}
    assert train.length_percentiles["p0"] == 15 and train.length_percentiles["p100"] == 30  # segment lengths
    src = sft_inspect.overview(built / "bfd_src").splits[0]
    assert train.trained_tokens == src.trained_tokens == 62  # bfd keeps whole episodes
    assert train.trained_share == pytest.approx(62 / 179)
    assert sft_inspect.overview(built / "stream").splits[0].packed.injected_tokens == 8
    with pytest.raises(UsageError, match="is packed: its rows are already 64 tokens"):
        sft_inspect.overview(built / "bfd", block_size=100)


def test_row_view_segments_positions_padding(built, tok):
    (v,), notes = sft_inspect.views(built / "bfd", rows=[0], tokens=True)
    assert isinstance(v, RowView) and notes == []
    assert (v.row, v.shard, v.row_len, v.real_tokens, v.padding, v.pad_id) == (0, "shard_00000", 64, 53, 11, 100257)
    assert [(s.index, s.offset, s.length, s.prefix, s.episode, s.episode_start, s.record) for s in v.segments] == [
        (0, 0, 28, 0, 1, 0, 1), (1, 28, 25, 0, 5, 0, 5)]
    src = open_dataset(built / "bfd_src").split("train")
    for s in v.segments:  # each segment is its source episode, trained exactly as there
        ids, mask = src.episode(s.episode)
        assert "".join(p.text for p in s.pieces) == tok.decode(ids)
        assert s.trained_tokens == int(np.asarray(mask).sum())
    assert [t.seq_id for t in v.tokens] == [0] * 28 + [1] * 25 + [-1] * 11
    assert [t.position_id for t in v.tokens] == list(range(28)) + list(range(25)) + [0] * 11
    mask = np.fromfile(shard(built / "bfd") / "mask.bin", dtype=np.uint8)[:64]
    assert [t.trained for t in v.tokens] == mask.astype(bool).tolist()
    assert v.trained_tokens == int(mask.sum()) and v.rule_differs_at == []
    assert v.tokens[28].span == "user" and v.tokens[60].span == ""


def test_stream_row_shows_injected_context(built):
    (v,), _ = sft_inspect.views(built / "stream", rows=[1])
    first = v.segments[0]
    assert (first.prefix, first.episode, first.episode_start) == (1, 1, 22)
    assert first.pieces[0].injected and first.pieces[0].text == "<|USER|>" and not first.pieces[1].injected
    assert v.rule_differs_at == []


def test_record_sample_and_selection_errors(built):
    views, _ = sft_inspect.views(built / "stream", record=3)
    assert [v.row for v in views] == [1, 2]  # episode 3 runs across two rows
    assert all(any(s.record == 3 for s in v.segments) for v in views)
    views, _ = sft_inspect.views(built / "bfd", sample=2, seed=1)
    assert [v.row for v in views] == sft_inspect.sample_ids(4, 2, 1)
    with pytest.raises(UsageError, match="a packed dataset holds rows: use --row"):
        sft_inspect.views(built / "bfd", episodes=[0])
    with pytest.raises(UsageError, match="--row is for packed datasets"):
        sft_inspect.views(built / "bfd_src", rows=[0])
    with pytest.raises(DatasetError, match="input record 99 is in no row"):
        sft_inspect.views(built / "bfd", record=99)
    with pytest.raises(DatasetError, match="episode 4 does not exist in split 'train', which has 4 episodes"):
        sft_inspect.views(built / "bfd", rows=[4])


def test_row_view_flags_a_mask_off_the_rule(built, tmp_path):
    import shutil

    shutil.copytree(built / "bfd", tmp_path / "bfd")
    p = shard(tmp_path / "bfd") / "mask.bin"
    m = np.fromfile(p, dtype=np.uint8)
    m[29] = 1
    m.tofile(p)
    (v,), _ = sft_inspect.views(tmp_path / "bfd", rows=[0])
    assert v.rule_differs_at == [29]
