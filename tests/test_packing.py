"""Packing strategies: coverage, best-fit equivalence, seed 002 stream rules, masks per segment."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.errors import UsageError
from sftdata.masking import loss_mask
from sftdata.packing import (
    PAD_SEQ_ID,
    assemble_rows,
    gather_ranges,
    padding_baseline,
    plan_bfd,
    row_layout,
    segment_masks,
)
from sftdata.stream_packing import plan_stream
from sftdata.tokenizer import MarkerIds

M = MarkerIds(system=100277, user=100278, assistant=100279, tool=100280, tool_call=100281, end=100282, eos=100257)
S, U, A, T, E, EOS = M.system, M.user, M.assistant, M.tool, M.end, M.eos
PAD = 7


def episode(*spans, system=None):
    """Render spans like the renderer: [(marker, text ids), ...] then EOS."""
    out = []
    if system is not None:
        out += [S, *system, E]
    for marker, text in spans:
        out += [marker, *text, E]
    return np.array(out + [EOS], dtype=np.int64)


def random_episode(rng, n_pairs=None):
    n_pairs = n_pairs or int(rng.integers(1, 4))
    spans = []
    for _ in range(n_pairs):
        spans.append((U, rng.integers(0, 1000, int(rng.integers(1, 12))).tolist()))
        if rng.random() < 0.3:
            spans.append((A, rng.integers(0, 1000, int(rng.integers(1, 5))).tolist()))
            spans.append((T, rng.integers(0, 1000, int(rng.integers(1, 5))).tolist()))
        spans.append((A, rng.integers(0, 1000, int(rng.integers(1, 12))).tolist()))
    sys = rng.integers(0, 1000, int(rng.integers(1, 6))).tolist() if rng.random() < 0.5 else None
    return episode(*spans, system=sys)


def build(plan, eps, pad=PAD):
    """All rows of a plan, from a list of episode arrays."""
    toks = [eps[e][s:s + t] for e, s, t in zip(plan.seg_episode, plan.seg_start, plan.seg_take)]
    seg_tokens = np.concatenate(toks) if toks else np.empty(0, np.int64)
    return assemble_rows(plan, 0, plan.num_rows, seg_tokens, M, pad)


def segment_contents(plan, rows):
    """(row tokens of each segment, its injected prefix length, its episode slice)."""
    for j in range(plan.num_segments):
        r, o, n = int(plan.seg_row[j]), int(plan.seg_offset[j]), int(plan.seg_length[j])
        yield j, rows.tokens[r, o:o + n], rows.mask[r, o:o + n]


# ---------------------------------------------------------------------------- bfd
def reference_bfd(sizes_in_order, row_len):
    """Sequential best fit: each item into the open bin with least room that fits.

    Returns the sorted room left in every bin: bins with equal room are interchangeable,
    so any tie-break among them gives the same rooms (not the same contents).
    """
    rooms, contents = [], []
    for s in sizes_in_order:
        best = -1
        for i, r in enumerate(rooms):
            if r >= s and (best < 0 or r < rooms[best]):
                best = i
        if best < 0:
            rooms.append(row_len)
            contents.append([])
            best = len(rooms) - 1
        rooms[best] -= s
        contents[best].append(s)
    return sorted(rooms)


@pytest.mark.parametrize("seed", range(6))
def test_bfd_rows_equal_sequential_best_fit_decreasing(seed):
    rng = np.random.default_rng(seed)
    row_len = int(rng.integers(8, 64))
    lengths = rng.integers(1, row_len + 1, int(rng.integers(1, 300)))
    plan = plan_bfd(lengths, row_len, seed=seed)
    used = np.bincount(plan.seg_row, weights=plan.seg_length, minlength=plan.num_rows).astype(int)
    assert sorted((row_len - used).tolist()) == reference_bfd(sorted(lengths.tolist(), reverse=True), row_len)


@pytest.mark.parametrize("seed", range(8))
def test_bfd_places_every_token_exactly_once(seed):
    rng = np.random.default_rng(100 + seed)
    eps = [random_episode(rng) for _ in range(int(rng.integers(1, 60)))]
    lengths = np.array([e.size for e in eps])
    row_len = int(lengths.max()) + int(rng.integers(0, 40))
    plan = plan_bfd(lengths, row_len, seed=seed)
    rows = build(plan, eps)
    seen = {}
    for j, toks, _ in segment_contents(plan, rows):
        assert plan.seg_prefix[j] == 0 and plan.seg_start[j] == 0
        seen.setdefault(int(plan.seg_episode[j]), []).append(toks)
    assert sorted(seen) == list(range(len(eps)))
    for e, parts in seen.items():
        assert len(parts) == 1
        np.testing.assert_array_equal(parts[0], eps[e])
    assert plan.tokens_lost == 0 and plan.tokens_placed == lengths.sum()
    # every row is full up to its padding, and padding is pad_id with mask 0
    real = np.bincount(plan.seg_row, weights=plan.seg_length, minlength=plan.num_rows).astype(int)
    for r in range(plan.num_rows):
        assert (rows.tokens[r, real[r]:] == PAD).all() and (rows.mask[r, real[r]:] == 0).all()


def test_bfd_is_deterministic_and_the_seed_only_reorders():
    lengths = np.random.default_rng(3).integers(1, 50, 500)
    a, b, c = plan_bfd(lengths, 64, seed=1), plan_bfd(lengths, 64, seed=1), plan_bfd(lengths, 64, seed=2)
    for f in ("seg_row", "seg_offset", "seg_episode", "seg_take"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert a.num_rows == c.num_rows
    assert not np.array_equal(a.seg_episode, c.seg_episode)


def test_bfd_fill_is_near_the_lower_bound_on_a_realistic_distribution():
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(350), 1.0, 50_000))).astype(np.int64)
    plan = plan_bfd(lengths, 2049)
    assert plan.lower_bound_rows / plan.num_rows >= 0.995
    assert plan.lower_bound_rows == -(-int(np.minimum(lengths, 2049).sum()) // 2049)


def test_bfd_docstring_example():
    p = plan_bfd(np.array([6, 3, 5, 4]), row_len=9)
    assert p.num_rows == 2
    rows = sorted(sorted(p.seg_length[p.seg_row == r].tolist()) for r in range(2))
    assert rows == [[3, 6], [4, 5]]


def test_overlong_truncate_keeps_the_head_and_reports_the_loss():
    plan = plan_bfd(np.array([5, 23, 9]), row_len=10, overlong="truncate")
    assert plan.overlong_episodes == 1 and plan.tokens_lost == 13
    j = int(np.flatnonzero(plan.seg_episode == 1)[0])
    assert (plan.seg_start[j], plan.seg_take[j]) == (0, 10)
    assert plan.seg_episode[plan.seg_episode != 1].tolist().count(0) == 1


def test_overlong_split_places_every_token_in_consecutive_pieces():
    plan = plan_bfd(np.array([5, 23, 9]), row_len=10, overlong="split")
    j = np.flatnonzero(plan.seg_episode == 1)
    pieces = sorted(zip(plan.seg_start[j].tolist(), plan.seg_take[j].tolist()))
    assert pieces == [(0, 10), (10, 10), (20, 3)]
    assert plan.tokens_lost == 0 and plan.overlong_episodes == 1


def test_overlong_drop_removes_the_episode():
    plan = plan_bfd(np.array([5, 23, 9]), row_len=10, overlong="drop")
    assert sorted(plan.seg_episode.tolist()) == [0, 2]
    assert plan.dropped_episodes == 1 and plan.tokens_lost == 23
    assert plan.whole_episodes().tolist() == [True, False, True]


def test_empty_episodes_and_empty_input():
    plan = plan_bfd(np.array([0, 4, 0]), row_len=5)
    assert plan.seg_episode.tolist() == [1] and plan.num_rows == 1
    empty = plan_bfd(np.array([], dtype=np.int64), row_len=5)
    assert empty.num_rows == 0 and empty.fill == 0.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(lengths=np.array([1.5]), row_len=4), "1-d integer array"),
    (dict(lengths=np.array([[1]]), row_len=4), "1-d integer array"),
    (dict(lengths=np.array([1]), row_len=1), "at least 2 tokens"),
    (dict(lengths=np.array([3, -1]), row_len=4), "episode 1 has a negative length -1"),
    (dict(lengths=np.array([3]), row_len=4, overlong="wrap"), "overlong must be one of truncate, split, drop"),
])
def test_plan_errors(kwargs, match):
    with pytest.raises(UsageError, match=match):
        plan_bfd(**kwargs)


def test_padding_baseline():
    assert padding_baseline(np.array([2, 10, 0, 4]), 5) == (3, pytest.approx((2 + 5 + 4) / 15))
    assert padding_baseline(np.array([], dtype=np.int64), 5) == (0, 0.0)


# --------------------------------------------------------------- masks and rows
def token_soup(rng, n):
    alphabet = np.array([S, U, A, T, E, E, EOS, M.tool_call] + list(range(10)))
    return alphabet[rng.integers(0, alphabet.size, n)]


@pytest.mark.parametrize("seed", range(20))
def test_segment_masks_equal_the_rule_per_segment(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 25, int(rng.integers(1, 30)))
    toks = token_soup(rng, int(lengths.sum()))
    expected = [loss_mask(t, M) for t in np.split(toks, np.cumsum(lengths)[:-1])]
    np.testing.assert_array_equal(segment_masks(toks, lengths, M), np.concatenate(expected))


def test_segment_masks_reject_inconsistent_lengths():
    with pytest.raises(ValueError, match="sum to 5, but 4 tokens"):
        segment_masks(np.zeros(4, np.int64), np.array([2, 3]), M)


@pytest.mark.parametrize("strategy, seed", [("bfd", 0), ("bfd", 1), ("stream", 2), ("stream", 3)])
def test_rows_mask_is_the_rule_per_segment_and_no_target_crosses_a_boundary(strategy, seed):
    rng = np.random.default_rng(seed)
    eps = [random_episode(rng) for _ in range(60)]
    lengths = np.array([e.size for e in eps])
    row_len = 40
    if strategy == "bfd":
        plan = plan_bfd(lengths, row_len, overlong="split", seed=seed)
    else:
        plan = plan_stream(lengths, lambda i: eps[i], M, row_len)
    rows = build(plan, eps)
    for j, toks, mask in segment_contents(plan, rows):
        p = int(plan.seg_prefix[j])
        e, s, t = int(plan.seg_episode[j]), int(plan.seg_start[j]), int(plan.seg_take[j])
        np.testing.assert_array_equal(toks[p:], eps[e][s:s + t])
        np.testing.assert_array_equal(mask, np.concatenate([np.zeros(p, np.uint8), loss_mask(toks[p:], M)]))
        assert mask[0] == 0  # the target of the previous segment's last token is untrained
    seq, pos = row_layout(plan.seg_row, plan.seg_offset, plan.seg_length, plan.num_rows, row_len)
    y_mask = rows.mask[:, 1:]
    crossing = seq[:, 1:] != seq[:, :-1]
    assert not (y_mask.astype(bool) & crossing).any()
    assert (rows.mask[seq == PAD_SEQ_ID] == 0).all()


def test_row_layout_seq_ids_and_positions_reset_per_segment():
    seq, pos = row_layout(np.array([0, 0, 1]), np.array([0, 3, 0]), np.array([3, 2, 6]), 2, 6)
    assert seq.tolist() == [[0, 0, 0, 1, 1, -1], [0, 0, 0, 0, 0, 0]]
    assert pos.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


def test_assemble_rows_checks_the_token_count():
    plan = plan_bfd(np.array([3, 4]), row_len=8)
    with pytest.raises(ValueError, match="need 7 segment tokens, got 6"):
        assemble_rows(plan, 0, 1, np.zeros(6, np.int64), M, PAD)


def test_gather_ranges():
    arr = np.arange(100, 120)
    assert gather_ranges(arr, [5, 0, 17], [2, 3, 0]).tolist() == [105, 106, 100, 101, 102]
    assert gather_ranges(arr, [], []).tolist() == []
