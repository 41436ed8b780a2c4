"""GPTEpisodeDataLoader: seed 000's must-haves, order, ranks, resume, mask, logging, audit."""

import json
import logging
import shutil

import numpy as np
import pytest
from loader_util import EOS, ep_mask, ep_tokens, make_dataset, make_flat

from sftdata.audit import read_log
from sftdata.errors import ConfigError, DatasetError
from sftdata.loader import (
    IGNORE_INDEX,
    GPTDataLoader,
    GPTEpisodeDataLoader,
    LoaderConfig,
    apply_ignore_index,
    detect_mode,
    make_loader,
)

LENGTHS = [3, 5, 1, 12, 4, 7, 2, 9, 6, 10, 3, 8]  # episode 2 (1 token) is below episode_min_tokens=2


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    # shard_tokens=15 -> several shards, so global ids cross shard boundaries
    return make_dataset(tmp_path_factory.mktemp("d") / "ds", LENGTHS, shard_tokens=15, val_lengths=[4, 4, 6, 2])


def load(ds, **kw):
    opts = {k: kw.pop(k) for k in ("rank", "world_size", "audit_dir") if k in kw}
    return make_loader(LoaderConfig(**{"batch_size": 3, "block_size": 6, **kw}), ds, backend="numpy", **opts)


def expected_row(gid, block):
    """x, y, mask of episode ``gid`` by seed 000's padding rule, written out plainly."""
    L = block + 1
    t = ep_tokens(gid, LENGTHS[gid])[:L]
    m = ep_mask(gid, LENGTHS[gid])[:L].astype(np.float32)
    t = np.concatenate([t, np.full(L - len(t), EOS)])
    m = np.concatenate([m, np.zeros(L - len(m), np.float32)])
    return t[:-1], t[1:], m[1:]


def test_dataset_has_several_shards(ds):
    loader = load(ds)
    assert isinstance(loader, GPTEpisodeDataLoader)
    assert len(loader.ds.split("train").shards) >= 4
    assert detect_mode(ds) == "sft_episode"


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
    import types

    from sftdata.episode_loader import episode_batch

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
    from sftdata.episode_loader import episode_batch
    bx, by, bm = episode_batch(loader.ds.split("train"), np.array([7]), 8, EOS, True)
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
    assert order.n == 11 and order.batches_in_epoch(0) == 2
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
    for step in range(5):
        xa, _ = a.get_batch("train")
        xb, _ = b.get_batch("train")
        assert xa.tolist() == xb.tolist()
        draws = np.random.default_rng([3, step]).integers(0, len(eligible), 3)
        assert a.last_ids["train"].tolist() == eligible[draws].tolist()


@pytest.mark.parametrize("sampling,drop_last", [("epoch", True), ("epoch", False), ("random", True)])
def test_ranks_partition_the_global_batch(ds, sampling, drop_last):
    kw = dict(batch_sampling_mode=sampling, epoch_drop_last=drop_last, use_loss_mask=True)
    single = load(ds, batch_size=4, **kw)
    ranks = [load(ds, batch_size=2, rank=r, world_size=2, **kw) for r in range(2)]
    for _ in range(7):
        whole = single.get_batch("train")
        parts = [rk.get_batch("train") for rk in ranks]
        for i in range(3):
            assert np.concatenate([p[i] for p in parts]).tolist() == whole[i].tolist()


def test_rank_from_environment(ds, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = load(ds, batch_size=2)
    assert (loader.rank, loader.world_size) == (1, 2)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="RANK='x' is not an integer"):
        load(ds)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match=r"rank must be an integer in 0..1"):
        load(ds)


@pytest.mark.parametrize("sampling,drop_last", [("epoch", True), ("epoch", False), ("random", False)])
def test_resume_mid_epoch_equals_uninterrupted(ds, sampling, drop_last):
    kw = dict(batch_sampling_mode=sampling, epoch_drop_last=drop_last, use_loss_mask=True, batch_size=2)
    full = load(ds, **kw)
    ref = [full.get_batch("train") for _ in range(9)]
    vals = [full.get_batch("val") for _ in range(2)]
    first = load(ds, **kw)
    for _ in range(4):
        first.get_batch("train")
    first.get_batch("val")
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON (or torch.save) round trip
    assert state["steps"] == {"train": 4, "val": 1}
    resumed = load(ds, **kw)
    resumed.load_state_dict(state)
    assert resumed.step("train") == 4
    for i in range(4, 9):
        got = resumed.get_batch("train")
        assert all(a.tolist() == b.tolist() for a, b in zip(got, ref[i]))
    assert all(a.tolist() == b.tolist() for a, b in zip(resumed.get_batch("val"), vals[1]))


def test_resume_with_other_settings_is_refused(ds):
    state = load(ds, batch_size=2).state_dict()
    with pytest.raises(ConfigError, match=r"cannot resume: .*batch_size: saved 2, now 3"):
        load(ds, batch_size=3).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"epoch_seed: saved 1337, now 1"):
        load(ds, batch_size=2, epoch_seed=1).load_state_dict(state)
    with pytest.raises(ConfigError, match="not a loader state"):
        load(ds).load_state_dict({"steps": {}})
    with pytest.raises(ConfigError, match="version 9 is not supported"):
        load(ds).load_state_dict({**state, "version": 9})
    bad = {**state, "steps": {"train": -1}}
    with pytest.raises(ConfigError, match="must be an integer >= 0"):
        load(ds, batch_size=2).load_state_dict(bad)


def test_resume_on_another_dataset_with_the_same_counts_is_refused(tmp_path, monkeypatch):
    """Episode counts alone do not identify a dataset: re-prepared with another split seed
    (or edited records), the same ids are other conversations, so the batches after the
    resume would not be those of the run. A copy elsewhere, or the same data prepared
    again from the input named another way, resumes."""
    from conftest import chat, write_jsonl

    from sftdata.prepare import PrepareOptions, prepare

    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i}", f"answer {i}") for i in range(12)])
    prepare([src], tmp_path / "a", PrepareOptions(val_split=0.25, seed=1))
    prepare([src], tmp_path / "b", PrepareOptions(val_split=0.25, seed=2))
    shutil.copytree(tmp_path / "a", tmp_path / "a_copy")
    monkeypatch.chdir(tmp_path)
    prepare(["in.jsonl"], tmp_path / "a_again", PrepareOptions(val_split=0.25, seed=1))
    first = load(tmp_path / "a", batch_size=2)
    first.get_batch("train")
    state = json.loads(json.dumps(first.state_dict()))
    other = load(tmp_path / "b", batch_size=2)
    assert other.ds.split("train").num_episodes == first.ds.split("train").num_episodes
    with pytest.raises(ConfigError, match=r"cannot resume: .*dataset_content_sha256: saved '[0-9a-f]{64}', now "
                                          r"'[0-9a-f]{64}'"):
        other.load_state_dict(state)
    expected = first.get_batch("train")[0].tolist()
    for again in ("a_copy", "a_again"):
        resumed = load(tmp_path / again, batch_size=2)
        resumed.load_state_dict(state)
        assert resumed.get_batch("train")[0].tolist() == expected
    del state["order"]["dataset_content_sha256"]  # a state saved before the field existed still resumes
    load(tmp_path / "b", batch_size=2).load_state_dict(state)


def test_without_mask_file_batches_are_xy_with_one_warning(tmp_path, caplog):
    p = make_flat(tmp_path / "flat", LENGTHS, mask=None)
    with caplog.at_level(logging.WARNING, logger="sftdata.loader"):
        loader = make_loader(LoaderConfig(batch_size=2, block_size=4, use_loss_mask=True, pad_token_id=0), p,
                             backend="numpy")
        batches = [loader.get_batch("train") for _ in range(3)]
    assert all(len(b) == 2 for b in batches)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no mask file" in warnings[0]


def test_use_loss_mask_false_gives_xy(ds):
    assert len(load(ds, use_loss_mask=False).get_batch("train")) == 2


def test_flat_layout_float32_mask_and_explicit_pad(tmp_path):
    p = make_flat(tmp_path / "flat", LENGTHS, mask="float32")
    with pytest.raises(ConfigError, match="pad_token_id is not set .*set pad_token_id in the config"):
        make_loader(LoaderConfig(batch_size=2, block_size=6), p, backend="numpy")
    loader = make_loader(LoaderConfig(batch_size=2, block_size=6, use_loss_mask=True, pad_token_id=0), p,
                         backend="numpy")
    assert loader.ds.layout == "flat" and loader.ds.split("train").shards[0].mask_dtype == np.float32
    x, y, m = loader.batch_at("train", 0)
    for row, gid in enumerate(loader.batch_ids("train", 0)):
        _, _, em = expected_row(gid, 6)
        assert m[row].tolist() == em.tolist()
        ex = np.concatenate([ep_tokens(gid, LENGTHS[gid])[:7], np.zeros(7, np.int64)])[:7]
        assert x[row].tolist() == ex[:-1].tolist() and y[row].tolist() == ex[1:].tolist()


def test_pad_default_is_eos_and_can_be_set(ds):
    assert load(ds).pad_id == EOS
    loader = load(ds, pad_token_id=9, block_size=16)
    x, _ = loader.batch_at("train", 0)
    assert (x == 9).any() and not (x == EOS).any()


def test_pad_outside_the_token_dtype_is_refused(tmp_path):
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


def test_make_loader_errors(tmp_path, ds):
    with pytest.raises(DatasetError, match="does not exist"):
        make_loader(LoaderConfig(), tmp_path / "nope")
    with pytest.raises(ConfigError, match="backend 'jax' is not valid; choose one of: auto, numpy, torch"):
        make_loader(LoaderConfig(), ds, backend="jax")
    with pytest.raises(ConfigError, match="needs a LoaderConfig"):
        make_loader("cfg.json", ds)
    stream = tmp_path / "stream" / "train"
    stream.mkdir(parents=True)
    np.arange(100, dtype="<u4").tofile(stream / "tokens.bin")
    with pytest.raises(DatasetError, match="dataset_mode=sft_episode needs an episode index"):
        make_loader(LoaderConfig(dataset_mode="sft_episode"), stream.parent)
    assert isinstance(make_loader({"batch_size": 2, "block_size": 8}, stream.parent, backend="numpy"), GPTDataLoader)


def test_epoch_log_lines(ds, caplog):
    with caplog.at_level(logging.INFO, logger="sftdata.loader"):
        loader = load(ds, batch_size=4, epoch_drop_last=False, use_loss_mask=True)
        for _ in range(4):
            loader.get_batch("train")
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("[EpisodeLoader] init dataset=") and "split=train episodes=12 eligible=11 "
               "skipped_short=1" in m for m in msgs)
    epochs = [m for m in msgs if m.startswith("[EpisodeLoader] split=")]
    assert epochs == [
        "[EpisodeLoader] split=train epoch=0 episodes=11 batches=3 shuffle=true drop_last=false pad_id=7 mask=true",
        "[EpisodeLoader] split=train epoch=1 episodes=11 batches=3 shuffle=true drop_last=false pad_id=7 mask=true",
    ]


def test_audit_lines(tmp_path, ds):
    adir = tmp_path / "logs" / "audit"
    loader = load(ds, batch_size=4, epoch_seed=42, audit_dir=adir)
    for _ in range(5):
        loader.get_batch("train")
    (path,) = adir.glob("audit_*.log")
    entries, bad = read_log(path)
    assert bad == []
    assert [e.action for e in entries] == ["dataset_load", "epoch_start", "epoch_complete", "epoch_start",
                                           "epoch_complete", "epoch_start"]
    load_ev = entries[0].fields
    assert (load_ev["epoch_seed"], load_ev["epoch_shuffle"], load_ev["num_train_episodes"],
            load_ev["num_train_skipped_short"]) == ("42", "true", "11", "1")
    order = loader.order("train")
    for e, epoch in zip([entries[1], entries[3], entries[5]], [0, 1, 2]):
        assert e.fields["epoch"] == str(epoch) and e.fields["seed"] == str(42 + epoch)
        assert json.loads(e.fields["first_episode_ids"]) == order.epoch_order(epoch)[:10].tolist()
    assert entries[2].fields["episodes_seen"] == "8" and entries[2].fields["episodes_dropped"] == "3"
    assert entries[2].fields["seed_used"] == "42"
    # only rank 0 writes
    other = tmp_path / "other"
    load(ds, batch_size=2, rank=1, world_size=2, audit_dir=other).get_batch("train")
    assert not other.exists() or list(other.iterdir()) == []


def test_audit_dir_from_config_and_resume_event(tmp_path, ds):
    adir = tmp_path / "a"
    loader = load(ds, audit_dir=str(adir))
    loader.get_batch("train")
    state = loader.state_dict()
    again = load(ds, audit_dir=str(adir))
    again.load_state_dict(state)
    actions = [e.action for f in sorted(adir.glob("audit_*.log")) for e in read_log(f)[0]]
    assert actions.count("loader_resume") == 1 and actions.count("dataset_load") == 2


def test_apply_ignore_index():
    y = np.array([[5, 6, 7]])
    m = np.array([[1.0, 0.0, 1.0]], dtype=np.float32)
    assert apply_ignore_index(y, m).tolist() == [[5, IGNORE_INDEX, 7]]
    assert IGNORE_INDEX == -100


def test_masks_of_a_prepared_chat_dataset_follow_the_mask_rule(tmp_path):
    from sftdata.masking import loss_mask
    from sftdata.prepare import PrepareOptions, prepare
    from sftdata.tokenizer import load_tokenizer

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
    assert loader.pad_id == tok.eos_id
    sp = loader.ds.split("train")
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


def test_make_loader_refuses_a_broken_dataset_with_verifys_message(tmp_path):
    from sftdata.errors import DatasetError
    from sftdata.loader import LoaderConfig, make_loader
    from sftdata.prepare import PrepareOptions, prepare

    src = tmp_path / "in.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n' * 3)
    prepare([src], tmp_path / "ds", PrepareOptions())
    idx = tmp_path / "ds" / "train" / "shard_00000" / "episodes.idx"
    a = np.fromfile(idx, dtype=np.uint64).reshape(-1, 2)
    a[2, 0] = 10**6  # the last episode points past the end of tokens.bin
    a.tofile(idx)
    with pytest.raises(DatasetError, match="episode 2"):
        make_loader(LoaderConfig(batch_size=1, block_size=8), tmp_path / "ds", backend="numpy")
