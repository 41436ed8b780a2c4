"""Elastic resume: ``load_state_dict`` on another world size or batch size."""

import json

import numpy as np
import pytest

from sftdata.errors import ConfigError, UsageError
from tests.helpers.loader import load

ORDERS = [
    ("episodes", dict(batch_sampling_mode="epoch", epoch_drop_last=True)),
    ("episodes", dict(batch_sampling_mode="epoch", epoch_drop_last=False)),
    ("episodes", dict(batch_sampling_mode="random")),
    ("packed", dict(epoch_drop_last=True)),
    ("packed", dict(epoch_drop_last=False)),
    ("windows", {}),
]


def ranks(each_kind, kind, bs, ws, **kw):
    return [load(each_kind, kind, batch_size=bs, rank=r, world_size=ws, **kw) for r in range(ws)]


def run(loaders, steps) -> list[np.ndarray]:
    """The ids every step trains, all ranks in rank order."""
    out = []
    for _ in range(steps):
        parts = []
        for lo in loaders:
            lo.get_batch("train")
            parts.append(lo.last_ids["train"])
        out.append(np.concatenate(parts))
    return out


def resume(each_kind, kind, state, bs, ws, **kw):
    loaders = ranks(each_kind, kind, bs, ws, **kw)
    for lo in loaders:
        lo.load_state_dict(json.loads(json.dumps(state)))
    return loaders


@pytest.mark.parametrize("kind, kw", ORDERS)
@pytest.mark.parametrize("before, after", [((1, 4), (2, 2)), ((2, 2), (4, 1)), ((2, 2), (1, 4))])
def test_the_same_global_batch_resumes_with_the_batches_of_the_uninterrupted_run(each_kind, kind, kw, before, after):
    ref = ranks(each_kind, kind, *before, **kw)
    expected = [[lo.get_batch("train") for _ in range(8)] for lo in ref]
    first = ranks(each_kind, kind, *before, **kw)
    run(first, 3)
    state = first[0].state_dict()
    assert state["order"]["world_size"] == before[1] and state["steps"]["train"] == 3
    resumed = resume(each_kind, kind, state, *after, **kw)
    assert all(lo.step("train") == 3 for lo in resumed)
    for step in range(3, 8):
        got = [lo.get_batch("train") for lo in resumed]
        want = [expected[r][step] for r in range(before[1])]
        for field in range(len(got[0])):  # rows of the global batch, in rank order, the same on both layouts
            assert np.concatenate([np.asarray(b[field]) for b in got]).tolist() == \
                np.concatenate([np.asarray(b[field]) for b in want]).tolist()


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("before, after, step", [((3, 1), (2, 1), 2), ((1, 2), (1, 3), 4), ((2, 2), (1, 1), 3)])
def test_a_changed_global_batch_continues_from_the_same_position(each_kind, drop_last, before, after, step):
    kw = dict(batch_sampling_mode="epoch", epoch_drop_last=drop_last)
    first = ranks(each_kind, "episodes", *before, **kw)
    trained = run(first, step)
    resumed = resume(each_kind, "episodes", first[0].state_dict(), *after, **kw)
    o = resumed[0].order("train")
    n = o.n  # 11 eligible episodes
    seen: dict[int, list] = {}
    for s, ids in enumerate(trained + run(resumed, 12)):
        e = (first[0] if s < step else resumed[0]).order("train").epoch_of_step(s)
        seen.setdefault(e, []).extend(ids.tolist())
    if not drop_last:  # one stream: the concatenation of the epoch orders, nothing repeated or skipped
        stream = [i for e in sorted(seen) for i in seen[e]]
        full = np.concatenate([o.epoch_order(e) for e in range(len(stream) // n + 2)])
        assert stream == full[:len(stream)].tolist()
    else:  # each epoch: a prefix of its order, each episode once, only a tail shorter than a batch dropped
        for e in sorted(seen)[:-1]:
            assert seen[e] == o.epoch_order(e)[:len(seen[e])].tolist()
            assert n - len(seen[e]) < max(before[0] * before[1], after[0] * after[1])


def test_a_packed_pass_resumed_on_more_ranks_trains_every_row_once(each_kind):
    first = ranks(each_kind, "packed", 4, 1, epoch_drop_last=False)
    trained = run(first, 5)  # 20 of 92 rows
    resumed = resume(each_kind, "packed", first[0].state_dict(), 3, 2, epoch_drop_last=False)
    assert resumed[0].steps_total("train") == 5 + 12  # 72 rows left, 6 per step
    rest = run(resumed, 12)
    with pytest.raises(StopIteration, match="is done: 17 batches"):
        resumed[0].get_batch("train")
    rows = np.concatenate(trained + rest)
    assert rows.tolist() == resumed[0].order("train").epoch_order(0).tolist()


def test_the_state_after_a_resize_holds_the_origin_and_resumes_again(each_kind):
    kw = dict(batch_sampling_mode="epoch", epoch_drop_last=False)
    first = ranks(each_kind, "episodes", 2, 2, **kw)
    trained = run(first, 2)  # 8 episodes
    second = resume(each_kind, "episodes", first[0].state_dict(), 3, 1, **kw)
    trained += run(second, 3)
    state = second[0].state_dict()
    assert state["version"] == 2 and state["origins"] == {"train": [2, 0, 8]}
    assert first[0].state_dict()["version"] == 1 and "origins" not in first[0].state_dict()
    again = resume(each_kind, "episodes", state, 3, 1, **kw)  # the same layout: the saved origin is kept
    assert again[0].state_dict()["origins"] == {"train": [2, 0, 8]}
    third = resume(each_kind, "episodes", state, 1, 2, **kw)  # and a third layout: the position at step 5
    assert third[0].state_dict()["origins"] == {"train": [5, 1, 6]}  # 8 + 9 = 17 = 11 + 6
    trained += run(third, 4)
    assert np.array_equal(run(again, 1)[0], np.concatenate(trained)[17:20])
    o = third[0].order("train")
    stream = np.concatenate(trained)
    assert stream.tolist() == np.concatenate([o.epoch_order(e) for e in range(3)])[:stream.size].tolist()
    with pytest.raises(UsageError, match="step 4 was trained before the resume at step 5"):
        third[0].batch_at("train", 4)


def test_a_state_with_a_bad_origin_or_layout_is_refused(each_kind):
    lo = load(each_kind, "episodes", batch_size=2)
    lo.get_batch("train")
    state = lo.state_dict()
    with pytest.raises(ConfigError, match=r"split 'train': a resume origin is \[step, epoch, position\], integers "
                                          r">= 0, got 'x'"):
        load(each_kind, "episodes", batch_size=2).load_state_dict({**state, "version": 2, "origins": {"train": "x"}})
    with pytest.raises(ConfigError, match="origins must be a dict of split -> "):
        load(each_kind, "episodes", batch_size=2).load_state_dict({**state, "version": 2, "origins": [1]})
    with pytest.raises(ConfigError, match="resume position 11 is outside the 11 eligible episodes"):
        load(each_kind, "episodes", batch_size=2).load_state_dict({**state, "version": 2,
                                                              "origins": {"train": [1, 0, 11]}})
    bad = {**state, "order": {**state["order"], "world_size": 0}}
    with pytest.raises(ConfigError, match="loader state: world_size must be an integer >= 1, got 0"):
        load(each_kind, "episodes", batch_size=3).load_state_dict(bad)
    with pytest.raises(ConfigError, match="version 9 is not supported .*reads 1 and 2"):
        load(each_kind, "episodes").load_state_dict({**state, "version": 9})


def test_token_budget_batches_keep_their_layout(each_kind):
    kw = dict(batch_tokens=24)
    first = ranks(each_kind, "episodes", 3, 2, **kw)
    first[0].get_batch("train")
    with pytest.raises(ConfigError, match=r"batches sized by batch_tokens cannot change their layout on resume; "
                                          r"resume with world_size 2"):
        load(each_kind, "episodes", rank=0, world_size=1, **kw).load_state_dict(first[0].state_dict())
    again = load(each_kind, "episodes", rank=0, world_size=2, **kw)  # the same layout resumes
    again.load_state_dict(first[0].state_dict())
    assert again.step("train") == 1
