"""report (the data behind `sftdata inspect`): the overview's figures are exactly those
of the data; episode views show exactly which tokens are trained; packed datasets show
their packing figures and rows with their segments, positions, padding and trained
tokens exactly as stored; records, samples and errors."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest

from sftdata import report
from sftdata.chat.tokenizer import load_tokenizer
from sftdata.errors import DatasetError, UsageError
from sftdata.records.rejects import RejectsFile, reject_line, seal
from sftdata.report.rejects import read_rejects
from sftdata.store import open_dataset, split_segments
from tests.helpers.audit import make_dataset, make_packed, read_idx, shard, to_flat, write_idx

TRAIN_LENGTHS = [19, 28, 30, 15, 25, 29]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("pristine"), bad_lines=2)


@pytest.fixture
def ds(pristine, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(pristine, out)
    return out


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def per_episode_masks(ds, split="train"):
    sp = open_dataset(ds).split(split)
    return [np.asarray(sp.episode(i)[1]) for i in range(sp.num_episodes)]


def test_overview_counts_and_distributions(pristine):
    ov = report.overview(pristine)
    assert (ov.layout, ov.kind, ov.format_version, ov.token_dtype) == ("sharded", "episodes", 1, "uint32")
    assert ov.tokenizer["name"] == "cl100k_base" and ov.tokenizer["vocab_size"] == 100286
    train, val = ov.splits
    masks = per_episode_masks(pristine)
    trained = [int(m.sum()) for m in masks]
    assert (train.name, train.episodes, train.tokens, train.shards) == ("train", 6, sum(TRAIN_LENGTHS), 2)
    assert train.trained_tokens == sum(trained) == 52
    assert train.trained_share == pytest.approx(52 / 146)
    assert (val.episodes, val.tokens, val.shards) == (2, 33, 1)
    assert train.length_percentiles == {"p0": 15, "p10": 17, "p25": 20.5, "p50": 26.5, "p75": 28.75, "p90": 29.5,
                                        "p99": 29.95, "p100": 30, "mean": 24.33}
    assert train.length_histogram == report.Histogram([8.0, 16.0, 32.0], [1, 5])
    shares = np.array(trained) / np.array(TRAIN_LENGTHS)
    assert train.trained_share_percentiles["p0"] == round(shares.min(), 4)
    assert train.trained_share_percentiles["p100"] == round(shares.max(), 4)
    assert sum(train.trained_share_histogram.counts) == 6
    assert train.trained_share_histogram.counts == np.histogram(shares, bins=np.linspace(0, 1, 11))[0].tolist()
    assert train.episodes_training_nothing == 0
    files = [p for p in (pristine / "train").rglob("*") if p.is_file()]
    assert train.bytes_on_disk == sum(p.stat().st_size for p in files)
    assert ov.bytes_on_disk == sum(p.stat().st_size for p in pristine.rglob("*") if p.is_file())
    assert train.block is None


def test_overview_sources_options_and_rejects(pristine, tmp_path):
    ov = report.overview(pristine)
    (src,) = ov.sources
    data = (pristine.parent / "ds.jsonl").read_bytes()
    assert src["sha256"] == hashlib.sha256(data).hexdigest() and src["bytes"] == len(data) and src["records"] == 10
    assert ov.options["val_split"] == 0.25 and ov.options["shard_tokens"] == 100
    assert ov.rejected == {"invalid_json": 2} and ov.rejected_total == 2
    assert ov.rejects_file == str(pristine / "rejects.jsonl")
    assert ov.counts["records_read"] == 10 and ov.counts["episodes"] == 8


def test_overview_of_an_older_flat_layout_counts_its_rejects_file(pristine, tmp_path):
    """No metadata records the counts: the reasons are counted from rejects.jsonl, a line
    that is not a JSON object as ``unreadable_line``."""
    flat = to_flat(pristine, tmp_path / "flat")
    lines = [b'{"reason": "too_long"}', b'{"reason": "invalid_json"}', b"[1, 2]", b"", b"{broken",
             b'{"reason": "too_long"}', b'{"record": 3}']
    (flat / "rejects.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    ov = report.overview(flat)
    assert ov.rejected == {"invalid_json": 1, "too_long": 2, "unknown": 1, "unreadable_line": 2}
    assert list(ov.rejected) == sorted(ov.rejected) and ov.rejected_total == 6


def test_block_size_cost(pristine):
    ov = report.overview(pristine, block_size=20)
    b = ov.splits[0].block
    masks = per_episode_masks(pristine)
    assert (b.block_size, b.episodes_longer) == (20, 4)  # longer than 21 tokens: 28, 30, 25, 29
    assert b.tokens_dropped == (28 - 21) + (30 - 21) + (25 - 21) + (29 - 21)
    want = sum(int(m[21:].sum()) for m in masks)
    assert b.trained_tokens_dropped == want and want > 0
    assert b.trained_dropped_share == pytest.approx(want / 52)
    assert report.overview(pristine, block_size=29).splits[0].block.episodes_longer == 0
    with pytest.raises(UsageError, match="--block-size must be positive"):
        report.overview(pristine, block_size=0)


def test_length_histogram_bins_are_powers_of_two():
    h = report.length_histogram(np.array([1, 2, 3, 4, 7, 8, 100]))
    assert h.edges == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]
    assert h.counts == [1, 2, 2, 1, 0, 0, 1]


def test_flat_layout_overview(pristine, tmp_path):
    flat = to_flat(pristine, tmp_path / "flat")
    ov = report.overview(flat)
    assert ov.layout == "flat" and ov.format_version is None and ov.tokenizer is None
    (train,) = ov.splits
    assert (train.episodes, train.tokens, train.trained_tokens) == (6, 146, 52)
    assert ov.notes == ["older flat layout without dataset_metadata.json: no tokenizer, sources, options or counts "
                        "recorded; tokens read as uint32"]
    (flat / "train" / "mask.bin").unlink()
    ov = report.overview(flat)
    assert ov.splits[0].trained_tokens is None and "split train has no mask.bin" in ov.notes[1]


def test_overview_refuses_an_index_past_the_tokens(ds):
    p = shard(ds) / "episodes.idx"
    idx = read_idx(p)
    idx[3, 1] += 5
    write_idx(p, idx)
    with pytest.raises(DatasetError, match=r"episodes.idx \(episode 3 of train, byte 48 of episodes.idx\): episode 3 spans tokens "
                       r"\[77, 97\) but the shard holds 92 tokens: the record points past the end.*sftdata verify"):
        report.overview(ds)


def test_overview_of_an_unsorted_flat_layout_is_refused_with_a_reason(pristine, tmp_path):
    """open_dataset lets an older flat layout be unsorted (the loader reads episodes by
    (start, length)); the overview's per-episode sums need sorted episodes."""
    flat = to_flat(pristine, tmp_path / "flat")
    write_idx(flat / "train" / "episodes.idx", read_idx(flat / "train" / "episodes.idx")[[1, 0, 2, 3, 4, 5]])
    assert open_dataset(flat).split("train").num_episodes == 6
    with pytest.raises(DatasetError, match=r"train: episodes.idx is not sorted \(an older flat layout may be\); the "
                                           r"overview needs sorted episodes\. Run `sftdata verify` for details"):
        report.overview(flat)


def test_episode_view_pieces_and_tokens(pristine, tok):
    (v,), notes = report.views(pristine, "train", episodes=[0], tokens=True)
    assert notes == []
    assert (v.split, v.episode, v.record, v.shard, v.start, v.length, v.trained_tokens) == (
        "train", 0, 0, "shard_00000", 0, 19, 4)
    assert [(p.text, p.trained, p.marker) for p in v.pieces] == [
        ("<|SYSTEM|>", False, True), ("Be brief.", False, False), ("<|END|>", False, True),
        ("<|USER|>", False, True), ("What is the capital of France?", False, False), ("<|END|>", False, True),
        ("<|ASSISTANT|>", True, True), ("Paris.", True, False), ("<|END|>", True, True), ("<|EOS|>", False, True)]
    trained = [r for r in v.tokens if r.trained]
    assert [r.id for r in trained] == [tok.ids.assistant, *tok.encode("Paris."), tok.ids.end]
    assert [r.position for r in trained] == [14, 15, 16, 17]
    assert [r.span for r in v.tokens[:5]] == ["system"] * 5 and v.tokens[-1].span == ""
    assert v.tokens[6].text == "What" and not v.tokens[6].marker and v.tokens[5].marker
    assert v.rule_differs_at == []


def test_episode_view_second_shard_and_rule_difference(ds):
    m = np.fromfile(shard(ds, "train", 1) / "mask.bin", dtype=np.uint8)
    m[25 + 2] = 1  # episode 5, token 2: user text
    m.tofile(shard(ds, "train", 1) / "mask.bin")
    (v,), _ = report.views(ds, "train", episodes=[5])
    assert (v.shard, v.start, v.length, v.record) == ("shard_00001", 25, 29, 7)
    assert v.rule_differs_at == [2] and v.tokens is None


def test_record_lookup(pristine):
    src = {s: open_dataset(pristine).split(s).sources.tolist() for s in ("train", "val")}
    assert src == {"train": [0, 1, 3, 4, 5, 7], "val": [2, 6]}
    (v,), _ = report.views(pristine, record=6)
    assert (v.split, v.episode, v.record) == ("val", 1, 6)
    with pytest.raises(DatasetError, match=r"input record 9 is in no split.*rejected at prepare time \(invalid_json"):
        report.views(pristine, record=9)
    with pytest.raises(DatasetError, match=r"input record 99 is in no split .* \(no such record was kept"):
        report.views(pristine, record=99)


def test_sample_is_seeded_and_sorted(pristine):
    assert report.sample_ids(6, 3, 7) == sorted(np.random.RandomState(7).choice(6, 3, replace=False).tolist())
    assert report.sample_ids(6, 10, 0) == [0, 1, 2, 3, 4, 5]
    views, _ = report.views(pristine, "val", sample=1, seed=3)
    assert [v.episode for v in views] == report.sample_ids(2, 1, 3)
    with pytest.raises(UsageError, match="--sample must be at least 1"):
        report.sample_ids(6, 0, 0)


def test_episode_selection_errors(pristine, tmp_path):
    with pytest.raises(UsageError, match="exactly one of --episode, --row, --record or --sample"):
        report.views(pristine, episodes=[0], sample=2)
    with pytest.raises(UsageError, match="exactly one of"):
        report.views(pristine)
    with pytest.raises(DatasetError, match=r"episode 6 does not exist in split 'train', which has 6 episodes"):
        report.views(pristine, episodes=[6])
    with pytest.raises(DatasetError, match="has no split 'test'"):
        report.views(pristine, "test", episodes=[0])
    with pytest.raises(UsageError, match="--tokenizer is for older flat layouts"):
        report.views(pristine, episodes=[0], tokenizer="cl100k_base")
    with pytest.raises(UsageError, match="--token-dtype is for older flat layouts"):
        report.overview(pristine, token_dtype="uint16")


def test_flat_layout_episode_is_decoded_with_a_note(pristine, tmp_path):
    flat = to_flat(pristine, tmp_path / "flat")
    (v,), notes = report.views(flat, episodes=[3])
    assert v.record is None and v.trained_tokens == int(per_episode_masks(pristine)[3].sum())
    assert notes == ["the dataset records no tokenizer: decoded with cl100k_base (pass --tokenizer to choose)"]
    with pytest.raises(DatasetError, match="no sources.idx"):
        report.views(flat, record=0)


# ------------------------------------------------------------------------ packed
# bfd, block 63 (rows of 64), val_split 0, 8 episodes in 4 rows (see test_verify_packed);
# row 0: episode 1 at [0, 28), episode 5 at [28, 53), padding [53, 64).


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    t = tmp_path_factory.mktemp("packed")
    make_packed(t, "bfd", block_size=63, shard_tokens=128)
    make_packed(t, "stream", source=t / "bfd_src", block_size=40, strategy="stream")
    return t


def test_packed_overview(built):
    ov = report.overview(built / "bfd")
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
    src = report.overview(built / "bfd_src").splits[0]
    assert train.trained_tokens == src.trained_tokens == 62  # bfd keeps whole episodes
    assert train.trained_share == pytest.approx(62 / 179)
    assert report.overview(built / "stream").splits[0].packed.injected_tokens == 8
    with pytest.raises(UsageError, match="is packed: its rows are already 64 tokens"):
        report.overview(built / "bfd", block_size=100)


def test_row_view_segments_positions_padding(built, tok):
    (v,), notes = report.views(built / "bfd", rows=[0], tokens=True)
    assert isinstance(v, report.RowView) and notes == []
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
    (v,), _ = report.views(built / "stream", rows=[1])
    first = v.segments[0]
    assert (first.prefix, first.episode, first.episode_start) == (1, 1, 22)
    assert first.pieces[0].injected and first.pieces[0].text == "<|USER|>" and not first.pieces[1].injected
    assert v.rule_differs_at == []


def test_record_sample_and_selection_errors(built):
    views, _ = report.views(built / "stream", record=3)
    assert [v.row for v in views] == [1, 2]  # episode 3 runs across two rows
    assert all(any(s.record == 3 for s in v.segments) for v in views)
    views, _ = report.views(built / "bfd", sample=2, seed=1)
    assert [v.row for v in views] == report.sample_ids(4, 2, 1)
    with pytest.raises(UsageError, match="a packed dataset holds rows: use --row"):
        report.views(built / "bfd", episodes=[0])
    with pytest.raises(UsageError, match="--row is for packed datasets"):
        report.views(built / "bfd_src", rows=[0])
    with pytest.raises(DatasetError, match="input record 99 is in no row"):
        report.views(built / "bfd", record=99)
    with pytest.raises(DatasetError, match="row 4 does not exist in split 'train', which has 4 rows"):
        report.views(built / "bfd", rows=[4])


def test_row_view_flags_a_mask_off_the_rule(built, tmp_path):
    shutil.copytree(built / "bfd", tmp_path / "bfd")
    p = shard(tmp_path / "bfd") / "mask.bin"
    m = np.fromfile(p, dtype=np.uint8)
    m[29] = 1
    m.tofile(p)
    (v,), _ = report.views(tmp_path / "bfd", rows=[0])
    assert v.rule_differs_at == [29]


def test_a_packed_dataset_with_damaged_segments_is_refused_before_any_view(built, tmp_path):
    shutil.copytree(built / "bfd", tmp_path / "bfd")
    p = shard(tmp_path / "bfd") / "segments.idx"
    seg = np.fromfile(p, dtype="<u8").reshape(-1, 7)
    seg[1, 1] += 3  # a hole between the first two segments of row 0
    seg.tofile(p)
    for call in (lambda: report.overview(tmp_path / "bfd"), lambda: report.views(tmp_path / "bfd", rows=[0])):
        with pytest.raises(DatasetError, match=r"segments.idx .*lie between segments 0 and 1.*sftdata verify"):
            call()


def test_the_closing_lines_of_a_rejects_file_are_no_rejects(tmp_path):
    """A capped rejects.jsonl ends with a ``rejects_cut`` line (and one kept beside an
    output with its seal): neither is counted as a reason; the cut's words are kept."""
    path = tmp_path / "ds.rejects.jsonl"
    with open(path, "wb") as f:
        rej = RejectsFile(f, limit=200)
        for i in range(5):
            rej.write(reject_line(i, f"a:line {i + 1}", "invalid_json", "bad") + b"\n")
        rej.close()
    seal(path)
    got = read_rejects(path)
    assert [(g.reason, g.count) for g in got.groups] == [("invalid_json", 2)] and got.total == 2
    assert got.cut is not None and got.cut.startswith("3 more rejected records are not listed")
