"""Token-stream mode: seed 004's split_corpus / WindowDataset scenarios and GPTDataLoader."""

import json

import numpy as np
import pytest
from loader_util import make_dataset

from sftdata.errors import ConfigError, DatasetError, UsageError
from sftdata.loader import GPTDataLoader, LoaderConfig, WindowDataset, detect_mode, make_loader, split_corpus


# ---------------------------------------------------------------- seed 004: Corpus Train/Val Split
def test_split_corpus_is_contiguous_with_the_requested_ratio():
    tokens = np.arange(1000, dtype=np.uint16)
    train, val = split_corpus(tokens, 0.05, seed=1337)
    assert (len(train), len(val)) == (950, 50)  # 95% / 5%
    assert train.tolist() == list(range(950)) and val.tolist() == list(range(950, 1000))
    assert np.shares_memory(train, tokens)  # views, no copy


def test_split_corpus_custom_ratio():
    train, val = split_corpus(np.arange(1000), 0.1, seed=0)
    assert (len(train), len(val)) == (900, 100) and val[0] == 900
    train, val = split_corpus(np.arange(7), 0.5)
    assert (len(train), len(val)) == (3, 4)  # round(3.5) = 4 (half up)
    train, val = split_corpus(np.arange(10), 0.0)
    assert (len(train), len(val)) == (10, 0)


def test_split_corpus_is_deterministic_and_the_seed_never_moves_the_boundary():
    tokens = np.random.default_rng(0).integers(0, 50000, 12345)
    a = split_corpus(tokens, 0.1, seed=7)
    b = split_corpus(tokens, 0.1, seed=7)
    c = split_corpus(tokens, 0.1, seed=8)
    assert a[0].tolist() == b[0].tolist() == c[0].tolist() and a[1].tolist() == b[1].tolist() == c[1].tolist()
    assert len(a[1]) == 1235 and a[1].tolist() == tokens[-1235:].tolist()  # round(1234.5) half up


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, "0.1"])
def test_split_corpus_bad_ratio(ratio):
    with pytest.raises(UsageError, match=r"val_ratio must be a fraction in \[0, 1\)"):
        split_corpus(np.arange(10), ratio)


def test_split_corpus_needs_1d():
    with pytest.raises(UsageError, match="1-D token array"):
        split_corpus(np.zeros((2, 2)), 0.1)


# ---------------------------------------------------------------- seed 004: Sequence Windowing
def test_windows_have_context_length_shape():
    ds = WindowDataset(np.arange(1000))
    x, y = ds[0]
    assert x.shape == (256,) and y.shape == (256,) and x.dtype == np.int64


def test_windows_are_non_overlapping_with_stride_256():
    tokens = np.arange(2000) * 3
    ds = WindowDataset(tokens, context_length=256)
    for i in range(len(ds)):
        assert ds[i][0].tolist() == tokens[i * 256:(i + 1) * 256].tolist()
    xs = np.concatenate([ds[i][0] for i in range(len(ds))])
    assert xs.tolist() == tokens[:len(ds) * 256].tolist()  # each token in exactly one window
    assert len(set(xs.tolist())) == len(xs)


def test_y_is_x_shifted_by_one():
    tokens = np.random.default_rng(1).integers(0, 100, 1000)
    ds = WindowDataset(tokens)
    for i in range(len(ds)):
        x, y = ds[i]
        assert (y[:-1] == x[1:]).all() and y[-1] == tokens[(i + 1) * 256]


def test_incomplete_last_window_is_dropped():
    assert len(WindowDataset(np.arange(1000))) == 3  # 999 // 256
    assert len(WindowDataset(np.arange(769))) == 3  # 3 * 256 + 1: exactly three windows with targets
    assert len(WindowDataset(np.arange(768))) == 2  # the third window would lack its last target
    assert all(len(x) == 256 for x, _ in WindowDataset(np.arange(1000)))


def test_iteration_yields_valid_pairs():
    pairs = list(WindowDataset(np.arange(1100), context_length=256))
    assert len(pairs) == 4 and all((y == x + 1).all() for x, y in pairs)


@pytest.mark.parametrize("n", [0, 1, 100, 255, 256])
def test_small_corpus_is_empty(n):
    ds = WindowDataset(np.arange(n))
    assert len(ds) == 0 and list(ds) == []
    with pytest.raises(IndexError, match="out of range"):
        ds[0]


def test_window_indexing_and_errors():
    ds = WindowDataset(np.arange(600), context_length=100)
    assert len(ds) == 5 and ds[-1][0][0] == 400
    with pytest.raises(IndexError, match=r"window 5 out of range \(the dataset has 5 windows\)"):
        ds[5]
    with pytest.raises(UsageError, match="context_length must be an integer >= 1"):
        WindowDataset(np.arange(10), context_length=0)
    with pytest.raises(UsageError, match="1-D token array"):
        WindowDataset(np.zeros((3, 3)))


# ---------------------------------------------------------------- GPTDataLoader
@pytest.fixture()
def stream_dir(tmp_path):
    d = tmp_path / "stream"
    for split, n in (("train", 5000), ("val", 600)):
        (d / split).mkdir(parents=True)
        (np.arange(n, dtype="<u4") + (0 if split == "train" else 100000)).tofile(d / split / "tokens.bin")
    return d


def test_token_stream_is_detected_without_episodes_idx(stream_dir):
    assert detect_mode(stream_dir) == "token_stream"
    loader = make_loader(LoaderConfig(batch_size=4, block_size=16), stream_dir, backend="numpy")
    assert isinstance(loader, GPTDataLoader)
    x, y = loader.get_batch("train")
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == np.int64
    starts = np.random.default_rng([1337, 0]).integers(0, 5000 - 16, 4)
    assert x[:, 0].tolist() == starts.tolist()
    assert (x == starts[:, None] + np.arange(16)).all() and (y == x + 1).all()
    xv, _ = loader.get_batch("val")
    assert (xv >= 100000).all()


def test_token_stream_is_reproducible_resumable_and_partitioned(stream_dir):
    def mk(**kw):
        opts = {k: kw.pop(k) for k in ("rank", "world_size") if k in kw}
        return make_loader(LoaderConfig(**{"block_size": 8, **kw}), stream_dir, backend="numpy", **opts)

    a, b = mk(batch_size=4), mk(batch_size=4)
    ref = [a.get_batch("train")[0] for _ in range(6)]
    assert all(r.tolist() == b.get_batch("train")[0].tolist() for r in ref)
    r0, r1 = mk(batch_size=2, rank=0, world_size=2), mk(batch_size=2, rank=1, world_size=2)
    for r in ref:
        assert np.concatenate([r0.get_batch("train")[0], r1.get_batch("train")[0]]).tolist() == r.tolist()
    c = mk(batch_size=4)
    for _ in range(2):
        c.get_batch("train")
    d = mk(batch_size=4)
    d.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert [d.get_batch("train")[0].tolist() for _ in range(4)] == [r.tolist() for r in ref[2:]]
    with pytest.raises(ConfigError, match="block_size: saved 8, now 9"):
        make_loader(LoaderConfig(batch_size=4, block_size=9), stream_dir, backend="numpy").load_state_dict(
            c.state_dict())


def test_windows_never_cross_shards(tmp_path):
    # an episode dataset read as a token stream: tokens of shard k are ep_tokens of its episodes
    p = make_dataset(tmp_path / "ds", [30] * 10, shard_tokens=60)  # 5 shards of 60 tokens
    loader = make_loader(LoaderConfig(dataset_mode="token_stream", batch_size=16, block_size=40), p,
                         backend="numpy")
    arrs = loader.arrays["train"]
    assert len(arrs) == 5
    for step in range(20):
        shard, start = loader.window_starts("train", step)
        assert (start + 40 < 60).all()  # the window's targets stay inside the shard
        x, y = loader.batch_at("train", step)
        for row, (si, s) in enumerate(zip(shard, start)):
            assert x[row].tolist() == arrs[si][s:s + 40].tolist()
            assert y[row].tolist() == arrs[si][s + 1:s + 41].tolist()


def test_token_stream_from_arrays_and_errors(stream_dir, caplog):
    loader = GPTDataLoader(LoaderConfig(batch_size=2, block_size=4), {"train": [np.arange(10)]})
    x, y = loader.get_batch()
    assert (y == x + 1).all()
    with pytest.raises(DatasetError, match="no run of block_size \\+ 1 = 11 tokens"):
        GPTDataLoader(LoaderConfig(batch_size=2, block_size=10), {"train": [np.arange(10)]})
    with pytest.raises(DatasetError, match=r"no split 'test'"):
        loader.get_batch("test")
    empty = tmp = stream_dir.parent / "empty"
    tmp.mkdir()
    with pytest.raises(DatasetError, match="has no tokens for split 'train'"):
        make_loader(LoaderConfig(), empty, backend="numpy")
    with caplog.at_level("WARNING", logger="sftdata.loader"):
        make_loader(LoaderConfig(batch_size=2, block_size=4, use_loss_mask=True), stream_dir, backend="numpy")
    assert any("no effect in token_stream mode" in r.getMessage() for r in caplog.records)
