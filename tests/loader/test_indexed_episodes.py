"""The episode source: one episode per row (padding, cut, mask alignment), the epoch and
random orders over eligible episodes, pad ids, layouts, and masks of a prepared dataset."""

import json
import logging
import types

import numpy as np
import pytest

from sftdata.chat.masking import loss_mask
from sftdata.chat.tokenizer import load_tokenizer
from sftdata.errors import ConfigError, DatasetError
from sftdata.loader import LoaderConfig, detect_mode, episode_batch, make_loader
from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.loader import EOS, ep_mask, ep_tokens, make_dataset, make_flat

LENGTHS = [3, 5, 1, 12, 4, 7, 2, 9, 6, 10, 3, 8]  # episode 2 (1 token) is below episode_min_tokens=2


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    # shard_tokens=15 -> several shards, so global ids cross shard boundaries
    return make_dataset(tmp_path_factory.mktemp("d") / "ds", LENGTHS, shard_tokens=15, val_lengths=[4, 4, 6, 2])


def load(ds, **kw):
    return make_loader(LoaderConfig(**{"batch_size": 3, "block_size": 6, **kw}), ds, backend="numpy")


def expected_row(gid, block):
    """x, y, mask of episode ``gid`` by the padding rule, written out plainly."""
    L = block + 1
    t = ep_tokens(gid, LENGTHS[gid])[:L]
    m = ep_mask(gid, LENGTHS[gid])[:L].astype(np.float32)
    t = np.concatenate([t, np.full(L - len(t), EOS)])
    m = np.concatenate([m, np.zeros(L - len(m), np.float32)])
    return t[:-1], t[1:], m[1:]


def test_dataset_has_several_shards(ds):
    loader = load(ds)
    assert loader.mode == "sft_episode" and detect_mode(ds) == "sft_episode"
    assert len(loader.source.ds.split("train").shards) >= 4


def test_padding_truncation_and_mask_alignment(ds):
    loader = load(ds, use_loss_mask=True, block_size=6)
    x, y, m = loader.batch_at("train", 0)
    ids = loader.batch_ids("train", 0)
    assert x.shape == y.shape == m.shape == (3, 6)
    assert (x.dtype, y.dtype, m.dtype) == (np.int64, np.int64, np.float32)
    for row, gid in enumerate(ids):
        ex, ey, em = expected_row(gid, 6)
        assert x[row].tolist() == ex.tolist() and y[row].tolist() == ey.tolist() and m[row].tolist() == em.tolist()


def test_padding_exact_values():
    sh = types.SimpleNamespace(tokens=np.array([11, 12, 13, 21, 22, 23, 24, 25, 26, 27, 28], np.uint16),
                               mask=np.array([0, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1], np.uint8))
    sp = types.SimpleNamespace(shards=[sh], starts=np.array([0, 3]), lengths=np.array([3, 8]),
                               shard_of=lambda ids: np.zeros(len(ids), np.int64))
    x, y, m = episode_batch(sp, np.array([0, 1]), block_size=4, pad_id=99, with_mask=True)
    # episode 0 (3 tokens) is padded to L = 5: 11 12 13 99 99
    assert x[0].tolist() == [11, 12, 13, 99] and y[0].tolist() == [12, 13, 99, 99]
    assert m[0].tolist() == [1, 1, 0, 0]  # m[1:3] then 0 on padding
    # episode 1 (8 tokens) is cut to L = 5: 21 22 23 24 25
    assert x[1].tolist() == [21, 22, 23, 24] and y[1].tolist() == [22, 23, 24, 25]
    assert m[1].tolist() == [0, 1, 1, 0]  # = mask[1:5] of the episode
    x1, y1 = episode_batch(sp, np.array([1]), block_size=7, pad_id=99, with_mask=False)
    assert x1[0].tolist() == [21, 22, 23, 24, 25, 26, 27] and y1[0].tolist() == [22, 23, 24, 25, 26, 27, 28]


def test_episode_of_exactly_block_plus_one_tokens(ds):
    loader = load(ds, block_size=8, use_loss_mask=True)  # episode 7 has 9 = block + 1 tokens
    x, y, m = expected_row(7, 8)
    assert EOS not in x.tolist() + y.tolist()
    bx, by, bm = episode_batch(loader.source.ds.split("train"), np.array([7]), 8, EOS, True)
    assert bx[0].tolist() == x.tolist() and by[0].tolist() == y.tolist() and bm[0].tolist() == m.tolist()


def test_rows_never_cross_episodes(ds):
    loader = load(ds, block_size=16)
    for step in range(8):
        x, y = loader.batch_at("train", step)
        for row, gid in zip(x, loader.batch_ids("train", step)):
            real = row[row != EOS]
            assert (real // 1000 == gid).all()


def test_order_equals_randomstate_permutation_when_nothing_filtered(tmp_path):
    n = 20
    p = make_dataset(tmp_path / "ds", [4] * n, shard_tokens=17)
    loader = make_loader(LoaderConfig(batch_size=3, block_size=4, epoch_seed=42, epoch_drop_last=False), p,
                         backend="numpy")
    seen = []
    for _ in range(14):  # 42 rows = 2 epochs + 2
        loader.get_batch("train")
        seen += loader.last_ids["train"].tolist()
    assert seen[:n] == np.random.RandomState(42).permutation(n).tolist()
    assert seen[n:2 * n] == np.random.RandomState(43).permutation(n).tolist()
    assert seen[2 * n:] == np.random.RandomState(44).permutation(n)[:2].tolist()


def test_epoch_determinism(ds):
    a, b, c = load(ds, epoch_seed=5), load(ds, epoch_seed=5), load(ds, epoch_seed=6)
    ra = [a.get_batch("train")[0].tolist() for _ in range(10)]
    rb = [b.get_batch("train")[0].tolist() for _ in range(10)]
    rc = [c.get_batch("train")[0].tolist() for _ in range(10)]
    assert ra == rb and ra != rc


@pytest.mark.parametrize("bs", [1, 3, 5, 11, 13])
def test_coverage_without_drop_last_every_episode_once_per_epoch(ds, bs):
    loader = load(ds, batch_size=bs, epoch_drop_last=False)
    eligible = [g for g, n in enumerate(LENGTHS) if n >= 2]
    n = len(eligible)
    stream = []
    while len(stream) < 3 * n:
        x, y = loader.get_batch("train")
        assert x.shape == (bs, 6)  # shapes stay fixed, also for the batch at an epoch's end
        stream += loader.last_ids["train"].tolist()
    for e in range(3):
        assert sorted(stream[e * n:(e + 1) * n]) == eligible


def test_drop_last_skips_the_tail_and_short_episodes(ds):
    loader = load(ds, batch_size=4, epoch_drop_last=True)
    order = loader.order("train")
    assert order.n == 11 and order.batches_in_epoch(0) == 2 and loader.num_items("train") == 11
    got = [loader.get_batch("train") and loader.last_ids["train"].tolist() for _ in range(3)]
    assert got[0] + got[1] == order.epoch_order(0)[:8].tolist()
    assert got[2] == order.epoch_order(1)[:4].tolist()
    assert 2 not in sum(got, [])


def test_min_tokens_filter(ds):
    loader = load(ds, episode_min_tokens=8, batch_size=2, epoch_drop_last=False)
    ids = np.concatenate([loader.batch_ids("train", s) for s in range(10)])
    assert set(ids.tolist()) == {3, 7, 9, 11}


def test_random_mode_is_reproducible_and_uniform_over_eligible(ds):
    a = load(ds, batch_sampling_mode="random", epoch_seed=3)
    b = load(ds, batch_sampling_mode="random", epoch_seed=3)
    eligible = np.array([g for g, n in enumerate(LENGTHS) if n >= 2])
    assert a.steps_total("train") is None
    for step in range(5):
        xa, _ = a.get_batch("train")
        xb, _ = b.get_batch("train")
        assert xa.tolist() == xb.tolist()
        draws = np.random.default_rng([3, step]).integers(0, len(eligible), 3)
        assert a.last_ids["train"].tolist() == eligible[draws].tolist()


def test_without_mask_file_batches_are_xy_with_one_warning(tmp_path, caplog):
    p = make_flat(tmp_path / "flat", LENGTHS, mask=None)
    with caplog.at_level(logging.WARNING, logger="sftdata.loader"):
        loader = make_loader(LoaderConfig(batch_size=2, block_size=4, use_loss_mask=True, pad_token_id=0), p,
                             backend="numpy")
        batches = [loader.get_batch("train") for _ in range(3)]
    assert all(len(b) == 2 and b.mask is None for b in batches)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"[EpisodeLoader] use_loss_mask=true but split=train of {p} has no mask file; batches "
                        f"are (x, y) and every target is trained"]


def test_use_loss_mask_false_gives_xy(ds):
    b = load(ds, use_loss_mask=False).get_batch("train")
    assert len(b) == 2 and b.mask is None


def test_flat_layout_float32_mask_and_explicit_pad(tmp_path):
    p = make_flat(tmp_path / "flat", LENGTHS, mask="float32")
    with pytest.raises(ConfigError, match="pad_token_id is not set .*set pad_token_id in the config"):
        make_loader(LoaderConfig(batch_size=2, block_size=6), p, backend="numpy")
    loader = make_loader(LoaderConfig(batch_size=2, block_size=6, use_loss_mask=True, pad_token_id=0), p,
                         backend="numpy")
    ds = loader.source.ds
    assert ds.layout == "flat" and ds.split("train").shards[0].mask_dtype == np.float32
    assert (loader.vocab_size, loader.end_id) == (None, 0)  # no tokenizer state: the pad id ends an episode
    x, y, m = loader.batch_at("train", 0)
    for row, gid in enumerate(loader.batch_ids("train", 0)):
        _, _, em = expected_row(gid, 6)
        assert m[row].tolist() == em.tolist()
        ex = np.concatenate([ep_tokens(gid, LENGTHS[gid])[:7], np.zeros(7, np.int64)])[:7]
        assert x[row].tolist() == ex[:-1].tolist() and y[row].tolist() == ex[1:].tolist()


def test_pad_default_is_eos_and_can_be_set(ds):
    default = load(ds)
    assert default.pad_id == EOS and default.end_id == EOS
    loader = load(ds, pad_token_id=9, block_size=16)
    assert loader.end_id == EOS  # rows are padded with 9, but an episode still ends with its EOS
    x, _ = loader.batch_at("train", 0)
    assert (x == 9).any() and not (x == EOS).any()


def test_pad_outside_the_vocabulary_or_the_token_dtype_is_refused(tmp_path, ds):
    with pytest.raises(ConfigError, match=r"pad_token_id 1073741824 is outside the tokenizer's vocabulary "
                                          r"\(0..1073741823\)"):
        load(ds, pad_token_id=1 << 30)
    p = make_flat(tmp_path / "flat", LENGTHS, mask=None)  # uint32 tokens, read as uint16 here
    with pytest.raises(ConfigError, match="does not fit the dataset's uint16 tokens"):
        make_loader(LoaderConfig(pad_token_id=70000, token_dtype="uint16"), p, backend="numpy")


def test_val_split_and_missing_split(tmp_path, ds):
    loader = load(ds, batch_size=2)
    x, _ = loader.get_batch("val")
    assert loader.step("val") == 1 and loader.step("train") == 0
    assert loader.last_ids["val"].tolist() == np.random.RandomState(1337).permutation(4)[:2].tolist()
    only_train = make_dataset(tmp_path / "t", [4, 4, 4])
    with pytest.raises(DatasetError, match="has no split 'val'"):
        make_loader(LoaderConfig(batch_size=2, block_size=4), only_train, backend="numpy").get_batch("val")


def test_too_small_for_a_batch_with_drop_last(tmp_path):
    p = make_dataset(tmp_path / "small", [4, 4, 4])
    with pytest.raises(ConfigError, match=r"3 eligible items, fewer than one global batch of 4"):
        make_loader(LoaderConfig(batch_size=4, block_size=4), p, backend="numpy")
    loader = make_loader(LoaderConfig(batch_size=4, block_size=4, epoch_drop_last=False), p, backend="numpy")
    assert sorted(loader.batch_ids("train", 0).tolist()[:3]) == [0, 1, 2]


def test_an_empty_split_has_no_items_and_no_order(tmp_path):
    p = make_dataset(tmp_path / "ds", [4, 4, 4], val_lengths=[1])  # the one val episode is too short
    loader = make_loader(LoaderConfig(batch_size=2, block_size=4), p, backend="numpy")
    assert loader.num_items("val") == 0
    with pytest.raises(ConfigError, match="split 'val' of .* has no eligible item to train on"):
        loader.get_batch("val")


def test_masks_of_a_prepared_chat_dataset_follow_the_mask_rule(tmp_path):
    lines = []
    for i in range(6):
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i}+{i}?"},
                {"role": "assistant", "content": f"It is {2 * i}."}]
        if i % 2:
            msgs += [{"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "You are welcome."}]
        lines.append(json.dumps({"messages": msgs}))
    src = tmp_path / "chats.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "chat_sft"
    prepare([src], out, PrepareOptions(mode="chat"))
    tok = load_tokenizer()
    loader = make_loader(LoaderConfig(batch_size=2, block_size=24, use_loss_mask=True, epoch_drop_last=False),
                         out, backend="numpy")
    assert loader.pad_id == loader.end_id == tok.eos_id and loader.vocab_size == tok.vocab_size
    sp = loader.source.ds.split("train")
    whole = trained_rows = 0
    for _step in range(3):
        x, y, m = loader.get_batch("train")
        for row, gid in enumerate(loader.last_ids["train"]):
            toks, _ = sp.episode(int(gid))
            toks = np.asarray(toks, dtype=np.int64)[:25]
            rule = loss_mask(toks, tok.ids).astype(np.float32) if len(toks) < 25 else None
            stored = np.asarray(sp.episode(int(gid))[1][:25], dtype=np.float32)
            exp = np.zeros(24, np.float32)
            exp[:len(stored) - 1] = stored[1:]
            assert m[row].tolist() == exp.tolist()
            if rule is not None:  # a whole episode: the stored mask is the rule's
                assert stored.tolist() == rule.tolist()
                whole += 1
            trained = y[row][m[row] == 1].tolist()
            if trained:
                trained_rows += 1
                assert trained[-1] == tok.ids.end or len(toks) == 25  # an assistant span ends with END
            assert tok.ids.user not in trained and tok.ids.system not in trained
    assert whole >= 1 and trained_rows >= 1
