"""Resuming an order on another layout (world size, batch size): ``BatchOrder(origin=)``."""

import numpy as np
import pytest

from sftdata.errors import ConfigError, UsageError
from sftdata.order.batches import BatchOrder, Origin, StepEvent


def order(n=23, bs=3, ws=2, **kw) -> BatchOrder:
    return BatchOrder(np.arange(n) + 100, batch_size=bs, world_size=ws, seed=5, **kw)


def resumed(old: BatchOrder, step: int, bs: int, ws: int) -> BatchOrder:
    return old.relayout(batch_size=bs, world_size=ws, origin=old.origin_at(step))


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("sampling", ["epoch", "random"])
@pytest.mark.parametrize("step", [0, 1, 3, 7, 8, 20])
@pytest.mark.parametrize("new", [(1, 6), (6, 1), (2, 3), (3, 2)])
def test_the_same_global_batch_gives_the_uninterrupted_batches(drop_last, sampling, step, new):
    old = order(drop_last=drop_last, sampling=sampling)
    r = resumed(old, step, *new)
    for s in range(step, step + 30):
        assert r.step_ids(s).tolist() == old.step_ids(s).tolist()
        parts = [r.step_ids(s, k) for k in range(new[1])]
        assert np.concatenate(parts).tolist() == old.step_ids(s).tolist()
        if sampling == "epoch":
            assert r.epoch_of_step(s) == old.epoch_of_step(s)
            if s > step:  # the batch at the resume itself does not start its epoch again
                assert r.step_events(s) == old.step_events(s)


@pytest.mark.parametrize("n", [7, 23, 24])
@pytest.mark.parametrize("step", [0, 1, 2, 5, 9])
@pytest.mark.parametrize("new", [(1, 1), (2, 1), (5, 1), (1, 4), (4, 3)])
def test_without_drop_last_a_changed_global_batch_continues_the_same_stream(n, step, new):
    old = order(n=n, bs=2, ws=2, drop_last=False)
    r = resumed(old, step, *new)
    trained = [old.step_ids(s) for s in range(step)] + [r.step_ids(s) for s in range(step, step + 40)]
    got = np.concatenate(trained)
    expected = np.concatenate([old.epoch_order(e) for e in range(got.size // n + 2)])[:got.size]
    assert got.tolist() == expected.tolist()  # nothing repeated, nothing skipped
    for s in range(step, step + 40):  # the epoch of a step and the epoch counts agree with the stream
        first = (step * 4 + (s - step) * r.global_batch)
        assert r.epoch_of_step(s) == first // n
    e0 = r.epoch_of_step(step)
    for e in range(e0, e0 + 3):
        assert r.first_step_of_epoch(e + 1) - r.first_step_of_epoch(e) == r.batches_in_epoch(e)


@pytest.mark.parametrize("step", [0, 1, 2, 3, 4, 6])
@pytest.mark.parametrize("new", [(1, 1), (2, 1), (5, 1), (1, 4), (3, 3)])
def test_with_drop_last_each_epoch_trains_a_prefix_of_its_order_once(step, new):
    old = order(n=23, bs=2, ws=2, drop_last=True)  # 5 batches per epoch, 3 items dropped
    r = resumed(old, step, *new)
    g = r.global_batch
    seen: dict[int, list[int]] = {}
    for s in range(step + 30):
        o = old if s < step else r
        e = o.epoch_of_step(s)
        seen.setdefault(e, []).extend(o.step_ids(s).tolist())
    for e, got in list(seen.items())[:-1]:  # complete epochs
        assert got == o.epoch_order(e)[:len(got)].tolist()
        assert len(got) > 23 - max(4, g) - 1  # only a tail shorter than one batch is dropped
    e0 = old.epoch_of_step(step) if step < 5 * 100 else None
    p0 = step % 5 * 4
    if 23 - p0 >= g:
        assert r.batches_in_epoch(e0) == (23 - p0) // g
    later = r.epoch_of_step(step + 29)
    assert r.batches_in_epoch(later) == 23 // g


def test_resizes_chain():
    a = order(n=31, bs=4, ws=2, drop_last=False)
    b = resumed(a, 3, 1, 3)
    c = resumed(b, 10, 5, 1)
    got = np.concatenate([a.step_ids(s) for s in range(3)] + [b.step_ids(s) for s in range(3, 10)]
                         + [c.step_ids(s) for s in range(10, 30)])
    assert got.tolist() == np.concatenate([a.epoch_order(e) for e in range(6)])[:got.size].tolist()
    assert c.origin == Origin(10, 1, 14)  # 3 * 8 + 7 * 3 = 45 = 31 + 14


def test_events_after_a_resume_mid_epoch():
    old = BatchOrder(np.arange(10), batch_size=4, drop_last=False, seed=1)
    r = resumed(old, 1, 3, 1)  # from position 4 of epoch 0: steps 1 [4..6], 2 [7..9], 3 [epoch 1: 0..2]
    assert r.step_events(1) == []
    assert r.step_events(2) == [StepEvent("epoch_complete", 0, 10)]
    assert r.step_events(3) == [StepEvent("epoch_start", 1)]
    dl = resumed(BatchOrder(np.arange(10), batch_size=4, drop_last=True, seed=1), 1, 3, 1)
    assert dl.origin == Origin(1, 0, 4) and dl.batches_in_epoch(0) == 2  # positions 4..9
    assert dl.step_events(1) == [] and dl.step_events(2) == [StepEvent("epoch_complete", 0, 10)]
    assert dl.step_events(3) == [StepEvent("epoch_start", 1)] and dl.first_step_of_epoch(2) == 6
    short = resumed(BatchOrder(np.arange(10), batch_size=4, drop_last=True, seed=1), 2, 3, 1)
    # position 8 of epoch 0: its 2 items are less than a batch of 3, dropped: epoch 1 starts at step 2
    assert short.epoch_of_step(2) == 1 and short.step_events(2) == [StepEvent("epoch_start", 1)]
    assert short.step_ids(2).tolist() == short.epoch_order(1)[:3].tolist()


def test_locate_names_the_step_and_slot_of_each_position():
    for drop_last in (True, False):
        old = order(n=23, bs=2, ws=2, drop_last=drop_last)
        r = resumed(old, 3, 3, 1)
        for e in range(3):
            steps, slots = r.locate(e, np.arange(23))
            for p in range(23):
                if steps[p] >= 0:
                    assert r.step_ids(int(steps[p]))[slots[p]] == r.epoch_order(e)[p]
                else:  # before the resume (the old layout trained it) or a dropped tail
                    ostep, oslot = old.locate(e, np.array([p]))
                    assert (0 <= ostep[0] < 3) or (drop_last and p >= 21)  # 12 + 3 * 3, or 7 * 3
        assert r.locate(0, np.arange(12))[0].tolist()[:12] == [-1] * 12  # steps 0..2 trained 12 items


@pytest.mark.parametrize("drop_last, total", [(True, 5), (False, 6)])
def test_a_one_pass_order_resumed_ends_after_the_rest_of_the_pass(drop_last, total):
    old = BatchOrder(23, batch_size=2, world_size=2, seed=3, drop_last=drop_last, one_pass=True)  # 5 or 6 steps
    r = resumed(old, 2, 1, 3)  # 8 rows trained, 15 left: 5 batches of 3
    assert r.steps_total == 2 + 5
    got = np.concatenate([old.step_ids(s) for s in range(2)] + [r.step_ids(s) for s in range(2, 7)])
    assert got.tolist() == old.epoch_order(0).tolist()
    done = resumed(old, total, 1, 3)  # saved at the end of the pass
    assert done.steps_total == total
    with pytest.raises(UsageError, match=f"step {total} is outside the one pass"):
        done.step_ids(total)


def test_resume_errors():
    r = resumed(order(drop_last=False), 4, 1, 1)
    with pytest.raises(UsageError, match="step 3 was trained before the resume at step 4 .*another layout"):
        r.step_ids(3)
    with pytest.raises(UsageError, match=r"epoch 0 was trained before the resume at step 7 \(with another layout\)"):
        resumed(order(n=5, bs=1, ws=1, drop_last=False), 7, 1, 1).first_step_of_epoch(0)
    with pytest.raises(ConfigError, match="resume position 23 is outside the 23 eligible items"):
        order().relayout(origin=Origin(2, 0, 23))
    with pytest.raises(ConfigError, match=r"a resume origin is \[step, epoch, position\], integers >= 0, got \[1, -1, 2\]"):
        Origin.from_value([1, -1, 2], "loader state")
    assert Origin.from_value([1, 2, 3], "x") == Origin(1, 2, 3)
    with pytest.raises(UsageError, match="step 2 was trained before"):
        resumed(order(sampling="random"), 3, 1, 1).step_ids(2)
