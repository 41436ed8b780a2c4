"""``replay-order`` on pairs, KTO rows and RL prompts: the pairs of a step and their input
records, exactly those the pair loader gave (ranks, token budgets, epochs, audit log)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.loader import LoaderConfig, make_pair_loader
from sftdata.replay.dataset import check_audit_log, replay_order
from tests.helpers.pairs import PAIR_LENGTHS, write_rows

runner = CliRunner()


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return write_rows(tmp_path_factory.mktemp("p") / "pairs", "pairs", PAIR_LENGTHS, rows_per_shard=4,
                      records=[40 + 3 * r for r in range(9)])


def cfg(**kw) -> LoaderConfig:
    return LoaderConfig(**{"batch_size": 2, "block_size": 12, "epoch_seed": 3, **kw})


@pytest.mark.parametrize("kw", [{}, {"batch_tokens": 48}], ids=["batch_size", "batch_tokens"])
def test_each_step_lists_the_pairs_and_records_the_loader_gave(pairs, kw):
    loader = make_pair_loader(cfg(**kw), pairs, backend="numpy")
    for step in range(6):
        b = loader.get_batch("train")
        r = replay_order(pairs, cfg(**kw), step=step)
        assert r.items == "pairs" and list(r.columns)[5] == "pair"
        assert r.columns["pair"].tolist() == b.ids.tolist()
        assert r.columns["record"].tolist() == b.records.tolist() == [40 + 3 * i for i in b.ids.tolist()]
        assert r.columns["length"].tolist() == [sum(PAIR_LENGTHS[i]) for i in b.ids.tolist()]
        assert r.columns["shard"].tolist() == [i // 4 for i in b.ids.tolist()]


def test_each_rank_lists_its_own_pairs(pairs):
    loaders = [make_pair_loader(cfg(), pairs, backend="numpy", rank=k, world_size=2) for k in range(2)]
    for step in range(3):
        for k, loader in enumerate(loaders):
            r = replay_order(pairs, cfg(), step=step, rank=k, world_size=2)
            assert r.columns["pair"].tolist() == loader.get_batch("train").ids.tolist()


def test_an_epoch_lists_every_pair_once_with_the_step_that_trains_it(pairs):
    r = replay_order(pairs, cfg(), epoch=1)
    assert r.columns["pair"].tolist() == np.random.RandomState(4).permutation(9).tolist()
    assert r.columns["step"].tolist() == [4, 4, 5, 5, 6, 6, 7, 7, -1]  # 4 steps an epoch, the last pair dropped


def test_the_pair_loaders_audit_log_checks_against_the_replay(pairs, tmp_path):
    loader = make_pair_loader(cfg(), pairs, backend="numpy", audit_dir=tmp_path / "audit")
    for _ in range(9):
        loader.get_batch("train")
    log = next((tmp_path / "audit").glob("audit_*.log"))
    res = check_audit_log(pairs, cfg(), log)
    assert res.ok and res.checked == 3


def test_the_command_line_names_pairs_and_their_records(pairs):
    r = runner.invoke(app, ["replay-order", str(pairs), "--step", "0", "--batch-size", "2", "--seed", "3", "--csv"])
    assert r.exit_code == 0, r.output
    first = np.random.RandomState(3).permutation(9)[:2].tolist()
    assert r.stdout.splitlines() == ["step,rank,slot,epoch,position,pair,shard,length,record"] + [
        f"0,0,{k},0,{k},{p},shard_{p // 4:05d},{sum(PAIR_LENGTHS[p])},{40 + 3 * p}" for k, p in enumerate(first)]
    j = runner.invoke(app, ["replay-order", str(pairs), "--step", "0", "--batch-size", "2", "--seed", "3", "--json"])
    out = orjson.loads(j.stdout)
    assert (out["items"], out["num_episodes"], [row["pair"] for row in out["rows"]]) == ("pairs", 9, first)


def test_kto_rows_and_rl_prompts_replay_their_own_ids(tmp_path):
    kto = write_rows(tmp_path / "k", "kto", [(2, 3), (3, 2), (1, 4), (2, 2)])
    r = replay_order(kto, cfg(), step=1)
    assert r.items == "rows" and "row" in r.columns
    assert r.columns["row"].tolist() == make_pair_loader(cfg(), kto, backend="numpy").batch_at("train", 1).ids.tolist()
    rl = write_rows(tmp_path / "q", "prompts", [(2,), (3,), (4,)])
    r = replay_order(rl, cfg(batch_size=1), step=2)
    assert r.items == "prompts" and r.columns["prompt"].tolist() == [np.random.RandomState(3).permutation(3)[2]]
