"""inspect: the overview's figures are exactly those of the data; episode views show
exactly which tokens are trained; records, samples and errors."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
from audit_data import make_dataset, read_idx, shard, to_flat, write_idx

from sftdata import inspect as sft_inspect
from sftdata.errors import DatasetError, UsageError
from sftdata.store import open_dataset
from sftdata.tokenizer import load_tokenizer

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
    ov = sft_inspect.overview(pristine)
    assert (ov.layout, ov.kind, ov.format_version, ov.token_dtype) == ("sharded", "episodes", 1, "uint32")
    assert ov.tokenizer["name"] == "cl100k_base" and ov.tokenizer["vocab_size"] == 100283
    train, val = ov.splits
    masks = per_episode_masks(pristine)
    trained = [int(m.sum()) for m in masks]
    assert (train.name, train.episodes, train.tokens, train.shards) == ("train", 6, sum(TRAIN_LENGTHS), 2)
    assert train.trained_tokens == sum(trained) == 52
    assert train.trained_share == pytest.approx(52 / 146)
    assert (val.episodes, val.tokens, val.shards) == (2, 33, 1)
    assert train.length_percentiles == {"p0": 15, "p10": 17, "p25": 20.5, "p50": 26.5, "p75": 28.75, "p90": 29.5,
                                        "p99": 29.95, "p100": 30, "mean": 24.33}
    assert train.length_histogram == sft_inspect.Histogram([8.0, 16.0, 32.0], [1, 5])
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
    ov = sft_inspect.overview(pristine)
    (src,) = ov.sources
    data = (pristine.parent / "ds.jsonl").read_bytes()
    assert src["sha256"] == hashlib.sha256(data).hexdigest() and src["bytes"] == len(data) and src["records"] == 10
    assert ov.options["val_split"] == 0.25 and ov.options["shard_tokens"] == 100
    assert ov.rejected == {"invalid_json": 2} and ov.rejected_total == 2
    assert ov.rejects_file == str(pristine / "rejects.jsonl")
    assert ov.counts["records_read"] == 10 and ov.counts["episodes"] == 8


def test_block_size_cost(pristine):
    ov = sft_inspect.overview(pristine, block_size=20)
    b = ov.splits[0].block
    masks = per_episode_masks(pristine)
    assert (b.block_size, b.episodes_longer) == (20, 4)  # longer than 21 tokens: 28, 30, 25, 29
    assert b.tokens_dropped == (28 - 21) + (30 - 21) + (25 - 21) + (29 - 21)
    want = sum(int(m[21:].sum()) for m in masks)
    assert b.trained_tokens_dropped == want and want > 0
    assert b.trained_dropped_share == pytest.approx(want / 52)
    assert sft_inspect.overview(pristine, block_size=29).splits[0].block.episodes_longer == 0
    with pytest.raises(UsageError, match="--block-size must be positive"):
        sft_inspect.overview(pristine, block_size=0)


def test_length_histogram_bins_are_powers_of_two():
    h = sft_inspect.length_histogram(np.array([1, 2, 3, 4, 7, 8, 100]))
    assert h.edges == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]
    assert h.counts == [1, 2, 2, 1, 0, 0, 1]


def test_flat_layout_overview(pristine, tmp_path):
    flat = to_flat(pristine, tmp_path / "flat")
    ov = sft_inspect.overview(flat)
    assert ov.layout == "flat" and ov.format_version is None and ov.tokenizer is None
    (train,) = ov.splits
    assert (train.episodes, train.tokens, train.trained_tokens) == (6, 146, 52)
    assert ov.notes == ["older flat layout without dataset_metadata.json: no tokenizer, sources, options or counts "
                        "recorded; tokens read as uint32"]
    (flat / "train" / "mask.bin").unlink()
    ov = sft_inspect.overview(flat)
    assert ov.splits[0].trained_tokens is None and "split train has no mask.bin" in ov.notes[1]


def test_overview_refuses_an_index_past_the_tokens(ds):
    p = shard(ds) / "episodes.idx"
    idx = read_idx(p)
    idx[3, 1] += 5
    write_idx(p, idx)
    with pytest.raises(DatasetError, match=r"episodes.idx \(episode 3 of train, byte 48 of episodes.idx\): episode 3 spans tokens "
                       r"\[77, 97\) but the shard holds 92 tokens: the record points past the end.*sftdata verify"):
        sft_inspect.overview(ds)


def test_episode_view_pieces_and_tokens(pristine, tok):
    (v,), notes = sft_inspect.views(pristine, "train", episodes=[0], tokens=True)
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
    (v,), _ = sft_inspect.views(ds, "train", episodes=[5])
    assert (v.shard, v.start, v.length, v.record) == ("shard_00001", 25, 29, 7)
    assert v.rule_differs_at == [2] and v.tokens is None


def test_record_lookup(pristine):
    src = {s: open_dataset(pristine).split(s).sources.tolist() for s in ("train", "val")}
    assert src == {"train": [0, 1, 3, 4, 5, 7], "val": [2, 6]}
    (v,), _ = sft_inspect.views(pristine, record=6)
    assert (v.split, v.episode, v.record) == ("val", 1, 6)
    with pytest.raises(DatasetError, match=r"input record 9 is in no split.*rejected at prepare time \(invalid_json"):
        sft_inspect.views(pristine, record=9)
    with pytest.raises(DatasetError, match=r"input record 99 is in no split .* \(no such record was kept"):
        sft_inspect.views(pristine, record=99)


def test_sample_is_seeded_and_sorted(pristine):
    assert sft_inspect.sample_ids(6, 3, 7) == sorted(np.random.RandomState(7).choice(6, 3, replace=False).tolist())
    assert sft_inspect.sample_ids(6, 10, 0) == [0, 1, 2, 3, 4, 5]
    views, _ = sft_inspect.views(pristine, "val", sample=1, seed=3)
    assert [v.episode for v in views] == sft_inspect.sample_ids(2, 1, 3)
    with pytest.raises(UsageError, match="--sample must be at least 1"):
        sft_inspect.sample_ids(6, 0, 0)


def test_episode_selection_errors(pristine, tmp_path):
    with pytest.raises(UsageError, match="exactly one of --episode, --row, --record or --sample"):
        sft_inspect.views(pristine, episodes=[0], sample=2)
    with pytest.raises(UsageError, match="exactly one of"):
        sft_inspect.views(pristine)
    with pytest.raises(DatasetError, match=r"episode 6 does not exist in split 'train', which has 6 episodes"):
        sft_inspect.views(pristine, episodes=[6])
    with pytest.raises(DatasetError, match="has no split 'test'"):
        sft_inspect.views(pristine, "test", episodes=[0])
    with pytest.raises(UsageError, match="--tokenizer is for older flat layouts"):
        sft_inspect.views(pristine, episodes=[0], tokenizer="cl100k_base")
    with pytest.raises(UsageError, match="--token-dtype is for older flat layouts"):
        sft_inspect.overview(pristine, token_dtype="uint16")


def test_flat_layout_episode_is_decoded_with_a_note(pristine, tmp_path):
    flat = to_flat(pristine, tmp_path / "flat")
    (v,), notes = sft_inspect.views(flat, episodes=[3])
    assert v.record is None and v.trained_tokens == int(per_episode_masks(pristine)[3].sum())
    assert notes == ["the dataset records no tokenizer: decoded with cl100k_base (pass --tokenizer to choose)"]
    with pytest.raises(DatasetError, match="no sources.idx"):
        sft_inspect.views(flat, record=0)
