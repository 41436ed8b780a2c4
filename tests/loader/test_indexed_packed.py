"""The packed-row source: exact batches (tokens, mask, position_ids, seq_ids) in seeded
epoch order, one pass, padding rows, the in-segment mask, and the config it refuses."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from sftdata.errors import ConfigError
from sftdata.loader import make_loader
from sftdata.order.config import LoaderConfig
from sftdata.packing import row_layout
from sftdata.packing.attention import block_causal_mask
from sftdata.store import open_dataset, split_segments
from tests.helpers.loader import PACKED_BLOCK, make_packed

BLOCK = PACKED_BLOCK


@pytest.fixture(scope="module")
def packed(source, tmp_path_factory):  # noqa: F811
    return make_packed(source, tmp_path_factory.mktemp("packed") / "p")


def cfg(**kw):
    base = dict(batch_size=4, block_size=BLOCK, use_loss_mask=True, epoch_seed=7)
    return LoaderConfig(**{**base, **kw})


def rows_of(path, split="train"):
    sp = open_dataset(path).split(split)
    L = BLOCK + 1
    toks = np.concatenate([np.asarray(s.tokens) for s in sp.shards]).reshape(-1, L).astype(np.int64)
    mask = np.concatenate([np.asarray(s.mask) for s in sp.shards]).reshape(-1, L)
    seg = split_segments(sp)
    seq, pos = row_layout(seg.row, seg.offset, seg.length, toks.shape[0], L)
    return toks, mask, seq, pos


def test_make_loader_recognises_packed_datasets_and_batches_are_exact(packed):
    loader = make_loader(cfg(), packed, backend="numpy")
    assert loader.mode == "packed" and loader.end_id is None
    assert loader.pad_id == open_dataset(packed).packing["pad_token_id"]
    toks, mask, seq, pos = rows_of(packed)
    n = toks.shape[0]
    assert loader.num_items("train") == n
    order = np.random.RandomState(7 + 0).permutation(n)
    assert loader.steps_total() == n // 4 and len(split_segments(open_dataset(packed).split("train")).row) > n
    for step in range(loader.steps_total()):
        b = loader.get_batch("train")
        rows = order[step * 4:(step + 1) * 4]
        np.testing.assert_array_equal(loader.last_ids["train"], rows)
        assert list(b.as_dict()) == ["x", "y", "mask", "position_ids", "seq_ids"]
        for name, arr in b.as_dict().items():
            assert arr.shape == (4, BLOCK), name
            assert arr.dtype == (np.float32 if name == "mask" else np.int64), name
        np.testing.assert_array_equal(b.x, toks[rows, :-1])
        np.testing.assert_array_equal(b.y, toks[rows, 1:])
        np.testing.assert_array_equal(b.mask, mask[rows, 1:].astype(np.float32))
        np.testing.assert_array_equal(b.position_ids, pos[rows, :-1])
        np.testing.assert_array_equal(b.seq_ids, seq[rows, :-1])
        # no trained target crosses a segment boundary or lands on padding
        crossing = np.concatenate([seq[rows, 1:] != seq[rows, :-1]], axis=0)
        assert not (b.mask.astype(bool) & crossing).any()
        assert np.isfinite(block_causal_mask(b.seq_ids)).any(axis=-1).all()


def test_loader_ends_after_one_pass(packed, caplog):
    with caplog.at_level(logging.INFO, logger="sftdata.loader"):
        loader = make_loader(cfg(epoch_drop_last=False, batch_size=5), packed, backend="numpy")
        n = open_dataset(packed).split("train").num_rows
        total = -(-n // 5)
        assert loader.steps_total() == total
        batches = list(loader)
    assert len(batches) == total and loader.step() == total
    with pytest.raises(StopIteration, match=f"is done: {total} batches, one pass"):
        loader.get_batch("train")
    with pytest.raises(StopIteration):
        loader.get_batch("train")
    assert list(loader) == []
    # every row exactly once; the last batch is completed with padding rows
    seen = np.concatenate([b.x for b in batches])
    toks, _, _, _ = rows_of(packed)
    order = np.random.RandomState(7).permutation(n)
    np.testing.assert_array_equal(seen[:n], toks[order, :-1])
    pad = open_dataset(packed).packing["pad_token_id"]
    last = batches[-1]
    k = n - (total - 1) * 5
    assert k < 5, "the fixture must leave a partial last batch"
    assert (last.x[k:] == pad).all() and (last.mask[k:] == 0).all() and (last.seq_ids[k:] == -1).all()
    assert (last.position_ids[k:] == 0).all()
    assert loader.last_ids["train"].tolist() == order[(total - 1) * 5:].tolist() + [-1] * (5 - k)
    msgs = [r.getMessage() for r in caplog.records if "split=train" in r.getMessage() and " init " not in
            r.getMessage()]
    assert msgs == [f"[PackedLoader] split=train epoch=0 rows={n} batches={total} shuffle=true drop_last=false "
                    f"rows_not_trained=0",
                    f"[PackedLoader] split=train end of data after {total} batches (one pass)"]


def test_without_loss_mask_every_in_segment_target_is_trained(packed):
    loader = make_loader(cfg(use_loss_mask=False), packed, backend="numpy")
    b = loader.get_batch()
    _, _, seq, _ = rows_of(packed)
    rows = loader.last_ids["train"]
    want = (seq[rows, 1:] == seq[rows, :-1]) & (seq[rows, 1:] != -1)
    np.testing.assert_array_equal(b.mask, want.astype(np.float32))


@pytest.mark.parametrize("kw, match", [
    (dict(block_size=64), "was packed with block_size 63, but the config says block_size 64"),
    (dict(pad_token_id=0), "was packed with pad id 100257, but the config says pad_token_id 0"),
    (dict(batch_sampling_mode="random"), "read once in epoch order .* batch_sampling_mode='random' is not supported"),
    (dict(batch_size=10_000), "fewer than one global batch"),
])
def test_packed_loader_config_errors(packed, kw, match):
    with pytest.raises(ConfigError, match=match):
        make_loader(cfg(**kw), packed, backend="numpy")
