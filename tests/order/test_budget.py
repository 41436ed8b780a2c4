"""Token-budget batches (sftdata.order.budget, LoaderConfig.batch_tokens): deterministic from
the seed, within the budget, one micro-batch per rank per step, replayed by replay-order,
resumed by state_dict, and refused where they do not apply."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import ConfigError, UsageError
from sftdata.interop import SFTDataset, SFTSampler
from sftdata.loader import make_loader
from sftdata.order.budget import TokenBudgetOrder, budget_bounds, episode_batch_order
from sftdata.order.config import LoaderConfig
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.replay.dataset import replay_order
from tests.helpers.data import write_jsonl

runner = CliRunner()


def test_budget_bounds_the_documented_example_and_a_row_wider_than_the_budget():
    assert budget_bounds(np.array([5, 3, 4, 6, 6, 2, 2, 2, 2, 2, 8, 3]), 12).tolist() == [0, 2, 4, 6, 10, 11, 12]
    assert budget_bounds(np.array([20, 1, 1]), 12).tolist() == [0, 1, 3]  # one row alone, even past the budget
    assert budget_bounds(np.zeros(0, np.int64), 12).tolist() == [0]


@pytest.mark.parametrize("seed", range(12))
def test_every_batch_fits_and_every_step_has_one_batch_per_rank(seed):
    rs = np.random.RandomState(seed)
    n, world, budget = int(rs.randint(20, 200)), int(rs.randint(1, 5)), int(rs.randint(64, 400))
    widths = rs.randint(1, 64, n)
    ids = np.sort(rs.choice(10 * n, n, replace=False))
    o = TokenBudgetOrder(ids, widths, budget=budget, world_size=world, seed=seed)
    width_of = dict(zip(ids.tolist(), widths.tolist()))
    for epoch in range(3):
        seen = []
        for step in range(o.first_step_of_epoch(epoch), o.first_step_of_epoch(epoch + 1)):
            got, rank, slot, ep, pos = o.step_table(step)
            assert (ep == epoch).all() and sorted(set(rank.tolist())) == list(range(world))
            for r in range(world):
                w = [width_of[i] for i in got[rank == r].tolist()]
                assert len(w) * max(w) <= budget and slot[rank == r].tolist() == list(range(len(w)))
                assert o.step_ids(step, r).tolist() == got[rank == r].tolist()
            seen += got.tolist()
        assert len(seen) == len(set(seen))  # nothing twice in an epoch
        order = o.epoch_order(epoch).tolist()
        assert seen == order[:len(seen)]  # the documented epoch order, its tail left for the next shuffle
        stp, rk, sl = o.epoch_table(epoch)
        assert (stp[:len(seen)] >= 0).all() and (stp[len(seen):] == -1).all()
    again = TokenBudgetOrder(ids, widths, budget=budget, world_size=world, seed=seed)
    assert again.step_ids(o.first_step_of_epoch(2) + 1).tolist() == o.step_ids(o.first_step_of_epoch(2) + 1).tolist()


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    d = tmp_path_factory.mktemp("budget")
    rs = np.random.RandomState(3)
    recs = [{"messages": [{"role": "user", "content": "hi " * int(rs.randint(1, 30))},
                          {"role": "assistant", "content": "hello there " * int(rs.randint(1, 40))}]} for _ in range(90)]
    prepare([write_jsonl(d / "c.jsonl", recs)], d / "ds", PrepareOptions())
    return d / "ds"


CFG = LoaderConfig(batch_size=3, block_size=64, batch_tokens=256, use_loss_mask=True, epoch_seed=5)


def test_the_loader_gives_every_rank_a_batch_within_the_budget_each_step(ds):
    loaders = [make_loader(CFG, ds, backend="numpy", rank=r, world_size=3) for r in range(3)]
    o = loaders[0].order("train")
    steps = o.first_step_of_epoch(2) + 2  # into the third epoch
    widths = set()
    for step in range(steps):
        n = loaders[0].step_trained_tokens(1)
        batches = [lo.get_batch("train") for lo in loaders]
        assert all(b.x.shape[0] * b.x.shape[1] <= 256 and b.x.shape == b.y.shape == b.mask.shape for b in batches)
        widths |= {b.x.shape[1] for b in batches}
        assert sum(b.trained_tokens for b in batches) == n
        ids = np.concatenate([lo.last_ids["train"] for lo in loaders])
        r = replay_order(ds, CFG, step=step, world_size=3)
        assert r.columns["episode"].tolist() == ids.tolist() and r.batch_size is None and r.batch_tokens == 256
    assert len(widths) > 1  # rows are padded to the batch's longest row, not to block_size
    state = loaders[1].state_dict()
    resumed = make_loader(CFG, ds, backend="numpy", rank=1, world_size=3)
    resumed.load_state_dict(state)
    a, b = resumed.get_batch("train"), loaders[1].get_batch("train")
    assert np.array_equal(a.x, b.x) and np.array_equal(a.mask, b.mask)
    other = make_loader(CFG.replace(batch_tokens=512), ds, backend="numpy", rank=1, world_size=3)
    with pytest.raises(ConfigError, match="batch_tokens: saved 256, now 512"):
        other.load_state_dict(state)


def test_replay_order_cli_takes_batch_tokens(ds, tmp_path):
    lo = make_loader(CFG, ds, backend="numpy", rank=1, world_size=2)
    for _ in range(4):
        lo.get_batch("train")
    r = runner.invoke(app, ["replay-order", str(ds), "--batch-tokens", "256", "--block-size", "64", "--seed", "5",
                            "--world-size", "2", "--rank", "1", "--step", "3", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [row["episode"] for row in out["rows"]] == lo.last_ids["train"].tolist() and out["batch_tokens"] == 256
    assert [row["slot"] for row in out["rows"]] == list(range(len(out["rows"])))
    table = runner.invoke(app, ["replay-order", str(ds), "--batch-tokens", "256", "--block-size", "64", "--seed", "5"])
    assert table.exit_code == 0 and "batches of up to 256 tokens x 1 rank(s)" in table.output


def test_batch_tokens_is_refused_where_it_does_not_apply(ds, tmp_path):
    lengths = np.array([10, 20, 30])
    with pytest.raises(ConfigError, match="batch_tokens 32 is smaller than one row of block_size 64"):
        episode_batch_order(LoaderConfig(block_size=64, batch_tokens=32), lengths)
    with pytest.raises(ConfigError, match="batch_tokens needs epoch_drop_last=true"):
        episode_batch_order(LoaderConfig(block_size=64, batch_tokens=128, epoch_drop_last=False), lengths)
    with pytest.raises(ConfigError, match="batch_tokens needs batch_sampling_mode=epoch"):
        episode_batch_order(LoaderConfig(block_size=64, batch_tokens=128, batch_sampling_mode="random"), lengths)
    with pytest.raises(ConfigError, match="fewer than one per rank"):
        episode_batch_order(LoaderConfig(block_size=64, batch_tokens=1000), lengths, world_size=4)
    with pytest.raises(ConfigError, match="batch_tokens must be null or an integer >= 1, got 0"):
        LoaderConfig(batch_tokens=0)
    pack(ds, tmp_path / "p", PackOptions(block_size=128))
    with pytest.raises(ConfigError, match="is packed: every row already holds block_size"):
        make_loader(LoaderConfig(block_size=128, batch_tokens=512), tmp_path / "p", backend="numpy")
    with pytest.raises(UsageError, match="--batch-tokens is for episodes datasets"):
        replay_order(tmp_path / "p", LoaderConfig(block_size=128, batch_tokens=512))
    with pytest.raises(ConfigError, match="batch_tokens does not apply to token windows"):
        make_loader(LoaderConfig(block_size=64, batch_tokens=512, dataset_mode="token_stream"), ds, backend="numpy")
    with pytest.raises(ConfigError, match="pad_to_multiple_of is for packed rows"):
        make_loader(LoaderConfig(block_size=64, pad_to_multiple_of=8), ds, backend="numpy")


def test_the_interop_sampler_refuses_batch_tokens(ds):
    with pytest.raises(ConfigError, match="batch_tokens sizes the batches of sftdata's own Loader"):
        SFTSampler(SFTDataset(ds), LoaderConfig(block_size=64, batch_tokens=256))
