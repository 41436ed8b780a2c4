"""Loss normalisation: every Batch carries its trained-token count, the loader gives the
count of a whole optimizer step (grad accumulation x ranks) before its micro-batches are
consumed, and scripts/train.py's loss is exactly invariant to how a step is split."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from sftdata.errors import ConfigError
from sftdata.loader import Loader, make_loader
from sftdata.order.config import LoaderConfig
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare

torch = pytest.importorskip("torch")
import gpt  # noqa: E402
import train  # noqa: E402
import trainer  # noqa: E402


def _conversations(n=40):
    rs = np.random.RandomState(0)
    out = []
    for i in range(n):
        a, b = int(rs.randint(1, 8)), int(rs.randint(1, 12))
        msgs = [{"role": "user", "content": "add " * a}, {"role": "assistant", "content": "sum " * b}]
        if i % 2:
            msgs += [{"role": "user", "content": "and?"}, {"role": "assistant", "content": "done " * (b % 7 + 1)}]
        out.append({"messages": msgs})
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("norm")
    (d / "bytes.tiktoken").write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _conversations()))
    prepare([d / "chat.jsonl"], d / "ds", PrepareOptions(tokenizer=str(d / "bytes.tiktoken")))
    pack(d / "ds", d / "packed", PackOptions(block_size=128))
    return d


@pytest.mark.parametrize("kind", ["ds", "packed", "windows"])
@pytest.mark.parametrize("use_mask", [True, False])
@pytest.mark.parametrize("world_size", [1, 3])
def test_the_step_count_is_the_sum_of_every_ranks_batch_counts(data, kind, use_mask, world_size):
    block = 128 if kind == "packed" else 64
    cfg = LoaderConfig(batch_size=2, block_size=block, use_loss_mask=use_mask, epoch_drop_last=False,
                       dataset_mode="token_stream" if kind == "windows" else None)
    path = data / ("ds" if kind == "windows" else kind)
    loaders = [make_loader(cfg, path, backend="numpy", rank=r, world_size=world_size) for r in range(world_size)]
    total = loaders[0].steps_total()
    for _ in range(3):
        if total is not None and loaders[0].step() + 2 > total:
            break
        want = loaders[0].step_trained_tokens(2)
        assert [lo.step_trained_tokens(2) for lo in loaders] == [want] * world_size  # no communication needed
        batches = [lo.get_batch("train") for lo in loaders for _ in range(2)]
        masks = [b.mask if b.mask is not None else None for b in batches]
        assert sum(b.trained_tokens for b in batches) == want > 0
        if all(m is not None for m in masks):
            assert want == sum(int(np.count_nonzero(m)) for m in masks)
    if kind == "windows":
        assert batches[0].trained_tokens == 2 * block


def test_a_one_pass_order_counts_nothing_past_its_end_and_accum_is_checked(data):
    lo = make_loader(LoaderConfig(batch_size=2, block_size=128, use_loss_mask=True, epoch_drop_last=False),
                     data / "packed", backend="numpy")
    total = lo.steps_total()
    assert lo.step_trained_tokens(3, start=total - 1) == lo.trained_tokens_at("train", total - 1)
    assert lo.step_trained_tokens(1, start=total) == 0
    with pytest.raises(ConfigError, match="accum_steps must be at least 1, got 0"):
        lo.step_trained_tokens(0)


def test_a_torch_batch_keeps_its_count_as_an_int(data):
    lo = make_loader(LoaderConfig(batch_size=2, block_size=64, use_loss_mask=True), data / "ds", backend="torch")
    b = lo.get_batch("train")
    assert isinstance(b.x, torch.Tensor) and isinstance(b.trained_tokens, int)
    assert b.trained_tokens == int(b.mask.sum())
    assert len(tuple(b)) == 3  # x, y, mask: the count is not part of the tuple form


def _grads(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("kind", ["ds", "packed"])
def test_four_accumulated_micro_batches_give_the_loss_and_gradient_of_one_batch(data, kind):
    block = 128 if kind == "packed" else 64
    base = dict(block_size=block, use_loss_mask=True, epoch_seed=7)
    big = make_loader(LoaderConfig(batch_size=8, **base), data / kind, backend="torch")
    small = make_loader(LoaderConfig(batch_size=2, **base), data / kind, backend="torch")
    s = trainer.TrainSettings(n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = gpt.GPT(s.model_config(266))

    def inputs(loader, b):
        return trainer.step_inputs(b, post_training=True, end_id=loader.end_id, mask_fn=gpt.block_causal_mask)

    n = big.step_trained_tokens(1)
    assert small.step_trained_tokens(4) == n  # the same 8 rows
    model.zero_grad()
    one = trainer.micro_loss(model, inputs(big, big.get_batch("train")), n)
    one.backward()
    g_one = _grads(model).clone()
    model.zero_grad()
    acc = 0.0
    sizes, micro = [], []
    for _ in range(4):
        b = small.get_batch("train")
        sizes.append(b.trained_tokens)
        micro.append(inputs(small, b))
        part = trainer.micro_loss(model, micro[-1], n)
        part.backward()
        acc += part.item()
    assert len(set(sizes)) > 1  # micro-batches of unequal trained counts: a per-batch mean would differ
    assert acc == pytest.approx(one.item(), abs=1e-6)
    assert torch.allclose(_grads(model), g_one, atol=1e-6, rtol=0)
    naive = sum(model(i.x, i.position_ids, i.attn_mask, i.targets)[1].item() for i in micro) / 4
    assert abs(naive - one.item()) > 1e-4  # the mean of micro-batch means is not the step's mean


def test_train_py_loss_is_invariant_to_grad_accumulation(data, tmp_path):
    def run(batch_size, accum):
        cfg = tmp_path / f"c{batch_size}.json"
        cfg.write_text(json.dumps({"batch_size": batch_size, "grad_accum_steps": accum, "block_size": 64, "n_layer": 1,
                                   "n_head": 2, "n_embd": 16, "max_iters": 3, "eval_interval": 0,
                                   "checkpoint_interval": 0, "use_loss_mask": True, "learning_rate": 1e-3,
                                   "min_lr": 1e-4}))
        args = train.parse_args(["--dataset", str(data / "ds"), "--config", str(cfg), "--out-dir",
                                 str(tmp_path / f"o{batch_size}"), "--no-audit", "--quiet"])
        return train.run(args, env={}, log=lambda *_: None)

    one, four = run(8, 1), run(2, 4)
    assert one.steps == four.steps == [1, 2, 3]
    assert four.losses == pytest.approx(one.losses, abs=1e-6)
    assert four.trained_tokens == one.trained_tokens
    assert isinstance(Loader, type)
