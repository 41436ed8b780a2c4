"""The packed loader: fixed-shape PackedBatch, seeded epoch order, one pass, resume,
ranks, replay-order on packed datasets."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from test_pack import source  # noqa: F401  (module fixture: a prepared dataset)
from typer.testing import CliRunner

from sftdata.attention import block_causal_mask
from sftdata.cli import app
from sftdata.config import LoaderConfig
from sftdata.errors import ConfigError, UsageError
from sftdata.loader import make_loader
from sftdata.pack import PackOptions, pack
from sftdata.packed_loader import PackedBatch, PackedDataLoader
from sftdata.packing import row_layout
from sftdata.replay import replay_order
from sftdata.store import open_dataset, split_segments

BLOCK = 63


@pytest.fixture(scope="module")
def packed(source, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("packed") / "p"
    pack(source, out, PackOptions(block_size=BLOCK, shard_tokens=20 * (BLOCK + 1)))
    return out


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
    assert isinstance(loader, PackedDataLoader)
    toks, mask, seq, pos = rows_of(packed)
    n = toks.shape[0]
    order = np.random.RandomState(7 + 0).permutation(n)
    assert loader.steps_total() == n // 4 and len(split_segments(open_dataset(packed).split("train")).row) > n
    for step in range(loader.steps_total()):
        b = loader.get_batch("train")
        assert isinstance(b, PackedBatch)
        rows = order[step * 4:(step + 1) * 4]
        np.testing.assert_array_equal(loader.last_ids["train"], rows)
        for name, arr in b._asdict().items():
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


def test_loader_ends_after_one_pass(packed):
    loader = make_loader(cfg(epoch_drop_last=False, batch_size=5), packed, backend="numpy")
    n = open_dataset(packed).split("train").num_episodes
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


def test_iterable_gives_the_same_batches_and_ends(packed):
    a = make_loader(cfg(), packed, backend="numpy")
    b = make_loader(cfg(), packed, backend="numpy")
    got = list(a.iterable("train"))
    assert len(got) == a.steps_total()
    for _i, batch in enumerate(got):
        ref = b.get_batch("train")
        for x, y in zip(batch, ref):
            np.testing.assert_array_equal(x, y)
    assert len(list(a.iterable("train", start_step=a.steps_total() - 2))) == 2
    assert len(list(a.iterable("train", start_step=1, num_steps=2))) == 2


def test_state_dict_resumes_exactly(packed):
    a = make_loader(cfg(), packed, backend="numpy")
    for _ in range(3):
        a.get_batch("train")
    state = orjson.loads(orjson.dumps(a.state_dict()))
    b = make_loader(cfg(), packed, backend="numpy")
    b.load_state_dict(state)
    assert b.step() == 3
    for x, y in zip(a.get_batch("train"), b.get_batch("train")):
        np.testing.assert_array_equal(x, y)
    c = make_loader(cfg(epoch_seed=8), packed, backend="numpy")
    with pytest.raises(ConfigError, match="cannot resume: .*epoch_seed: saved 7, now 8"):
        c.load_state_dict(state)


def test_ranks_split_the_global_batch(packed):
    one = make_loader(cfg(batch_size=4), packed, backend="numpy", rank=0, world_size=1)
    r0 = make_loader(cfg(batch_size=2), packed, backend="numpy", rank=0, world_size=2)
    r1 = make_loader(cfg(batch_size=2), packed, backend="numpy", rank=1, world_size=2)
    assert one.steps_total() == r0.steps_total() == r1.steps_total()
    for _ in range(one.steps_total()):
        full, b0, b1 = one.get_batch(), r0.get_batch(), r1.get_batch()
        for f, x0, x1 in zip(full, b0, b1):
            np.testing.assert_array_equal(f, np.concatenate([x0, x1]))


def test_without_loss_mask_every_in_segment_target_is_trained(packed):
    loader = make_loader(cfg(use_loss_mask=False), packed, backend="numpy")
    b = loader.get_batch()
    _, _, seq, _ = rows_of(packed)
    rows = loader.last_ids["train"]
    want = (seq[rows, 1:] == seq[rows, :-1]) & (seq[rows, 1:] != -1)
    np.testing.assert_array_equal(b.mask, want.astype(np.float32))


def test_torch_backend(packed):
    torch = pytest.importorskip("torch")
    b = make_loader(cfg(), packed, backend="torch").get_batch()
    assert isinstance(b, PackedBatch) and all(isinstance(t, torch.Tensor) for t in b)
    assert [t.dtype for t in b] == [torch.int64, torch.int64, torch.float32, torch.int64, torch.int64]
    ref = make_loader(cfg(), packed, backend="numpy").get_batch()
    for t, a in zip(b, ref):
        np.testing.assert_array_equal(t.numpy(), a)


@pytest.mark.parametrize("kw, match", [
    (dict(block_size=64), "was packed with block_size 63, but the config says block_size 64"),
    (dict(pad_token_id=0), "was packed with pad id 100257, but the config says pad_token_id 0"),
    (dict(batch_sampling_mode="random"), "read once in epoch order .* batch_sampling_mode='random' is not supported"),
    (dict(batch_size=10_000), "fewer than one global batch"),
])
def test_packed_loader_config_errors(packed, kw, match):
    with pytest.raises(ConfigError, match=match):
        make_loader(cfg(**kw), packed, backend="numpy")


def test_replay_order_lists_the_episodes_and_records_of_each_row(packed, source):  # noqa: F811
    loader = make_loader(cfg(), packed, backend="numpy")
    for _ in range(3):
        loader.get_batch()
    rows = loader.last_ids["train"]
    r = replay_order(packed, cfg(), step=2)
    seg = split_segments(open_dataset(packed).split("train"))
    want = seg.of_rows(rows)
    assert r.columns["row"].tolist() == want.row.tolist()
    assert r.columns["episode"].tolist() == want.episode.tolist()
    src = open_dataset(source).split("train").sources
    assert r.columns["record"].tolist() == src[want.episode].tolist()
    slot_of_row = {int(v): i for i, v in enumerate(rows)}
    assert r.columns["slot"].tolist() == [slot_of_row[v] for v in want.row.tolist()]
    assert set(r.columns["step"].tolist()) == {2}
    within = [int(np.sum(want.row[:j] == want.row[j])) for j in range(want.row.size)]
    assert r.columns["segment"].tolist() == within
    assert r.columns["length"].tolist() == want.length.tolist()
    whole = replay_order(packed, cfg())
    assert sorted(whole.columns["episode"].tolist()) == sorted(seg.episode.tolist())
    with pytest.raises(UsageError, match="one pass .epoch 0.; there is no epoch 1"):
        replay_order(packed, cfg(), epoch=1)
    with pytest.raises(UsageError, match=r"step 999 is outside the one pass over the rows \(steps 0..\d+\)"):
        replay_order(packed, cfg(), step=999)


def test_replay_order_cli_on_a_packed_dataset(packed):
    res = CliRunner().invoke(app, ["replay-order", str(packed), "--step", "1", "--batch-size", "4", "--seed", "7",
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = orjson.loads(res.stdout)
    loader = make_loader(cfg(), packed, backend="numpy")
    loader.get_batch()
    loader.get_batch()
    assert sorted({row["row"] for row in out["rows"]}) == sorted(loader.last_ids["train"].tolist())
    assert {"episode", "record", "segment", "episode_start", "length", "prefix"} <= set(out["rows"][0])


def test_audit_log_of_a_packed_run_checks_against_the_replay(packed, tmp_path):
    loader = make_loader(cfg(), packed, backend="numpy", audit_dir=tmp_path)
    list(loader)
    (log,) = tmp_path.glob("audit_*.log")
    text = log.read_text()
    assert "action=dataset_load" in text and "dataset_mode=packed" in text
    assert text.count("action=epoch_start") == 1 and text.count("action=epoch_complete") == 1
    res = CliRunner().invoke(app, ["replay-order", str(packed), "--seed", "7", "--batch-size", "4",
                                   "--check-audit", str(log)])
    assert res.exit_code == 0 and "match the replay" in " ".join(res.output.split())
