"""scripts/train.py and scripts/gpt.py: targets, schedule, settings, packing equivalence,
checkpoint resume, and real training runs on datasets built by prepare (and pack)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gpt  # noqa: E402
import train  # noqa: E402
import trainer  # noqa: E402

from sftdata.errors import ConfigError  # noqa: E402
from sftdata.loader import Batch, LoaderConfig, make_loader  # noqa: E402
from sftdata.pack import PackOptions, pack  # noqa: E402
from sftdata.packing.attention import block_causal_mask  # noqa: E402
from tests.helpers.paths import ROOT  # noqa: E402
from tests.helpers.train import train_args, train_config  # noqa: E402


# ------------------------------------------------------------------------- targets
def test_masked_targets_are_minus_100_exactly_where_mask_is_0():
    y = torch.tensor([[11, 12, 13, 14, 15], [21, 22, 23, 24, 25]])
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.float32)
    out = trainer.step_inputs(Batch(y, y, mask), post_training=True).targets
    assert out.tolist() == [[-100, 12, 13, -100, 15], [-100, -100, -100, -100, -100]]
    assert out.dtype == torch.int64
    assert y.tolist() == [[11, 12, 13, 14, 15], [21, 22, 23, 24, 25]]  # input untouched


def test_episode_end_targets_ignore_padding_after_eos_but_train_the_eos():
    eos = 9
    x = torch.tensor([[1, 2, 3, eos, eos, eos], [1, 2, 3, 4, 5, 6]])
    y = torch.tensor([[2, 3, eos, eos, eos, eos], [2, 3, 4, 5, 6, 7]])
    out = trainer.episode_end_targets(x, y, eos)
    assert out.tolist() == [[2, 3, eos, -100, -100, -100], [2, 3, 4, 5, 6, 7]]


def test_step_inputs_for_each_kind_of_batch():
    x = torch.tensor([[1, 2, 9, 9]])
    y = torch.tensor([[2, 9, 9, 9]])
    m = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    a = trainer.step_inputs(Batch(x, y), post_training=False, end_id=9)  # a padded episode, no mask
    assert a.targets.tolist() == [[2, 9, -100, -100]] and a.attn_mask is None and a.position_ids is None
    b = trainer.step_inputs(Batch(x, y, m), post_training=True, end_id=9)
    assert b.targets.tolist() == [[2, 9, -100, -100]]
    c = trainer.step_inputs(Batch(x, y), post_training=False, end_id=None)  # token windows: all trained
    assert c.targets.tolist() == [[2, 9, 9, 9]]
    m2 = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    e = trainer.step_inputs(Batch(x, y, m2), post_training=False, end_id=9)  # a mask, when given, decides
    assert e.targets.tolist() == [[2, -100, 9, 9]]
    seq = torch.tensor([[0, 0, 1, 1]])
    p = Batch(x, y, m, torch.tensor([[0, 1, 0, 1]]), seq)
    d = trainer.step_inputs(p, post_training=True, end_id=9)
    assert d.targets.tolist() == [[2, 9, -100, -100]]
    assert d.position_ids.tolist() == [[0, 1, 0, 1]]
    assert d.attn_mask[0, 0].tolist() == [[True, False, False, False], [True, True, False, False],
                                          [False, False, True, False], [False, False, True, True]]
    lib = trainer.step_inputs(p, post_training=True, mask_fn=block_causal_mask).attn_mask  # sftdata's: 0 / -inf
    assert torch.equal(lib[0, 0] == 0, d.attn_mask[0, 0])
    with pytest.raises(ConfigError, match="POST_TRAINING=1 .* needs a dataset with loss masks"):
        trainer.step_inputs(Batch(x, y), post_training=True, end_id=9)


# ------------------------------------------------------------------- LR schedule
def test_lr_warmup_share_then_cosine_to_min_lr():
    s = trainer.TrainSettings(learning_rate=1.0, min_lr=0.1, max_iters=100, warmup_pct=0.05)
    assert [trainer.lr_at(i, s) for i in range(5)] == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert trainer.lr_at(5, s) == 1.0  # first step after warmup: the peak
    mid = 5 + 95 / 2
    assert trainer.lr_at(int(mid), s) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 47 / 95)))
    assert trainer.lr_at(100, s) == pytest.approx(0.1)
    no_warmup = trainer.TrainSettings(learning_rate=1.0, min_lr=0.0, max_iters=10, warmup_pct=0.0)
    assert trainer.lr_at(0, no_warmup) == 1.0


# ---------------------------------------------------------------------- settings
def test_settings_from_extra_types_and_unknown_keys():
    s = trainer.settings_from_extra({"n_layer": 3, "learning_rate": 1, "tie_weights": False}, "c.json")
    assert (s.n_layer, s.learning_rate, s.tie_weights) == (3, 1.0, False)
    with pytest.raises(ConfigError, match=r"c.json: unknown key\(s\) n_layers; the training keys are"):
        trainer.settings_from_extra({"n_layers": 3}, "c.json")
    with pytest.raises(ConfigError, match="c.json: n_layer must be int, got '3'"):
        trainer.settings_from_extra({"n_layer": "3"}, "c.json")
    with pytest.raises(ConfigError, match="unknown key.*post_training"):
        trainer.settings_from_extra({"post_training": True}, "c.json")  # that is use_loss_mask
    with pytest.raises(ConfigError, match="c.json: warmup_pct = 1.5 must be a fraction in"):
        trainer.TrainSettings(warmup_pct=1.5).validate("c.json")
    with pytest.raises(ConfigError, match="n_embd \\(30\\) must split into n_head \\(4\\)"):
        trainer.TrainSettings(n_embd=30, n_head=4).validate("c.json")


def test_env_overrides_post_training_and_warmup():
    s = trainer.apply_env(trainer.TrainSettings(), {"POST_TRAINING": "1", "WARMUP_PCT": "0.05"})
    assert (s.post_training, s.warmup_pct) == (True, 0.05)
    s = trainer.apply_env(trainer.TrainSettings(post_training=True), {"POST_TRAINING": "0"})
    assert s.post_training is False
    assert trainer.apply_env(trainer.TrainSettings(warmup_pct=0.1), {}).warmup_pct == 0.1
    with pytest.raises(ConfigError, match="POST_TRAINING='yes': use 1"):
        trainer.apply_env(trainer.TrainSettings(), {"POST_TRAINING": "yes"})
    with pytest.raises(ConfigError, match="WARMUP_PCT='5%' is not a number"):
        trainer.apply_env(trainer.TrainSettings(), {"WARMUP_PCT": "5%"})
    with pytest.raises(ConfigError, match="the environment: warmup_pct = 2.0 must be"):
        trainer.apply_env(trainer.TrainSettings(), {"WARMUP_PCT": "2"})


# ------------------------------------------------------- packing is invisible
def _tiny_model(vocab=50, **kw):
    """Attention weights scaled up from the 0.02 init so attention is far from uniform:
    a leak across segments or a wrong position then shows in the logits."""
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=vocab, n_layer=2, n_head=2, n_embd=16, **kw)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(25.0)
    return model


def test_packed_row_logits_equal_per_episode_logits():
    model = _tiny_model()
    g = torch.Generator().manual_seed(1)
    lengths = [5, 9, 3]
    episodes = [torch.randint(0, 50, (n,), generator=g) for n in lengths]
    pad = 2
    row = torch.cat(episodes + [torch.zeros(pad, dtype=torch.long)])[None]
    seq_ids = torch.tensor([[i for i, n in enumerate(lengths) for _ in range(n)] + [-1] * pad])
    pos = torch.tensor([[p for n in lengths for p in range(n)] + [0] * pad])
    with torch.no_grad():
        packed = model(row, pos, gpt.block_causal_mask(seq_ids))[0][0]
        start = 0
        for ep in episodes:
            alone = model(ep[None])[0][0]
            torch.testing.assert_close(packed[start:start + len(ep)], alone, rtol=0, atol=1e-5)
            start += len(ep)
        assert torch.isfinite(packed).all()  # padding rows attend to themselves: no NaN
        # the proof has teeth: plain causal attention over the row changes the later episodes
        leaky = model(row, pos)[0][0]
        assert (leaky[5:14] - packed[5:14]).abs().max() > 1e-3


def test_position_ids_drive_rope():
    model = _tiny_model()
    x = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        a = model(x)[0]
        b = model(x, torch.tensor([[0, 1, 2, 3]]))[0]
        c = model(x, torch.tensor([[10, 11, 12, 13]]))[0]  # RoPE is relative: a shift changes nothing
        d = model(x, torch.tensor([[0, 2, 4, 6]]))[0]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, c, rtol=0, atol=1e-5)
    assert (a - d).abs().max() > 1e-3


def test_loss_ignores_minus_100_and_is_zero_when_nothing_is_trained():
    model = _tiny_model()
    x = torch.tensor([[1, 2, 3, 4]])
    t = torch.tensor([[2, -100, 4, -100]])
    with torch.no_grad():
        logits, loss = model(x, targets=t)
        ref = torch.nn.functional.cross_entropy(logits[0, [0, 2]], torch.tensor([2, 4]))
        assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
        assert model(x, targets=torch.full((1, 4), -100))[1].item() == 0.0


# ------------------------------------------------------------- checkpoint resume
class FakeLoader:
    """Deterministic synthetic batches whose position is its whole state."""

    def __init__(self, vocab=50, b=2, t=8, packed=False):
        self.vocab, self.b, self.t, self.i, self.packed = vocab, b, t, 0, packed

    def _batch(self, i, split):
        rs = np.random.RandomState(i + (1000 if split == "val" else 0))
        tok = torch.from_numpy(rs.randint(0, self.vocab, (self.b, self.t + 1)))
        mask = torch.from_numpy((rs.rand(self.b, self.t) > 0.3).astype(np.float32))
        return Batch(tok[:, :-1], tok[:, 1:], mask, trained_tokens=int(mask.sum()))

    def get_batch(self, split="train"):
        self.i += 1
        return self._batch(self.i - 1, split)

    def step_trained_tokens(self, accum_steps=1, split="train"):
        return sum(self._batch(self.i + k, split).trained_tokens for k in range(accum_steps))

    def state_dict(self):
        return {"i": np.int64(self.i)}  # numpy on purpose: the checkpoint must store it plainly

    def load_state_dict(self, d):
        self.i = int(d["i"])


def _run(tmp_path, s, *, stop_at=None, resume=None):
    torch.manual_seed(s.seed)
    model = gpt.GPT(s.model_config(50))
    opt = trainer.make_optimizer(model, s)
    loader = FakeLoader()
    start = 0
    if resume is not None:
        ck = trainer.load_checkpoint(resume)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        loader.load_state_dict(ck["loader"])
        trainer.set_rng_state(ck["rng"])
        start = ck["step"]
    path = tmp_path / "ckpt.pt"

    def checkpoint(step):
        trainer.save_checkpoint(path, model=model, optimizer=opt, loader=loader, step=step, settings=s,
                              dataset="fake")

    to_inputs = lambda b: trainer.step_inputs(b, post_training=True)  # noqa: E731
    return trainer.train_loop(model, opt, loader, s, to_inputs, start_step=start, stop_at=stop_at,
                            checkpoint=checkpoint, log=lambda *_: None), path


def test_stop_and_resume_gives_the_losses_of_an_uninterrupted_run(tmp_path):
    # dropout > 0: the resumed run must also restore the RNG to match
    s = trainer.TrainSettings(n_layer=1, n_embd=16, dropout=0.1, learning_rate=1e-2, min_lr=1e-3,
                            max_iters=8, warmup_pct=0.25)
    full, _ = _run(tmp_path / "a", s)
    first, ck = _run(tmp_path / "b", s, stop_at=3)
    assert first.stopped_by == "stop_at" and first.steps == [1, 2, 3]
    rest, _ = _run(tmp_path / "c", s, resume=ck)
    assert full.steps == list(range(1, 9)) and rest.steps == [4, 5, 6, 7, 8]
    assert first.losses + rest.losses == full.losses  # exactly, not approximately
    assert len(set(full.losses)) == 8


def test_checkpoint_errors(tmp_path):
    with pytest.raises(ConfigError, match="checkpoint .*nope.pt does not exist"):
        trainer.load_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="junk.pt is not a readable training checkpoint"):
        trainer.load_checkpoint(tmp_path / "junk.pt")
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="other.pt is not a checkpoint written by scripts/train.py"):
        trainer.load_checkpoint(tmp_path / "other.pt")
    torch.save({"format": trainer.CKPT_FORMAT, "version": 99}, tmp_path / "v99.pt")
    with pytest.raises(ConfigError, match="checkpoint version 99 is not supported"):
        trainer.load_checkpoint(tmp_path / "v99.pt")


def test_training_ends_when_the_loader_ends():
    class Ending(FakeLoader):
        def get_batch(self, split="train"):
            if self.i == 4:
                raise StopIteration
            return super().get_batch(split)

    s = trainer.TrainSettings(n_layer=1, n_embd=16, max_iters=100)
    torch.manual_seed(0)
    model = gpt.GPT(s.model_config(50))
    calls = []
    res = trainer.train_loop(model, trainer.make_optimizer(model, s), Ending(), s,
                           lambda b: trainer.step_inputs(b, post_training=True),
                           checkpoint=calls.append, log=lambda *_: None)
    assert res.stopped_by == "loader_end" and res.steps == [1, 2, 3, 4] and calls == [4]


# ------------------------------------------------- real runs on prepared datasets
def test_30_steps_lower_the_assistant_only_loss(byte_ds, tmp_path):
    cfg_path = train_config(tmp_path / "c.json")
    lines = []
    res = train.run(train_args(byte_ds, cfg_path, tmp_path / "out"), env={"POST_TRAINING": "1"}, log=lines.append)
    assert res.steps == list(range(1, 31)) and res.stopped_by == "max_iters"
    first, last = res.losses[0], sum(res.losses[-5:]) / 5
    assert first == pytest.approx(math.log(266), abs=0.3)  # an untrained model: about uniform
    assert last < 0.5 * first, res.losses
    # exactly the assistant tokens were trained: the loader's own masks for these 30 steps
    ref = make_loader(LoaderConfig.from_file(cfg_path), byte_ds, backend="numpy")
    assert res.trained_tokens == sum(int(ref.batch_at("train", i)[2].sum()) for i in range(30))
    assert res.tokens == 30 * 4 * 32 and 0 < res.trained_tokens < res.tokens / 2
    assert lines[0].startswith("model: ") and "assistant-only loss on" in lines[0]
    assert lines[1].startswith("step      9/30 | loss ") and "trained tok/s" in lines[1]  # 0-based, as --step
    assert (tmp_path / "out" / "ckpt.pt").is_file()
    assert len(list((tmp_path / "out" / "logs" / "audit").glob("audit_*.log"))) == 1


def test_cli_stop_and_resume_equal_an_uninterrupted_run(byte_ds, tmp_path):
    cfg = train_config(tmp_path / "c.json", max_iters=8, dropout=0.1, eval_interval=4, eval_iters=1)
    env = {"POST_TRAINING": "1", "WARMUP_PCT": "0.25"}
    quiet = lambda *_: None  # noqa: E731
    full = train.run(train_args(byte_ds, cfg, tmp_path / "a"), env=env, log=quiet)
    part = train.run(train_args(byte_ds, cfg, tmp_path / "b", "--stop-at", "3"), env=env, log=quiet)
    rest = train.run(train_args(byte_ds, cfg, tmp_path / "b", "--resume", str(tmp_path / "b" / "ckpt.pt")),
                     env=env, log=quiet)
    assert part.steps == [1, 2, 3] and rest.steps == [4, 5, 6, 7, 8]
    assert set(part.val_losses) == {3}  # a run always ends with a val loss
    assert part.losses + rest.losses == full.losses
    assert rest.val_losses == {4: full.val_losses[4], 8: full.val_losses[8]}


def test_tiny_json_and_tiny_xml_are_the_same_run_settings():
    a = train.resolve_settings(train.parse_args(["--dataset", "d", "--config", str(ROOT / "configs/sft/tiny.json")]), {})
    b = train.resolve_settings(train.parse_args(["--dataset", "d", "--config", str(ROOT / "configs/sft/tiny.xml")]), {})
    assert a[1] == b[1]
    strip = lambda c: {k: v for k, v in c.to_dict().items() if k not in trainer.TrainSettings.__dataclass_fields__}  # noqa: E731
    assert strip(a[0]) == strip(b[0])
    assert a[1].post_training is True and a[0].use_loss_mask is True
    off = train.resolve_settings(train.parse_args(["--dataset", "d", "--config", str(ROOT / "configs/sft/tiny.json"),
                                                   "--max-iters", "7"]), {"POST_TRAINING": "0"})
    assert off[1].post_training is False and off[0].use_loss_mask is False and off[1].max_iters == 7


def test_main_reports_errors_with_exit_codes(byte_ds, tmp_path, capsys):
    bad = train_config(tmp_path / "bad.json", n_layers=3)
    assert train.main(["--dataset", str(byte_ds), "--config", str(bad)]) == 1
    assert "unknown key(s) n_layers" in capsys.readouterr().err
    good = train_config(tmp_path / "good.json")
    ck = str(tmp_path / "x.pt")
    assert train.main(["--dataset", str(byte_ds), "--config", str(good), "--resume", ck, "--init-from", ck]) == 1
    assert "give --resume (continue a run) or --init-from" in capsys.readouterr().err
    assert train.main(["--dataset", str(tmp_path / "none"), "--config", str(good)]) == 1
    assert "dataset folder" in capsys.readouterr().err


def test_token_stream_dataset_trains_on_every_target_and_refuses_post_training(tmp_path):
    d = tmp_path / "stream" / "train"
    d.mkdir(parents=True)
    np.random.RandomState(0).randint(0, 40, 2000).astype(np.uint32).tofile(d / "tokens.bin")
    cfg = train_config(tmp_path / "c.json", use_loss_mask=False, vocab_size=40, max_iters=3)
    res = train.run(train_args(tmp_path / "stream", cfg, tmp_path / "out"), env={}, log=lambda *_: None)
    assert res.trained_tokens == res.tokens == 3 * 4 * 32
    with pytest.raises(ConfigError, match="POST_TRAINING=1 .* needs a dataset with loss masks"):
        train.run(train_args(tmp_path / "stream", cfg, tmp_path / "out2"), env={"POST_TRAINING": "1"}, log=lambda *_: None)


def test_init_from_starts_a_new_schedule_from_trained_weights(byte_ds, tmp_path):
    cfg = train_config(tmp_path / "c.json", max_iters=5)
    quiet = lambda *_: None  # noqa: E731
    base = train.run(train_args(byte_ds, cfg, tmp_path / "a"), env={"POST_TRAINING": "1"}, log=quiet)
    again = train.run(train_args(byte_ds, cfg, tmp_path / "b", "--init-from", str(tmp_path / "a" / "ckpt.pt")),
                      env={"POST_TRAINING": "1"}, log=quiet)
    assert again.steps == [1, 2, 3, 4, 5]  # a new run: step 1, warmup again
    assert again.losses[0] < base.losses[0] - 1.0  # but from the trained weights


# ------------------------------------------------------------------ packed datasets
@pytest.fixture(scope="module")
def packed_ds(byte_ds):
    out = byte_ds.parent / "chat_packed"
    pack(byte_ds, out, PackOptions(block_size=96))
    return out


def test_packed_rows_from_the_loader_give_the_per_episode_logits(packed_ds):
    cfg = LoaderConfig(batch_size=4, block_size=96, use_loss_mask=True, epoch_shuffle=False)
    loader = make_loader(cfg, packed_ds, backend="torch")
    model = _tiny_model(vocab=266)
    b = loader.get_batch("train")
    checked = 0
    with torch.no_grad():
        packed = model(b.x, b.position_ids, block_causal_mask(b.seq_ids))[0]
        assert torch.isfinite(packed).all()
        for r in range(b.x.shape[0]):
            for sid in b.seq_ids[r].unique().tolist():
                if sid == -1:
                    continue
                cols = (b.seq_ids[r] == sid).nonzero().flatten()
                assert cols.tolist() == list(range(int(cols[0]), int(cols[-1]) + 1))  # contiguous
                assert b.position_ids[r, cols].tolist() == list(range(len(cols)))
                alone = model(b.x[r, cols][None])[0][0]
                torch.testing.assert_close(packed[r, cols], alone, rtol=0, atol=1e-5)
                checked += 1
    assert checked > 4  # several episodes per row, or the test proves nothing


def test_packed_training_ends_with_the_loader_and_resumes_exactly(packed_ds, tmp_path):
    cfg = train_config(tmp_path / "c.json", block_size=96, batch_size=2, max_iters=1000, eval_interval=2, eval_iters=1)
    ref = make_loader(LoaderConfig.from_file(cfg), packed_ds, backend="numpy")
    total = ref.steps_total("train")
    assert 3 <= total < 10
    quiet = lambda *_: None  # noqa: E731
    env = {"POST_TRAINING": "1"}
    lines = []
    full = train.run(train_args(packed_ds, cfg, tmp_path / "a"), env=env, log=lines.append)
    assert full.steps == list(range(1, total + 1)) and full.stopped_by == "loader_end"
    assert f"warmup {round(0.1 * total)} of {total} steps" in lines[0]  # the schedule fits the one pass
    assert full.trained_tokens == sum(int(ref.batch_at("train", i).mask.sum()) for i in range(total))
    part = train.run(train_args(packed_ds, cfg, tmp_path / "b", "--stop-at", "2"), env=env, log=quiet)
    rest = train.run(train_args(packed_ds, cfg, tmp_path / "b", "--resume", str(tmp_path / "b" / "ckpt.pt")),
                     env=env, log=quiet)
    assert part.losses + rest.losses == full.losses
    assert rest.stopped_by == "loader_end" and rest.steps[-1] == total


def test_vocab_size_errors(byte_ds, tmp_path):
    d = tmp_path / "stream" / "train"
    d.mkdir(parents=True)
    np.arange(200, dtype=np.uint32).tofile(d / "tokens.bin")
    quiet = lambda *_: None  # noqa: E731
    with pytest.raises(ConfigError, match="records no tokenizer \\(no vocab size\\); set vocab_size in"):
        train.run(train_args(tmp_path / "stream", train_config(tmp_path / "a.json", use_loss_mask=False), tmp_path / "o"),
                  env={}, log=quiet)
    with pytest.raises(ConfigError, match="vocab_size 100 is smaller than the vocabulary .* \\(266\\)"):
        train.run(train_args(byte_ds, train_config(tmp_path / "b.json", vocab_size=100), tmp_path / "o"), env={}, log=quiet)


def test_resume_with_other_settings_says_so(byte_ds, tmp_path):
    quiet = lambda *_: None  # noqa: E731
    train.run(train_args(byte_ds, train_config(tmp_path / "a.json", max_iters=4), tmp_path / "o", "--stop-at", "2"),
              env={}, log=quiet)
    lines = []
    res = train.run(train_args(byte_ds, train_config(tmp_path / "b.json", max_iters=4, learning_rate=5e-3), tmp_path / "o",
                          "--resume", str(tmp_path / "o" / "ckpt.pt")), env={}, log=lines.append)
    assert res.steps == [3, 4]
    assert lines[0] == ("note: resuming with other settings than the checkpoint's (learning_rate); the run will "
                        "not match an uninterrupted one")


# ------------------------------------------------------- one script, every dataset
@pytest.fixture(scope="module")
def stream_ds(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream") / "stream"
    (d / "train").mkdir(parents=True)
    np.random.RandomState(0).randint(0, 263, 3000).astype(np.uint32).tofile(d / "train" / "tokens.bin")
    return d


@pytest.mark.parametrize("kind", ["episodes", "packed", "stream"])
def test_the_same_script_trains_every_kind_of_dataset(kind, byte_ds, packed_ds, stream_ds, tmp_path):
    """No branch on the loader's or the batch's type: the Batch and the loader's common
    answers (steps_total, end_id, vocab_size, mode) give each dataset its targets."""
    dataset, block = {"episodes": (byte_ds, 32), "packed": (packed_ds, 96), "stream": (stream_ds, 32)}[kind]
    cfg = train_config(tmp_path / "c.json", block_size=block, batch_size=2, max_iters=3, use_loss_mask=False,
                  vocab_size=263 if kind == "stream" else 0)
    lines = []
    res = train.run(train_args(dataset, cfg, tmp_path / "out"), env={"POST_TRAINING": "0"}, log=lines.append)
    assert res.steps == [1, 2, 3] and res.tokens == 3 * 2 * block
    ref = make_loader(LoaderConfig.from_file(cfg), dataset, backend="numpy")
    assert f"| {ref.mode} |" in lines[0] and f"vocab {263 if kind == 'stream' else 266}" in lines[0]
    batches = [ref.get_batch("train") for _ in range(3)]
    if kind == "episodes":  # no mask: every target up to the episode's EOS, none on padding
        lengths = ref.source.ds.split("train").lengths
        want = sum(int(min(lengths[g], block + 1)) - 1 for s in range(3) for g in ref.batch_ids("train", s))
    elif kind == "packed":  # every target inside a segment
        want = sum(int(b.mask.sum()) for b in batches)
    else:  # token windows: every target
        want = res.tokens
    assert res.trained_tokens == want and 0 < want <= res.tokens
    for script in ("train.py", "trainer.py"):
        assert "hasattr(" not in (ROOT / "scripts" / script).read_text()
