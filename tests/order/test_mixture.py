"""The mixture order: exact weights per epoch, repetition and subsampling, epochs that
differ, steps computed directly, disjoint ranks; the mixture file's checks."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from sftdata.errors import ConfigError, DatasetError
from sftdata.order.mixture import MemberItems, MixtureOrder
from sftdata.store.mixture import Mixture, MixtureMember, check_mixture, mixture_from_dict

SHA = "0" * 64


def members(*sizes, tokens=None):
    out = []
    for i, n in enumerate(sizes):
        t = np.full(n, 10, dtype=np.int64) if tokens is None else np.asarray(tokens[i], dtype=np.int64)
        out.append(MemberItems(np.arange(n, dtype=np.int64), t, n))
    return out


def order(sizes, weights, **kw):
    kw.setdefault("batch_size", 4)
    total = sum(weights)
    return MixtureOrder(members(*sizes, tokens=kw.pop("tokens", None)), [Fraction(w) / total for w in weights], **kw)


@pytest.mark.parametrize("seed", range(12))
def test_rows_shares_are_exact_in_every_epoch(seed):
    o = order([37, 1000], [0.8, 0.2], seed=seed)
    n = 1037
    for e in range(5):
        counts = o.member_counts(e)
        assert sum(counts) == o.epoch_size(e)
        assert abs(counts[0] - 0.8 * n) < 1 and abs(counts[1] - 0.2 * n) < 1
        # through any epoch, within half an item of the exact share
        assert abs(o.stream_end(0, e) - Fraction(4, 5) * n * (e + 1)) <= Fraction(1, 2)


def test_80_20_of_1037_items():
    o = order([37, 1000], [4, 1])
    assert [o.member_counts(e) for e in range(3)] == [[830, 207], [829, 208], [830, 207]]


def test_a_small_member_is_repeated_pass_by_pass_and_a_large_one_subsampled_without_repeats():
    o = order([10, 1000], [0.5, 0.5], seed=3)
    small = np.concatenate([o.member_items(0, e) for e in range(2)])
    # 505 per epoch: every item once per pass of 10 before any item again
    for k in range(small.size // 10):
        assert sorted(small[k * 10:(k + 1) * 10].tolist()) == list(range(10))
    big = np.concatenate([o.member_items(1, e) for e in range(2)])  # 505 + 505 > 1000: one pass, then the next
    assert sorted(big[:1000].tolist()) == list(range(1000))
    assert len(set(o.member_items(1, 0).tolist())) == 505


def test_epochs_differ_and_the_order_is_a_pure_function():
    a, b = order([30, 50], [1, 1], seed=7), order([30, 50], [1, 1], seed=7)
    assert np.array_equal(a.epoch_order(3), b.epoch_order(3))  # b never computed epochs 0..2
    assert not np.array_equal(a.epoch_order(0), a.epoch_order(1))
    assert not np.array_equal(a.epoch_order(0), order([30, 50], [1, 1], seed=8).epoch_order(0))


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("world_size", [1, 3])
def test_steps_are_the_epoch_orders_in_batches_and_ranks_are_disjoint(drop_last, world_size):
    o = order([13, 29], [3, 1], batch_size=5, world_size=world_size, drop_last=drop_last, seed=2)
    g = o.global_batch
    steps = range(o.first_step_of_epoch(4))
    got = np.concatenate([o.step_ids(s) for s in steps])
    if drop_last:
        want = np.concatenate([o.epoch_order(e)[:o.batches_in_epoch(e) * g] for e in range(4)])
    else:
        want = np.concatenate([o.epoch_order(e) for e in range(5)])[:got.size]
    assert np.array_equal(got, want)
    for s in (0, 7, len(steps) - 1):
        per_rank = [o.step_ids(s, r) for r in range(world_size)]
        assert np.array_equal(np.concatenate(per_rank), o.step_ids(s))
        slots = [set(o.slots(r).tolist()) for r in range(world_size)]
        assert all(not (slots[i] & slots[j]) for i in range(world_size) for j in range(i))


def test_a_step_is_computed_without_the_steps_before_it():
    a = order([13, 29], [3, 1], batch_size=5, drop_last=False)
    b = order([13, 29], [3, 1], batch_size=5, drop_last=False)
    for s in range(60):
        a.step_ids(s)
    assert np.array_equal(a.step_ids(61), b.step_ids(61))
    assert a.epoch_of_step(61) == b.epoch_of_step(61)


def test_events_mark_every_epoch_once():
    o = order([13, 29], [3, 1], batch_size=5, drop_last=False)
    events = [(ev.kind, ev.epoch, ev.items_seen) for s in range(40) for ev in o.step_events(s)]
    starts = [e for k, e, _ in events if k == "epoch_start"]
    assert starts == list(range(len(starts)))
    assert [n for k, _, n in events if k == "epoch_complete"] == [o.epoch_size(e) for e in range(len(starts) - 1)]


def test_tokens_shares_are_within_half_an_item():
    rng = np.random.default_rng(0)
    lengths = [rng.integers(5, 50, 40), rng.integers(100, 900, 300)]
    o = order([40, 300], [1, 1], by="tokens", tokens=lengths, seed=4)
    total = int(lengths[0].sum() + lengths[1].sum())
    through = [0, 0]
    for e in range(4):
        got = o.realized(e)
        for i in range(2):
            through[i] += got[i][1]
            assert abs(through[i] - Fraction(total, 2) * (e + 1)) <= max(lengths[i]) / 2
    assert o.member_counts(0)[0] > 40  # the short conversations are repeated to reach half the tokens


def test_locate_splits_mixture_ids():
    o = order([3, 5], [1, 1])
    assert [a.tolist() for a in o.locate(np.array([0, 2, 3, 7, -1]))] == [[0, 0, 1, 1, -1], [0, 2, 0, 4, -1]]


def test_refusals_name_the_member_and_the_fix():
    with pytest.raises(ConfigError, match="member 'b' has no eligible item to train on"):
        MixtureOrder(members(3, 0), [Fraction(1, 2)] * 2, batch_size=1, names=["a", "b"])
    with pytest.raises(ConfigError, match="member 'b' holds 0 tokens.*mix by rows"):
        MixtureOrder(members(3, 2, tokens=[[1, 1, 1], [0, 0]]), [Fraction(1, 2)] * 2, batch_size=1,
                     by="tokens", names=["a", "b"])
    with pytest.raises(ConfigError, match="fewer than one global batch of 16.*epoch_drop_last=false"):
        order([3, 4], [1, 1], batch_size=8, world_size=2)


def member(name="a", weight=1.0, path="a", sha=SHA):
    return MixtureMember(name, path, weight, sha)


def test_the_mixture_file_checks():
    m = check_mixture([member("a", 3), member("b", 1, "b")], "tokens", 5, "m.json")
    assert m.shares() == [Fraction(3, 4), Fraction(1, 4)]
    assert mixture_from_dict(m.as_dict(), "m.json") == m
    with pytest.raises(DatasetError, match="two members are named 'a'.*NAME=DATASET:WEIGHT"):
        check_mixture([member(), member(path="b")], "rows", 1, "m.json")
    with pytest.raises(DatasetError, match="member 'a' has weight 0; a weight is a finite number > 0"):
        check_mixture([member(weight=0)], "rows", 1, "m.json")
    with pytest.raises(DatasetError, match="by is 'episodes'; it must be one of rows, tokens"):
        check_mixture([member()], "episodes", 1, "m.json")
    with pytest.raises(DatasetError, match="seed -1 must be an integer"):
        check_mixture([member()], "rows", -1, "m.json")
    with pytest.raises(DatasetError, match="member 'a' records no valid metadata_sha256"):
        check_mixture([member(sha="x")], "rows", 1, "m.json")
    with pytest.raises(DatasetError, match="m.json is not an sftdata mixture file"):
        mixture_from_dict({"members": []}, "m.json")
    with pytest.raises(DatasetError, match="mixture version 2 is not supported"):
        mixture_from_dict({**Mixture((member(),)).as_dict(), "version": 2}, "m.json")
