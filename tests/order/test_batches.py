"""The order contract (docs/ARCHITECTURE.md §4): which item ids are in step N on rank R."""

import numpy as np
import pytest

from sftdata.errors import ConfigError, UsageError
from sftdata.order.batches import BatchOrder, StepEvent, eligible_ids, episode_order, epoch_permutation, random_draws, row_order
from sftdata.order.config import LoaderConfig


def stream(o: BatchOrder, steps: int) -> np.ndarray:
    return np.concatenate([o.step_ids(s) for s in range(steps)])


@pytest.mark.parametrize("seed", [0, 42, 1337])
@pytest.mark.parametrize("n", [1, 7, 504])
def test_order_is_the_documented_permutation_when_nothing_is_filtered(seed, n):
    lengths = np.full(n, 5)
    o = BatchOrder(eligible_ids(lengths, 2), batch_size=1, seed=seed)
    for epoch in range(4):
        expected = np.random.RandomState(seed + epoch).permutation(n)
        assert o.epoch_order(epoch).tolist() == expected.tolist()


def test_filtered_order_permutes_the_eligible_ids():
    lengths = np.array([5, 1, 3, 0, 2, 9, 1])
    ids = eligible_ids(lengths, 2)
    assert ids.tolist() == [0, 2, 4, 5]
    o = BatchOrder(ids, batch_size=2, seed=7)
    assert o.epoch_order(3).tolist() == ids[np.random.RandomState(10).permutation(4)].tolist()


def test_no_shuffle_keeps_id_order():
    o = BatchOrder(np.array([3, 5, 8]), batch_size=2, shuffle=False, drop_last=False)
    assert stream(o, 4).tolist() == [3, 5, 8, 3, 5, 8, 3, 5]


@pytest.mark.parametrize("n,bs,ws", [(7, 3, 1), (10, 2, 2), (5, 4, 2), (3, 2, 3), (12, 4, 3), (1, 1, 1)])
def test_without_drop_last_the_stream_is_the_concatenation_of_epoch_orders(n, bs, ws):
    o = BatchOrder(np.arange(n) * 10, batch_size=bs, world_size=ws, seed=3, drop_last=False)
    g = bs * ws
    steps = -(-4 * n // g)  # enough to cover 4 epochs
    got = stream(o, steps)
    expected = np.concatenate([o.epoch_order(e) for e in range(4)])
    assert got[:4 * n].tolist() == expected.tolist()
    for e in range(4):  # every item exactly once per epoch
        assert sorted(got[e * n:(e + 1) * n].tolist()) == (np.arange(n) * 10).tolist()
    # the epoch of a step is the epoch of its first item; the counts agree
    for s in range(steps):
        assert o.epoch_of_step(s) == s * g // n
    for e in range(4):
        assert o.first_step_of_epoch(e) == sum(o.batches_in_epoch(k) for k in range(e))


def test_drop_last_drops_each_epoch_tail():
    o = BatchOrder(np.arange(7), batch_size=3, seed=5, drop_last=True)
    assert o.batches_in_epoch(0) == 2
    assert o.step_ids(0).tolist() == o.epoch_order(0)[:3].tolist()
    assert o.step_ids(1).tolist() == o.epoch_order(0)[3:6].tolist()
    assert o.step_ids(2).tolist() == o.epoch_order(1)[:3].tolist()  # epoch 0's 7th item is dropped
    assert [o.epoch_of_step(s) for s in range(5)] == [0, 0, 1, 1, 2]
    assert o.first_step_of_epoch(3) == 6


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("sampling", ["epoch", "random"])
def test_ranks_partition_the_single_process_batch(drop_last, sampling):
    ids = np.arange(23) + 100
    multi = BatchOrder(ids, batch_size=3, world_size=4, seed=11, drop_last=drop_last, sampling=sampling)
    single = BatchOrder(ids, batch_size=12, world_size=1, seed=11, drop_last=drop_last, sampling=sampling)
    for step in range(6):
        parts = [multi.step_ids(step, r) for r in range(4)]
        assert all(p.shape == (3,) for p in parts)
        assert np.concatenate(parts).tolist() == single.step_ids(step).tolist() == multi.step_ids(step).tolist()


def test_random_mode_is_seeded_uniform_with_replacement():
    ids = np.array([2, 4, 6, 8, 10])
    o = BatchOrder(ids, batch_size=4, world_size=2, seed=9, sampling="random")
    again = BatchOrder(ids, batch_size=4, world_size=2, seed=9, sampling="random")
    for step in (0, 1, 57):
        draws = np.random.default_rng([9, step]).integers(0, 5, size=8)
        assert o.step_ids(step).tolist() == ids[draws].tolist() == again.step_ids(step).tolist()
        assert o.step_ids(step, 1).tolist() == ids[draws[4:]].tolist()
    other = BatchOrder(ids, batch_size=4, world_size=2, seed=10, sampling="random")
    assert any(other.step_ids(s).tolist() != o.step_ids(s).tolist() for s in range(3))
    assert o.step_events(0) == []
    assert random_draws(9, 3, 5, 8).tolist() == np.random.default_rng([9, 3]).integers(0, 5, 8).tolist()


def test_random_mode_covers_uniformly():
    o = BatchOrder(np.arange(10), batch_size=100, seed=1, sampling="random")
    counts = np.bincount(stream(o, 100), minlength=10)
    assert counts.sum() == 10_000 and counts.min() > 850 and counts.max() < 1150


def test_step_events_without_drop_last():
    o = BatchOrder(np.arange(5), batch_size=2, drop_last=False)
    ev = [o.step_events(s) for s in range(6)]
    assert ev[0] == [StepEvent("epoch_start", 0)]
    assert ev[1] == []
    assert ev[2] == [StepEvent("epoch_complete", 0, 5), StepEvent("epoch_start", 1)]
    assert ev[4] == [StepEvent("epoch_complete", 1, 5)]
    assert ev[5] == [StepEvent("epoch_start", 2)]
    tiny = BatchOrder(np.arange(2), batch_size=5, drop_last=False)  # one batch spans several epochs
    assert [e.kind + str(e.epoch) for e in tiny.step_events(0)] == [
        "epoch_start0", "epoch_complete0", "epoch_start1", "epoch_complete1", "epoch_start2"]


def test_step_events_with_drop_last():
    o = BatchOrder(np.arange(5), batch_size=2, drop_last=True)
    assert o.step_events(0) == [StepEvent("epoch_start", 0)]
    assert o.step_events(1) == [StepEvent("epoch_complete", 0, 4)]
    assert o.step_events(2) == [StepEvent("epoch_start", 1)]
    one = BatchOrder(np.arange(3), batch_size=2, drop_last=True)  # one batch per epoch
    assert one.step_events(4) == [StepEvent("epoch_start", 4), StepEvent("epoch_complete", 4, 2)]


def test_epoch_orders_are_memoised_and_read_only():
    o = BatchOrder(np.arange(50), batch_size=4)
    a = o.epoch_order(2)
    assert o.epoch_order(2) is a
    with pytest.raises(ValueError):
        a[0] = 1
    o.epoch_order(3), o.epoch_order(4)
    assert sorted(o._cache) == [3, 4]


def test_errors():
    with pytest.raises(ConfigError, match="no eligible item"):
        BatchOrder(np.empty(0, np.int64), batch_size=2)
    with pytest.raises(ConfigError, match="fewer than one global batch of 6 .*epoch_drop_last=false"):
        BatchOrder(np.arange(5), batch_size=3, world_size=2, drop_last=True)
    with pytest.raises(ConfigError, match="choose one of: epoch, random"):
        BatchOrder(np.arange(5), batch_size=1, sampling="shuffled")
    with pytest.raises(ConfigError, match="must be >= 1"):
        BatchOrder(np.arange(5), batch_size=0)
    with pytest.raises(ConfigError, match="seed -1 is outside"):
        BatchOrder(np.arange(5), batch_size=1, seed=-1)
    o = BatchOrder(np.arange(5), batch_size=1, world_size=2)
    with pytest.raises(UsageError, match="step must be >= 0"):
        o.step_ids(-1)
    with pytest.raises(UsageError, match="rank 2 is outside 0..1"):
        o.step_ids(0, 2)
    with pytest.raises(UsageError, match="epoch must be >= 0"):
        o.epoch_order(-1)
    r = BatchOrder(np.arange(5), batch_size=1, sampling="random")
    with pytest.raises(UsageError, match="needs batch_sampling_mode=epoch"):
        r.epoch_order(0)
    with pytest.raises(ConfigError, match="outside 0..4294967295"):
        epoch_permutation(3, 2**32 - 1, 1)



# ------------------------------------------------------------------- one pass
@pytest.mark.parametrize("drop_last, total", [(True, 3), (False, 4)])
def test_a_one_pass_order_is_epoch_0_then_ends(drop_last, total):
    o = BatchOrder(7, batch_size=1, world_size=2, seed=3, drop_last=drop_last, one_pass=True, items="rows")
    assert o.steps_total == total == o.batches_in_epoch(0)
    got = np.concatenate([o.step_ids(s) for s in range(total)])
    order = np.random.RandomState(3).permutation(7)
    if drop_last:
        assert got.tolist() == order[:6].tolist()  # the last row is not trained
    else:
        assert got.tolist() == order.tolist() + [-1]  # a padding slot, not a row of epoch 1
    assert o.step_ids(total - 1, 1).tolist() == ([order[5]] if drop_last else [-1])
    events = [ev for s in range(total) for ev in o.step_events(s)]
    assert events == [StepEvent("epoch_start", 0), StepEvent("epoch_complete", 0, 6 if drop_last else 7)]
    with pytest.raises(UsageError, match=rf"step {total} is outside the one pass over the rows \(steps 0..{total - 1}\)"):
        o.step_ids(total)
    with pytest.raises(UsageError, match="outside the one pass"):
        o.step_events(total)
    assert BatchOrder(np.arange(5), batch_size=2).steps_total is None  # endless


def test_a_count_is_the_ids_0_to_n_minus_1():
    for kw in (dict(), dict(shuffle=False, drop_last=False), dict(sampling="random")):
        a = BatchOrder(9, batch_size=2, seed=4, **kw)
        b = BatchOrder(np.arange(9), batch_size=2, seed=4, **kw)
        assert a.n == 9 and a.ids.tolist() == list(range(9))
        assert all(a.step_ids(s).tolist() == b.step_ids(s).tolist() for s in range(12))
    huge = BatchOrder(10**12, batch_size=3, seed=1, sampling="random")  # never materialised
    assert huge.step_ids(5).tolist() == random_draws(1, 5, 10**12, 3).tolist()


def test_slots_of_each_rank():
    o = BatchOrder(np.arange(20), batch_size=3, world_size=2)
    assert o.slots(None).tolist() == [0, 1, 2, 3, 4, 5] and o.slots(1).tolist() == [3, 4, 5]


def test_split_orders_from_the_loader_settings():
    cfg = LoaderConfig(batch_size=2, epoch_seed=9, episode_min_tokens=3, epoch_drop_last=False)
    e = episode_order(cfg, np.array([5, 1, 3, 2, 8]), world_size=1, what="split 'train' of d")
    assert e.ids.tolist() == [0, 2, 4] and e.steps_total is None and e.items == "episodes"
    assert e.epoch_order(0).tolist() == np.array([0, 2, 4])[np.random.RandomState(9).permutation(3)].tolist()
    r = row_order(cfg, 5, world_size=1)
    assert r.steps_total == 3 and r.ids.tolist() == [0, 1, 2, 3, 4]  # every row, whatever its length
    with pytest.raises(ConfigError, match="read once in epoch order .* batch_sampling_mode='random' is not "
                                          "supported, leave it null or set it to epoch"):
        row_order(cfg.replace(batch_sampling_mode="random"), 5)
    with pytest.raises(ConfigError, match="a one-pass order needs batch_sampling_mode=epoch"):
        BatchOrder(5, batch_size=1, sampling="random", one_pass=True)


def test_every_order_answers_the_one_declared_interface():
    """The loader, the samplers, replay-order and the audit log ask any order the same
    questions (``Order``): a batch order, token-budget batches and a mixture answer them."""
    from fractions import Fraction

    from sftdata.order import Order
    from sftdata.order.budget import TokenBudgetOrder
    from sftdata.order.mixture import MemberItems, MixtureOrder

    orders = [BatchOrder(np.arange(6), batch_size=2),
              TokenBudgetOrder(np.arange(6), np.full(6, 3, np.int64), budget=6),
              MixtureOrder([MemberItems(np.arange(4), np.ones(4, np.int64), 4),
                            MemberItems(np.arange(3), np.ones(3, np.int64), 3)], [Fraction(1, 2), Fraction(1, 2)],
                           batch_size=2)]
    members = [m for m in dir(Order) if not m.startswith("_")]
    for o in orders:
        assert isinstance(o, Order), type(o).__name__
        assert [m for m in members if not hasattr(o, m)] == [], type(o).__name__
        assert o.epoch_size(0) == len(o.epoch_order(0))
        first = o.step_ids(0)
        assert np.isin(first, o.epoch_order(0)).all()
        assert o.epoch_of_step(o.first_step_of_epoch(1)) == 1
