"""sftdata.torch: items, collators and the sampler are exact, and a transformers model
trains on them with exactly the loss our masks say.

The proofs against a tiny randomly initialised Llama (built from a config, nothing
downloaded) run on CPU, where transformers isolates the segments of a packed row through
``position_ids`` alone (sdpa and eager build a block-diagonal causal mask from them;
flash-attention varlen is GPU-only)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from sftdata.errors import ConfigError, DatasetError, UsageError
from sftdata.interop.export import export
from sftdata.loader import IGNORE_INDEX, apply_ignore_index, make_loader
from sftdata.order.config import LoaderConfig
from sftdata.packing.attention import block_causal_mask
from sftdata.replay.dataset import replay_order
from sftdata.torch import SFTDataset, SFTSampler, collate
from tests.helpers.loader import PACKED_BLOCK, make_dataset, make_packed
from tests.helpers.paths import ROOT

torch = pytest.importorskip("torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def packed(source, tmp_path_factory):  # noqa: F811
    return make_packed(source, tmp_path_factory.mktemp("packed") / "p")


def loader_batch(path, ids, block_size, split="train", **kw):
    """The loader's numpy batch of ``ids``: what our own training step sees."""
    cfg = LoaderConfig(batch_size=len(ids), block_size=block_size, use_loss_mask=True, **kw)
    return make_loader(cfg, path, backend="numpy").batch_at(split, 0, np.asarray(ids))


# ------------------------------------------------------------------------------ items
def test_an_episode_item_is_the_loaders_row_with_labels_aligned_to_input_ids(source):  # noqa: F811
    ds = SFTDataset(source, block_size=40)
    assert ds.kind == "episodes" and len(ds) == 96 and ds.pad_id == ds.dataset.tokenizer_state["eos_id"]
    ids = np.arange(len(ds))
    b = loader_batch(source, ids, 40)
    for i in ids:
        it = ds[i]
        n = min(int(ds.lengths[i]), 41)
        assert list(it) == ["input_ids", "labels"] and it["input_ids"].dtype == np.int64
        assert it["input_ids"].shape == (n,)
        # the model scores logits[t] against labels[t + 1]: that is the loader's x[t] -> y[t] where mask[t]
        np.testing.assert_array_equal(it["input_ids"][:-1], b.x[i, :n - 1])
        np.testing.assert_array_equal(it["labels"][1:], apply_ignore_index(b.y, b.mask)[i, :n - 1])
        assert it["labels"][0] == IGNORE_INDEX  # the first token is never a target
    whole = SFTDataset(source)
    assert whole.block_size is None and whole[3]["input_ids"].shape == (int(whole.lengths[3]),)


def test_a_packed_item_is_the_loaders_row_with_positions_and_segment_lengths(packed):
    ds = SFTDataset(packed)
    assert ds.kind == "packed" and ds.block_size == PACKED_BLOCK and ds.pad_id == ds.dataset.packing["pad_token_id"]
    ids = np.arange(len(ds))
    b = loader_batch(packed, ids, PACKED_BLOCK)
    seg = ds.segments
    for i in ids:
        it = ds[i]
        assert list(it) == ["input_ids", "labels", "position_ids", "seq_lengths"]
        assert it["input_ids"].shape == (PACKED_BLOCK + 1,)
        np.testing.assert_array_equal(it["input_ids"][:-1], b.x[i])
        np.testing.assert_array_equal(it["input_ids"][1:], b.y[i])
        np.testing.assert_array_equal(it["labels"][1:], apply_ignore_index(b.y, b.mask)[i])
        np.testing.assert_array_equal(it["position_ids"][:-1], b.position_ids[i])
        np.testing.assert_array_equal(it["seq_lengths"], seg.length[seg.row == i])
        starts = np.cumsum(it["seq_lengths"]) - it["seq_lengths"]
        assert (it["position_ids"][starts] == 0).all() and (it["labels"][starts] == IGNORE_INDEX).all()
    assert ds.records(0) == seg.source[seg.row == 0].tolist()


def test_without_the_loss_mask_every_target_inside_a_segment_is_trained(packed, source):  # noqa: F811
    ds = SFTDataset(packed, use_loss_mask=False)
    cfg = LoaderConfig(batch_size=len(ds), block_size=PACKED_BLOCK, use_loss_mask=False)
    b = make_loader(cfg, packed, backend="numpy").batch_at("train", 0, np.arange(len(ds)))
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i]["labels"][1:], apply_ignore_index(b.y, b.mask)[i])
    ep = SFTDataset(source, use_loss_mask=False)[0]
    np.testing.assert_array_equal(ep["labels"], ep["input_ids"])


def test_items_refuse_what_is_not_an_item(source, packed, tmp_path):  # noqa: F811
    ds = SFTDataset(source)
    with pytest.raises(IndexError, match=r"item 96 is outside split 'train' of .* \(ids 0\.\.95\)"):
        ds[96]
    with pytest.raises(IndexError, match=r"item -1 is outside"):
        ds[-1]
    with pytest.raises(TypeError, match="an SFTDataset item id is an integer, got str"):
        ds["0"]
    assert [it["input_ids"].size for it in ds] == [min(int(n), 10**9) for n in ds.lengths]
    with pytest.raises(ConfigError, match=r"was packed with block_size 63, not 100; leave block_size unset or re-pack "
                                          r"with `sftdata pack --block-size 100`"):
        SFTDataset(packed, block_size=100)
    with pytest.raises(ConfigError, match="block_size must be None or an integer >= 1, got 0"):
        SFTDataset(source, block_size=0)
    with pytest.raises(DatasetError, match=r"has no split 'test' \(splits: train, val\)"):
        SFTDataset(source, split="test")
    flat = tmp_path / "flat" / "train"
    flat.mkdir(parents=True)
    np.arange(10, dtype="<u4").tofile(flat / "tokens.bin")
    np.array([[0, 10]], dtype="<u8").tofile(flat / "episodes.idx")
    with pytest.raises(DatasetError, match=r"split 'train' of .* has no mask.bin, so the labels cannot say which tokens "
                                           r"are trained; .* or pass use_loss_mask=False"):
        SFTDataset(tmp_path / "flat")
    assert SFTDataset(tmp_path / "flat", use_loss_mask=False)[0]["labels"].tolist() == list(range(10))
    with pytest.raises(DatasetError, match="holds episodes, not packed rows"):
        _ = ds.segments


def test_pickles_by_path_and_workers_build_the_same_batches(packed):
    ds = SFTDataset(packed)
    blob = pickle.dumps(ds)
    assert len(blob) < 400  # the path and options, not the data
    again = pickle.loads(blob)
    np.testing.assert_array_equal(again[5]["input_ids"], ds[5]["input_ids"])
    rows = [len(ds) - 1, 0, 7, 0]  # across shards, repeated: the batched fetch a DataLoader makes
    for got, i in zip(ds.__getitems__(rows), rows):
        assert got.keys() == ds[i].keys() and all(np.array_equal(got[k], ds[i][k]) for k in got)
    sampler = SFTSampler(ds, LoaderConfig(batch_size=4, block_size=PACKED_BLOCK, epoch_seed=3))
    dl = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=collate(), num_workers=2)
    c = collate()
    for step, batch in enumerate(dl):
        want = c([ds[int(i)] for i in sampler.step_ids(step)])
        assert batch.keys() == want.keys()
        for k in ("input_ids", "labels", "position_ids"):
            assert torch.equal(batch[k], want[k]), (step, k)
    assert step + 1 == len(ds) // 4


# --------------------------------------------------------------------------- collators
def test_padded_episodes_pad_ids_labels_and_attention():
    items = [{"input_ids": np.array([5, 6, 7]), "labels": np.array([-100, 6, 7])},
             {"input_ids": np.array([8, 9]), "labels": np.array([-100, -100])}]
    b = collate(pad_id=2)(items)
    assert list(b) == ["input_ids", "labels", "attention_mask"] and all(v.dtype == torch.int64 for v in b.values())
    assert b["input_ids"].tolist() == [[5, 6, 7], [8, 9, 2]]
    assert b["labels"].tolist() == [[-100, 6, 7], [-100, -100, -100]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    b8 = collate(pad_id=2, pad_to_multiple_of=4).numpy(items)
    assert b8["input_ids"].tolist() == [[5, 6, 7, 2], [8, 9, 2, 2]] and b8["attention_mask"][0].tolist() == [1, 1, 1, 0]


def test_packed_rows_carry_positions_and_no_attention_mask():
    row = {"input_ids": np.array([1, 2, 3, 4, 9, 9]), "labels": np.array([-100, 2, -100, 4, -100, -100]),
           "position_ids": np.array([0, 1, 0, 1, 0, 0]), "seq_lengths": np.array([2, 2])}
    b = collate().numpy([row, row])
    assert list(b) == ["input_ids", "labels", "position_ids", "use_cache"] and b["use_cache"] is False
    assert b["position_ids"].tolist() == [[0, 1, 0, 1, 0, 0]] * 2
    # a trainer that keeps only seq_lengths (TRL) or only position_ids (transformers) gives the same batch
    only_lengths = {k: v for k, v in row.items() if k != "position_ids"}
    assert collate().numpy([only_lengths])["position_ids"].tolist() == [[0, 1, 0, 1, 0, 0]]
    padded = collate(pad_id=9, pad_to_multiple_of=4).numpy([row])
    assert padded["input_ids"].tolist() == [[1, 2, 3, 4, 9, 9, 9, 9]] and padded["position_ids"][0, 6:].tolist() == [0, 0]


def test_padding_free_lays_sequences_end_to_end_with_varlen_kwargs():
    eps = [{"input_ids": np.array([5, 6, 7]), "labels": np.array([5, 6, 7])},
           {"input_ids": np.array([8]), "labels": np.array([8])},  # one token: no target, left out
           {"input_ids": np.array([3, 4]), "labels": np.array([-100, 4])}]
    b = collate(padding_free=True)(eps)
    assert b["input_ids"].tolist() == [[5, 6, 7, 3, 4]]
    assert b["labels"].tolist() == [[-100, 6, 7, -100, 4]]  # every sequence's first token: never a target
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert b["cu_seq_lens_q"].dtype == torch.int32 and b["cu_seq_lens_q"].tolist() == [0, 3, 5]
    assert b["cu_seq_lens_k"].tolist() == [0, 3, 5] and b["max_length_q"] == b["max_length_k"] == 3
    assert b["use_cache"] is False
    row = {"input_ids": np.array([1, 2, 3, 4, 5, 9, 9]), "labels": np.array([-100, 2, -100, 4, 5, -100, -100]),
           "position_ids": np.array([0, 1, 0, 1, 2, 0, 0])}
    r = collate(padding_free=True).numpy([row])
    assert r["input_ids"].tolist() == [[1, 2, 3, 4, 5]] and r["cu_seq_lens_q"].tolist() == [0, 2, 5]
    assert r["position_ids"].tolist() == [[0, 1, 0, 1, 2]] and r["max_length_q"] == 3


def test_collators_refuse_batches_they_cannot_build():
    ep = {"input_ids": np.array([1, 2]), "labels": np.array([1, 2])}
    row = {"input_ids": np.array([1, 2]), "labels": np.array([1, 2]), "position_ids": np.array([0, 1])}
    with pytest.raises(UsageError, match="a batch mixes packed rows and episodes"):
        collate()([ep, row])
    with pytest.raises(UsageError, match="cannot collate an empty list of items"):
        collate()([])
    with pytest.raises(UsageError, match=r"item 0: input_ids \(2,\) and labels \(3,\) must be one row of one length"):
        collate()([{"input_ids": np.array([1, 2]), "labels": np.array([1, 2, 3])}])
    with pytest.raises(UsageError, match=r"packed rows of different lengths in one batch: \[2, 3\]"):
        collate()([row, {**row, "input_ids": np.array([1, 2, 3]), "labels": np.array([1, 2, 3]),
                         "position_ids": np.array([0, 1, 2])}])
    with pytest.raises(UsageError, match="the batch holds no sequence of 2 or more tokens"):
        collate(padding_free=True)([{"input_ids": np.array([1]), "labels": np.array([1])}])
    with pytest.raises(ConfigError, match="pad_id must be a token id"):
        collate(pad_id=-1)
    with pytest.raises(ConfigError, match="pad_to_multiple_of must be None or an integer >= 1, got 0"):
        collate(pad_to_multiple_of=0)


def test_importing_sftdata_torch_needs_no_torch_and_collate_says_how_to_install_it(source):  # noqa: F811
    code = ("import sys; sys.modules['torch'] = None\n"
            "import sftdata.torch, sftdata.loader\n"
            "from sftdata.torch import SFTDataset, collate\n"
            "from sftdata.errors import ConfigError\n"
            f"ds = SFTDataset({str(source)!r}); assert ds[0]['labels'].size > 0\n"
            "try:\n    collate()\nexcept ConfigError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "sftdata.torch needs PyTorch for its collators: pip install 'sftdata[torch]'\n"
    r = subprocess.run([sys.executable, "-c", "import sys, sftdata.torch; print(sorted(m for m in ('torch', 'typer', "
                        "'rich', 'click', 'transformers') if m in sys.modules))"], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.stdout == "[]\n", r.stderr


# ----------------------------------------------------------------------------- sampler
@pytest.mark.parametrize("drop_last", [True, False])
def test_the_sampler_hands_out_what_replay_order_lists(source, drop_last):  # noqa: F811
    cfg = LoaderConfig(batch_size=7, block_size=64, epoch_seed=11, epoch_drop_last=drop_last, episode_min_tokens=30)
    ds = SFTDataset(source)
    s = SFTSampler(ds, cfg)
    loader = make_loader(cfg, source, backend="numpy")
    seen = []
    for epoch in range(3):
        s.set_epoch(epoch)
        steps = s.steps()
        assert len(s) == len(steps) * 7 and steps.start == loader.order("train").first_step_of_epoch(epoch)
        got = list(s)
        seen.extend(got)
        for k, step in enumerate(steps):
            rows = replay_order(source, cfg, step=step).columns["episode"]
            assert got[k * 7:(k + 1) * 7] == rows.tolist() == loader.batch_ids("train", step).tolist()
    assert all(ds.lengths[i] >= 30 for i in seen)


def test_the_sampler_splits_global_batches_by_rank_as_the_loader(source):  # noqa: F811
    cfg = LoaderConfig(batch_size=3, block_size=64, epoch_seed=5)
    ds = SFTDataset(source)
    whole = list(SFTSampler(ds, cfg, world_size=2))
    ranks = [list(SFTSampler(ds, cfg, world_size=2, rank=r)) for r in range(2)]
    assert len(whole) == 2 * len(ranks[0]) == (96 // 6) * 6
    for step in range(96 // 6):
        g = whole[step * 6:(step + 1) * 6]
        assert g[:3] == ranks[0][step * 3:step * 3 + 3] and g[3:] == ranks[1][step * 3:step * 3 + 3]
        assert g == replay_order(source, cfg, step=step, world_size=2).columns["episode"].tolist()


def test_a_packed_sampler_is_one_pass(packed):
    ds = SFTDataset(packed)
    n = len(ds)
    cfg = LoaderConfig(batch_size=4, block_size=PACKED_BLOCK, epoch_seed=9, epoch_drop_last=False)
    s = SFTSampler(ds, cfg)
    assert list(s) == np.random.RandomState(9).permutation(n).tolist() and len(s) == n  # the last batch: real rows only
    s.set_epoch(1)
    assert list(s) == [] and len(s) == 0  # training ends when the data ends, as with the loader
    assert SFTSampler(ds, cfg.replace(epoch_drop_last=True)).__len__() == n // 4 * 4


def test_the_sampler_resumes_at_a_step_and_refuses_another_order(source):  # noqa: F811
    cfg = LoaderConfig(batch_size=8, block_size=64, epoch_seed=2)
    ds = SFTDataset(source)
    s = SFTSampler(ds, cfg)
    per = 96 // 8
    state = s.state_dict(per + 5)  # step 5 of epoch 1
    assert state["step"] == per + 5 and state["order"]["epoch_seed"] == 2
    again = SFTSampler(ds, cfg)
    again.load_state_dict(state)
    assert again.epoch == 1 and again.steps() == range(per + 5, 2 * per)
    assert list(again) == [i for st in range(per + 5, 2 * per) for i in s.order.step_ids(st).tolist()]
    again.set_epoch(2)
    assert again.steps() == range(2 * per, 3 * per)
    with pytest.raises(ConfigError, match=r"cannot resume: .*epoch_seed: saved 2, now 3"):
        SFTSampler(ds, cfg.replace(epoch_seed=3)).load_state_dict(state)
    with pytest.raises(ConfigError, match="not a sampler state"):
        again.load_state_dict({"step": 3})
    with pytest.raises(ConfigError, match="step must be an integer >= 0"):
        s.state_dict(-1)
    with pytest.raises(ConfigError, match="SFTSampler orders an SFTDataset or a PairDataset, got list"):
        SFTSampler([1, 2], cfg)
    with pytest.raises(ConfigError, match=r"rank must be None or an integer in 0\.\.1, got 2"):
        SFTSampler(ds, cfg, world_size=2, rank=2)


def test_random_sampling_has_no_length_and_runs_on(tmp_path):
    path = make_dataset(tmp_path / "d", [5] * 10)
    cfg = LoaderConfig(batch_size=4, block_size=8, batch_sampling_mode="random", epoch_seed=4)
    s = SFTSampler(SFTDataset(path), cfg)
    with pytest.raises(TypeError, match="has no epochs"):
        len(s)
    it = iter(s)
    got = [next(it) for _ in range(12)]
    want = [i for st in range(3) for i in np.random.default_rng([4, st]).integers(0, 10, 4).tolist()]
    assert got == want


# ---------------------------------------------------- the proofs with a transformers model
transformers = pytest.importorskip("transformers")


def tiny_llama(vocab_size: int, attn: str = "sdpa", seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    cfg._attn_implementation = attn
    return transformers.LlamaForCausalLM(cfg).eval()


def hand_loss(model, b) -> torch.Tensor:
    """Our own training step's loss on the loader's batch: x in, -100 where the mask is 0
    on y, mean over the rest; packed rows attend through ``block_causal_mask(seq_ids)``."""
    kw = {}
    if b.seq_ids is not None:
        kw = {"position_ids": torch.from_numpy(b.position_ids),
              "attention_mask": torch.from_numpy(block_causal_mask(b.seq_ids)).float()}
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(b.x), use_cache=False, **kw).logits
    target = torch.from_numpy(apply_ignore_index(b.y, b.mask))
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=-100)


@pytest.mark.parametrize("which", ["episodes", "packed"])
def test_the_models_own_loss_on_a_collated_batch_is_the_loss_our_masks_say(source, packed, which):  # noqa: F811
    path, block = (source, 40) if which == "episodes" else (packed, PACKED_BLOCK)
    ds = SFTDataset(path, block_size=block)
    model = tiny_llama(ds.vocab_size)
    ids = np.arange(8)
    batch = collate(pad_id=ds.pad_id)([ds[i] for i in ids])
    with torch.no_grad():
        hf = model(**batch).loss
    want = hand_loss(model, loader_batch(path, ids, block))
    assert abs(hf.item() - want.item()) < 1e-5, (hf.item(), want.item())
    if which == "packed":
        assert abs(hf.item() - packed_hand_loss(model, ds, ids).item()) < 1e-5
    wrong = batch["labels"].clone()
    wrong[:, :-1] = batch["labels"][:, 1:]  # labels aligned with y (our loader's targets) would be shifted twice
    with torch.no_grad():
        assert abs(model(**{**batch, "labels": wrong}).loss.item() - want.item()) > 0.01


def packed_hand_loss(model, ds, ids) -> torch.Tensor:
    """Cross-entropy over every trained target of the rows, each segment run as an episode alone."""
    total, count = 0.0, 0
    for i in ids:
        it = ds[int(i)]
        off = 0
        for n in it["seq_lengths"].tolist():
            seg_ids = torch.from_numpy(it["input_ids"][off:off + n])[None]
            lab = torch.from_numpy(it["labels"][off:off + n])
            with torch.no_grad():
                logits = model(input_ids=seg_ids, use_cache=False).logits[0]
            keep = lab[1:] != IGNORE_INDEX
            total += torch.nn.functional.cross_entropy(logits[:-1][keep].float(), lab[1:][keep], reduction="sum").item()
            count += int(keep.sum())
            off += n
    return torch.tensor(total / count)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_packed_batch_gives_every_segment_the_logits_of_its_episode_alone(packed, attn):
    ds = SFTDataset(packed)
    items = [ds[i] for i in range(12)]
    # ids renumbered densely: a small output layer keeps the test fast, and isolation does not depend on id values
    vocab, dense = np.unique(np.concatenate([it["input_ids"] for it in items]), return_inverse=True)
    cuts = np.cumsum([it["input_ids"].size for it in items])[:-1]
    items = [{**it, "input_ids": d} for it, d in zip(items, np.split(dense.astype(np.int64), cuts))]
    model = tiny_llama(len(vocab), attn)
    batch = collate()(items)
    flat = collate(padding_free=True)(items)
    with torch.no_grad():
        rows = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        free = model(**{k: v for k, v in flat.items() if k != "labels"}).logits[0]
        leaky = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                      attention_mask=torch.ones_like(batch["input_ids"]), use_cache=False).logits
    worst = worst_free = worst_leaky = 0.0
    cu = flat["cu_seq_lens_q"].tolist()
    k = 0
    for r, it in enumerate(items):
        off = 0
        for n in it["seq_lengths"].tolist():
            with torch.no_grad():
                alone = model(input_ids=torch.from_numpy(it["input_ids"][off:off + n])[None], use_cache=False).logits[0]
            worst = max(worst, (rows[r, off:off + n] - alone).abs().max().item())
            worst_leaky = max(worst_leaky, (leaky[r, off:off + n] - alone).abs().max().item())
            if n >= 2:
                worst_free = max(worst_free, (free[cu[k]:cu[k + 1]] - alone).abs().max().item())
                k += 1
            off += n
    assert k == len(cu) - 1
    assert worst < 1e-5 and worst_free < 1e-5, (worst, worst_free)
    assert worst_leaky > 1e-2  # a 2D attention mask turns the position-id isolation off: why packed batches have none


@pytest.mark.parametrize("padding_free", [False, True])
def test_a_trainer_run_trains_on_the_dataset_with_the_loss_by_hand_and_the_samplers_order(packed, padding_free,
                                                                                        tmp_path):
    ds = SFTDataset(packed)
    cfg = LoaderConfig(batch_size=4, block_size=PACKED_BLOCK, epoch_seed=21)
    model = tiny_llama(ds.vocab_size)
    seen = []

    class Recording(transformers.Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return SFTSampler(ds, cfg)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            seen.append((inputs["input_ids"].clone(), weights, loss.item()))
            return loss

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4,
                                          learning_rate=5e-3, report_to="none", use_cpu=True, save_strategy="no",
                                          logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    collator = collate(padding_free=padding_free)
    Recording(model=model.train(), args=args, train_dataset=ds, data_collator=collator).train()
    assert len(seen) == 3
    sampler = SFTSampler(ds, cfg)
    probe = tiny_llama(ds.vocab_size)
    for step, (input_ids, weights, loss) in enumerate(seen):
        ids = sampler.step_ids(step)
        assert torch.equal(input_ids, collator([ds[int(i)] for i in ids])["input_ids"])
        probe.load_state_dict(weights)
        # each segment's loss as if run alone: the segments were kept apart
        assert abs(loss - packed_hand_loss(probe, ds, ids).item()) < 1e-5, step
    assert not torch.equal(seen[0][1]["model.embed_tokens.weight"], seen[2][1]["model.embed_tokens.weight"])


# ------------------------------------------- TRL's SFTTrainer and HF's collators on the export
trl = pytest.importorskip("trl", reason="TRL is not installed")
datasets = pytest.importorskip("datasets", reason="TRL's trainers take a datasets.Dataset")
pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def packed_export(packed, tmp_path_factory):
    """The packed dataset's export as `datasets` reads it, and a dense renumbering of its
    ids (a small output layer keeps the model fast; isolation does not depend on id values)."""
    out = tmp_path_factory.mktemp("export") / "packed"
    export(packed, out)
    train = datasets.load_dataset("parquet", data_dir=str(out), split="train",
                                  cache_dir=str(tmp_path_factory.mktemp("hf")))
    vocab = np.unique(np.concatenate([np.asarray(r) for r in train["input_ids"]]))
    dense = train.map(lambda r: {"input_ids": np.searchsorted(vocab, r["input_ids"]).tolist(),
                                 "labels": [x if x < 0 else int(np.searchsorted(vocab, x)) for x in r["labels"]]})
    return dense, vocab


def densely(vocab: np.ndarray, ids) -> np.ndarray:
    return np.clip(np.searchsorted(vocab, ids), 0, vocab.size - 1)


def shared_row(packed) -> dict:
    """The first packed row holding several sequences."""
    ds = SFTDataset(packed)
    return next(it for it in ds if len(it["seq_lengths"]) > 1)


def second_segment_leak(model, row: dict, vocab: np.ndarray, collator) -> float:
    """How far the second segment of a packed row, given to ``collator`` as one example,
    is from the same segment alone."""
    a, n = (int(x) for x in row["seq_lengths"][:2])
    batch = collator([{"input_ids": densely(vocab, row["input_ids"]).tolist()}])
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits[0]
        alone = model(input_ids=batch["input_ids"][:, a:a + n], use_cache=False).logits[0]
    return (logits[a:a + n] - alone).abs().max().item()


def stand_in_tokenizer():
    """SFTTrainer wants a tokenizer (its pad token); the data is tokenized already."""
    from tokenizers import Tokenizer, models

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<|EOS|>": 0}, unk_token="<|EOS|>")), eos_token="<|EOS|>")


def sequences_of(batch) -> list[tuple[torch.Tensor, slice]]:
    """(row of the batch, span) of every sequence a collated batch holds: a padded row's
    tokens (its attention mask), or each run of a padding-free row's positions."""
    if "attention_mask" in batch:
        return [(r, slice(0, int(m.sum()))) for r, m in enumerate(batch["attention_mask"])]
    pos = batch["position_ids"][0]
    starts = torch.nonzero(pos == 0).flatten().tolist() + [pos.numel()]
    return [(0, slice(a, b)) for a, b in zip(starts, starts[1:])]


def worst_vs_alone(model, batch) -> tuple[float, list[list[int]]]:
    """The largest difference between a sequence's logits in ``batch`` and the same
    sequence run alone, and the sequences' ids."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits
    worst, seqs = 0.0, []
    for r, span in sequences_of(batch):
        ids = batch["input_ids"][r, span]
        with torch.no_grad():
            alone = model(input_ids=ids[None], use_cache=False).logits[0]
        worst = max(worst, (logits[r, span] - alone).abs().max().item())
        seqs.append(ids.tolist())
    return worst, seqs


@pytest.mark.parametrize("padding_free", [False, True])
def test_sfttrainers_default_collator_keeps_every_sequence_of_a_packed_export_alone(packed_export, packed,
                                                                                    padding_free, tmp_path):
    train, vocab_ids = packed_export
    vocab = vocab_ids.size
    seen = []

    class Recording(trl.SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            seen.append(({k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)},
                         {k: v.detach().clone() for k, v in model.state_dict().items()}))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    # TRL's defaults but for the run's length; padding_free=True needs max_length=None (TRL's own rule)
    cfg = {"padding_free": True, "max_length": None} if padding_free else {}
    args = trl.SFTConfig(output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=4,
                         learning_rate=5e-3, report_to="none", use_cpu=True, save_strategy="no",
                         logging_strategy="no", disable_tqdm=True, **cfg)
    trainer = Recording(model=tiny_llama(vocab), args=args, train_dataset=train, processing_class=stand_in_tokenizer())
    assert type(trainer.data_collator).__name__ == "DataCollatorForLanguageModeling"  # TRL's own collator
    assert trainer.data_collator.padding_free is padding_free
    trainer.train()
    assert len(seen) == 2
    labels = {tuple(i): lab for i, lab in zip(train["input_ids"], train["labels"])}
    probe = tiny_llama(vocab)
    for batch, weights in seen:
        assert ("attention_mask" in batch) is not padding_free
        probe.load_state_dict(weights)
        worst, seqs = worst_vs_alone(probe, batch)
        assert len(seqs) == 4 and all(tuple(s) in labels for s in seqs)  # 4 exported sequences, each whole
        for (r, span), ids in zip(sequences_of(batch), seqs):  # trained on exactly the exported labels
            assert batch["labels"][r, span].tolist() == labels[tuple(ids)]
        assert worst < 1e-5, worst
    # a packed row as one example (what a row-per-row export gave it): its sequences see each other
    assert second_segment_leak(probe, shared_row(packed), vocab_ids, trainer.data_collator) > 1e-2


def test_hfs_flattening_collator_keeps_every_sequence_of_a_packed_export_alone(packed_export, packed):
    train, vocab = packed_export
    model = tiny_llama(vocab.size)
    items = [train[i] for i in range(6)]
    collator = transformers.DataCollatorWithFlattening()
    worst, seqs = worst_vs_alone(model, collator(items))
    assert seqs == [it["input_ids"] for it in items] and worst < 1e-5, worst
    # a packed row as one example (what a row-per-row export gave it): its sequences see each other
    assert second_segment_leak(model, shared_row(packed), vocab, collator) > 1e-2
