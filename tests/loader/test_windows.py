"""Token windows (mode ``token_stream``): the window source, and ``split_corpus`` /
``WindowDataset`` for a corpus held in memory."""

import logging

import numpy as np
import pytest

from sftdata.errors import DatasetError, UsageError
from sftdata.loader import GPTDataLoader, Loader, LoaderConfig, WindowDataset, detect_mode, make_loader, split_corpus
from tests.helpers.loader import make_dataset, make_stream


# ---------------------------------------------------------------- split_corpus
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


# ---------------------------------------------------------------- WindowDataset
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


# ---------------------------------------------------------------- the window source
@pytest.fixture()
def stream_dir(tmp_path):
    return make_stream(tmp_path / "stream")


def test_token_stream_is_detected_without_episodes_idx(stream_dir):
    assert detect_mode(stream_dir) == "token_stream"
    loader = make_loader(LoaderConfig(batch_size=4, block_size=16), stream_dir, backend="numpy")
    assert loader.mode == "token_stream" and loader.sampling == "random"
    assert (loader.pad_id, loader.end_id, loader.vocab_size) == (None, None, None)  # a bare stream
    assert loader.num_items("train") == 5000 - 16 and loader.num_items("val") == 600 - 16
    x, y = loader.get_batch("train")
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == np.int64
    starts = np.random.default_rng([1337, 0]).integers(0, 5000 - 16, 4)
    assert x[:, 0].tolist() == starts.tolist() and loader.last_ids["train"].tolist() == starts.tolist()
    assert (x == starts[:, None] + np.arange(16)).all() and (y == x + 1).all()
    xv, _ = loader.get_batch("val")
    assert (xv >= 100000).all()


def test_windows_never_cross_shards(tmp_path):
    # an episode dataset read as a token stream: tokens of shard k are ep_tokens of its episodes
    p = make_dataset(tmp_path / "ds", [30] * 10, shard_tokens=60)  # 5 shards of 60 tokens
    loader = make_loader(LoaderConfig(dataset_mode="token_stream", batch_size=16, block_size=40), p,
                         backend="numpy")
    arrs = loader.source.arrays["train"]
    assert len(arrs) == 5 and loader.num_items("train") == 5 * 20
    assert loader.vocab_size == 1 << 30  # the tokenizer state of the prepared dataset
    for step in range(20):
        shard, start = loader.source.locate("train", loader.batch_ids("train", step))
        assert (start + 40 < 60).all()  # the window's targets stay inside the shard
        x, y = loader.batch_at("train", step)
        for row, (si, s) in enumerate(zip(shard, start)):
            assert x[row].tolist() == arrs[si][s:s + 40].tolist()
            assert y[row].tolist() == arrs[si][s + 1:s + 41].tolist()


def test_token_stream_from_arrays_and_errors(stream_dir):
    assert GPTDataLoader is Loader  # the name the specification's scripts use
    loader = GPTDataLoader(LoaderConfig(batch_size=2, block_size=4), {"train": [np.arange(10)]})
    x, y = loader.get_batch()
    assert (y == x + 1).all()
    with pytest.raises(DatasetError, match="split 'train' has no run of block_size \\+ 1 = 11 tokens; lower "
                                           "block_size"):
        GPTDataLoader(LoaderConfig(batch_size=2, block_size=10), {"train": [np.arange(10)]})
    with pytest.raises(DatasetError, match=r"no split 'test' \(splits: train\)"):
        loader.get_batch("test")
    empty = stream_dir.parent / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="has no tokens for split 'train'"):
        make_loader(LoaderConfig(), empty, backend="numpy")


def test_settings_without_effect_on_windows_are_noted_once(stream_dir, caplog):
    with caplog.at_level(logging.INFO, logger="sftdata.loader"):
        make_loader(LoaderConfig(batch_size=2, block_size=4, use_loss_mask=True, batch_sampling_mode="epoch"),
                    stream_dir, backend="numpy")
    notes = [(r.levelno, r.getMessage()) for r in caplog.records if "init" not in r.getMessage()]
    assert notes == [(logging.WARNING, "[TokenStreamLoader] use_loss_mask=true has no effect in token_stream mode "
                                       "(no episodes, no mask); batches are (x, y)"),
                     (logging.INFO, "[TokenStreamLoader] batch_sampling_mode=epoch applies to sft_episode "
                                    "datasets; token_stream samples random windows")]
    inits = [r.getMessage() for r in caplog.records if "init" in r.getMessage()]
    assert inits == [f"[TokenStreamLoader] init dataset={stream_dir} split=train tokens=5000 shards=1 windows=4996 "
                     f"block_size=4 batch_size=2 world_size=1",
                     f"[TokenStreamLoader] init dataset={stream_dir} split=val tokens=600 shards=1 windows=596 "
                     f"block_size=4 batch_size=2 world_size=1"]
