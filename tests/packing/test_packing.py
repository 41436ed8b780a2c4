"""Packing: segments, the bfd and stream planners (coverage, best-fit equivalence, the
stream rewrite rules), the mask of a packed row and the row layout."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sftdata.chat.markers import MarkerIds
from sftdata.chat.masking import loss_mask
from sftdata.errors import UsageError
from sftdata.packing import PAD_SEQ_ID, Segments, row_layout
from sftdata.packing.plan import assemble_rows, padding_baseline, row_mask, segment_masks
from sftdata.packing.strategies import plan_bfd, plan_stream, stream_prefix
from sftdata.store.format import SEGMENT_FIELDS
from tests.helpers.packing import EOS, PAD, A, E, M, S, T, U, build, episode, random_episode


def segment_contents(plan, rows):
    """(index, row tokens, row mask) of each segment."""
    seg = plan.segments
    for j in range(plan.num_segments):
        r, o, n = int(seg.row[j]), int(seg.offset[j]), int(seg.length[j])
        yield j, rows.tokens[r, o:o + n], rows.mask[r, o:o + n]


def make_segments(n, **cols):
    """Segments of ``n`` entries: the given columns, the others zero (source -1)."""
    base = {f: np.zeros(n, np.int64) for f in SEGMENT_FIELDS}
    base["source"] = np.full(n, -1, np.int64)
    base.update({k: np.asarray(v, np.int64) for k, v in cols.items()})
    return Segments(**base)


# ------------------------------------------------------------------------ segments
def test_segments_fields_are_the_columns_of_segments_idx_in_order():
    assert [f.name for f in dataclasses.fields(Segments)] == list(SEGMENT_FIELDS)


def test_segments_select_rows_slices_and_concatenate():
    seg = make_segments(5, row=[0, 0, 1, 3, 3], offset=[0, 4, 0, 0, 2], length=[4, 2, 6, 2, 3], prefix=[0, 1, 0, 0, 0],
               episode=[7, 8, 9, 10, 11])
    assert len(seg) == 5 and seg.take.tolist() == [4, 1, 6, 2, 3]
    assert seg.row_range(1, 3) == (2, 3) and seg.row_range(0, 4) == (0, 5) and seg.row_range(2, 3) == (3, 3)
    assert seg.of_rows([3, 0, 2]).episode.tolist() == [10, 11, 7, 8]  # in the order asked; row 2 has none
    assert seg[1:3].episode.tolist() == [8, 9] and seg[np.array([4, 0])].offset.tolist() == [2, 0]
    assert seg.flat_start(10).tolist() == [0, 4, 10, 30, 32]
    both = Segments.concat([seg[:2], seg[3:]])
    assert both.episode.tolist() == [7, 8, 10, 11] and both.source.tolist() == [-1] * 4
    assert len(Segments.concat([])) == 0 and len(Segments.empty()) == 0


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
    used = np.bincount(plan.segments.row, weights=plan.segments.length, minlength=plan.num_rows).astype(int)
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
    seg = plan.segments
    for j, toks, _ in segment_contents(plan, rows):
        assert seg.prefix[j] == 0 and seg.episode_start[j] == 0 and seg.source[j] == -1
        seen.setdefault(int(seg.episode[j]), []).append(toks)
    assert sorted(seen) == list(range(len(eps)))
    for e, parts in seen.items():
        assert len(parts) == 1
        np.testing.assert_array_equal(parts[0], eps[e])
    assert plan.tokens_lost == 0 and plan.tokens_placed == lengths.sum()
    # every row is full up to its padding, and padding is pad_id with mask 0
    real = np.bincount(seg.row, weights=seg.length, minlength=plan.num_rows).astype(int)
    for r in range(plan.num_rows):
        assert (rows.tokens[r, real[r]:] == PAD).all() and (rows.mask[r, real[r]:] == 0).all()


def test_bfd_is_deterministic_and_the_seed_only_reorders():
    lengths = np.random.default_rng(3).integers(1, 50, 500)
    a, b, c = plan_bfd(lengths, 64, seed=1), plan_bfd(lengths, 64, seed=1), plan_bfd(lengths, 64, seed=2)
    for f in SEGMENT_FIELDS:
        np.testing.assert_array_equal(getattr(a.segments, f), getattr(b.segments, f))
    assert a.num_rows == c.num_rows
    assert not np.array_equal(a.segments.episode, c.segments.episode)


def test_bfd_fill_is_near_the_lower_bound_on_a_realistic_distribution():
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(350), 1.0, 50_000))).astype(np.int64)
    plan = plan_bfd(lengths, 2049)
    assert plan.lower_bound_rows / plan.num_rows >= 0.995
    assert plan.lower_bound_rows == -(-int(np.minimum(lengths, 2049).sum()) // 2049)


def test_bfd_golden_layout_rows_in_seeded_order_segments_in_placement_order():
    # the exact plan (pinned: the planner lays rows out by counting, and a faster layout
    # must give these same bytes, or every packed dataset of a user changes)
    p = plan_bfd(np.array([6, 3, 5, 4, 2, 7, 9, 1, 3]), row_len=9, seed=3)
    s = p.segments
    assert p.num_rows == 5
    assert s.row.tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert s.offset.tolist() == [0, 0, 6, 0, 5, 0, 3, 0, 7]
    assert s.length.tolist() == [9, 6, 3, 5, 4, 3, 1, 7, 2]
    assert s.episode.tolist() == [6, 0, 1, 2, 3, 8, 7, 5, 4]
    p = plan_bfd(np.array([12, 3, 5, 20, 2]), row_len=9, overlong="split", seed=1)
    s = p.segments
    assert (s.row.tolist(), s.offset.tolist(), s.length.tolist()) == (
        [0, 0, 0, 1, 2, 3, 4, 4], [0, 3, 5, 0, 0, 0, 0, 5], [3, 2, 2, 9, 9, 9, 5, 3])
    assert (s.episode.tolist(), s.episode_start.tolist()) == ([0, 4, 3, 3, 0, 3, 2, 1], [9, 0, 18, 9, 0, 0, 0, 0])


def test_bfd_docstring_example():
    p = plan_bfd(np.array([6, 3, 5, 4]), row_len=9)
    assert p.num_rows == 2
    rows = sorted(sorted(p.segments.length[p.segments.row == r].tolist()) for r in range(2))
    assert rows == [[3, 6], [4, 5]]


def test_overlong_truncate_keeps_the_head_and_reports_the_loss():
    plan = plan_bfd(np.array([5, 23, 9]), row_len=10, overlong="truncate")
    assert plan.overlong_episodes == 1 and plan.tokens_lost == 13
    seg = plan.segments
    j = int(np.flatnonzero(seg.episode == 1)[0])
    assert (seg.episode_start[j], seg.take[j]) == (0, 10)
    assert seg.episode[seg.episode != 1].tolist().count(0) == 1


def test_overlong_split_places_every_token_in_consecutive_pieces():
    plan = plan_bfd(np.array([5, 23, 9]), row_len=10, overlong="split")
    seg = plan.segments
    j = np.flatnonzero(seg.episode == 1)
    pieces = sorted(zip(seg.episode_start[j].tolist(), seg.take[j].tolist()))
    assert pieces == [(0, 10), (10, 10), (20, 3)]
    assert plan.tokens_lost == 0 and plan.overlong_episodes == 1


def test_overlong_drop_removes_the_episode():
    plan = plan_bfd(np.array([5, 23, 9]), row_len=10, overlong="drop")
    assert sorted(plan.segments.episode.tolist()) == [0, 2]
    assert plan.dropped_episodes == 1 and plan.tokens_lost == 23
    assert plan.whole_episodes().tolist() == [True, False, True]


def test_empty_episodes_and_empty_input():
    plan = plan_bfd(np.array([0, 4, 0]), row_len=5)
    assert plan.segments.episode.tolist() == [1] and plan.num_rows == 1
    empty = plan_bfd(np.array([], dtype=np.int64), row_len=5)
    assert empty.num_rows == 0 and empty.fill == 0.0 and empty.num_segments == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(lengths=np.array([1.5]), row_len=4), "1-d integer array"),
    (dict(lengths=np.array([[1]]), row_len=4), "1-d integer array"),
    (dict(lengths=np.array([1]), row_len=1), "at least 2 tokens"),
    (dict(lengths=np.array([3, -1]), row_len=4), "episode 1 has a negative length -1"),
    (dict(lengths=np.array([3]), row_len=4, overlong="wrap"),
     "overlong must be one of truncate, keep_end, split, drop, not .wrap."),
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


@pytest.mark.parametrize("seed", range(40))
def test_segment_masks_equal_the_rule_per_segment(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 25, int(rng.integers(1, 30)))
    toks = token_soup(rng, int(lengths.sum())).astype(np.uint32 if seed % 2 else np.int64)
    expected = [loss_mask(t, M) for t in np.split(toks, np.cumsum(lengths)[:-1])]
    got = segment_masks(toks, lengths, M)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, np.concatenate(expected))


M9 = MarkerIds(system=100277, user=100278, assistant=100279, tool=100280, tool_call=100281, end=100282, eos=100257,
               think=100283, end_think=100284, assistant_context=100285)


@pytest.mark.parametrize("seed", range(40))
def test_segment_masks_equal_the_rule_per_segment_with_reasoning_and_context_turns(seed):
    """An <|ASSISTANT|> closed by no <|END|> before an <|ASSISTANT_CONTEXT|> is unclosed:
    the one-call layout must see the context opener as a span opener too."""
    rng = np.random.default_rng(1000 + seed)
    alphabet = np.array([S, U, A, T, E, E, EOS, M.tool_call, M9.think, M9.end_think, M9.assistant_context, 1, 2])
    lengths = rng.integers(0, 25, int(rng.integers(1, 30)))
    toks = alphabet[rng.integers(0, alphabet.size, int(lengths.sum()))]
    expected = [loss_mask(t, M9) for t in np.split(toks, np.cumsum(lengths)[:-1])]
    np.testing.assert_array_equal(segment_masks(toks, lengths, M9), np.concatenate(expected))


def test_segment_masks_an_unclosed_assistant_zeroes_the_rest_of_its_segment_only():
    segs = [[U, 1, E, A, 2, U, 3, E, A, 4, E], [U, 5, E, A, 6, E, EOS], [A, 7], [U, 8, E, A, 9, E]]
    toks = np.concatenate([np.array(x, np.int64) for x in segs])
    got = segment_masks(toks, np.array([len(x) for x in segs]), M)
    # the first segment's A 2 is unclosed (a <|USER|> opens next): it and all after it in
    # that segment are 0, even the complete exchange that follows; the others are untouched
    assert got.tolist() == [0] * 11 + [0, 0, 0, 1, 1, 1, 0] + [0, 0] + [0, 0, 0, 1, 1, 1]


def test_segment_masks_one_episode_without_eos_does_not_give_the_next_one_its_context():
    first, second = np.array([U, 5, E]), np.array([A, 6, E, EOS])  # alone, the second trains nothing
    ids = np.concatenate([first, second]).astype(np.uint32)
    assert loss_mask(ids, M).sum() == 3  # what one call over both would say
    assert segment_masks(ids, np.array([3, 4]), M).tolist() == [0] * 7


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
    seg = plan.segments
    for j, toks, mask in segment_contents(plan, rows):
        p = int(seg.prefix[j])
        e, s, t = int(seg.episode[j]), int(seg.episode_start[j]), int(seg.take[j])
        np.testing.assert_array_equal(toks[p:], eps[e][s:s + t])
        np.testing.assert_array_equal(mask, np.concatenate([np.zeros(p, np.uint8), loss_mask(toks[p:], M)]))
        assert mask[0] == 0  # the target of the previous segment's last token is untrained
    seq, pos = row_layout(seg.row, seg.offset, seg.length, plan.num_rows, row_len)
    y_mask = rows.mask[:, 1:]
    crossing = seq[:, 1:] != seq[:, :-1]
    assert not (y_mask.astype(bool) & crossing).any()
    assert (rows.mask[seq == PAD_SEQ_ID] == 0).all()


def test_row_layout_seq_ids_and_positions_reset_per_segment():
    seq, pos = row_layout(np.array([0, 0, 1]), np.array([0, 3, 0]), np.array([3, 2, 6]), 2, 6)
    assert seq.tolist() == [[0, 0, 0, 1, 1, -1], [0, 0, 0, 0, 0, 0]]
    assert pos.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


def test_row_mask_golden_rows():
    # row 0: the docstring's row (U u E A a E EOS | U v E EOS | pad); row 1: stream
    # segments behind injected context: [S s E] then a whole user span (its answer is
    # trained), and [S U] then the rest of a cut user span (its answer is not)
    r0 = [U, 1, E, A, 2, E, EOS, U, 3, E, EOS] + [PAD] * 7
    r1 = [S, 1, E, U, 4, E, A, 5, E, EOS, S, U, 6, E, A, 7, E, EOS]
    seg = make_segments(4, row=[0, 0, 1, 1], offset=[0, 7, 0, 10], length=[7, 4, 10, 8], prefix=[0, 0, 3, 2])
    want0 = [0, 0, 0, 1, 1, 1, 0] + [0, 0, 0, 0] + [0] * 7
    want1 = [0, 0, 0] + [0, 0, 0, 1, 1, 1, 0] + [0, 0] + [0, 0, 0, 0, 0, 0]
    np.testing.assert_array_equal(row_mask(np.array([r0, r1]), seg, 18, M), [want0, want1])
    # an assistant span opening a segment has no context in it: untrained
    ok = np.array([U, 4, E, A, 5, E, EOS, A, 5, E], dtype=np.int64)
    two = make_segments(2, offset=[0, 7], length=[7, 3])
    assert row_mask(ok, two, 10, M).tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0, 0]
    assert row_mask(ok[:7], make_segments(1, length=[7]), 7, M).shape == (7,)


@pytest.mark.parametrize("strategy", ["bfd", "stream"])
def test_rows_built_a_chunk_at_a_time_equal_rows_built_at_once(strategy):
    rng = np.random.default_rng(11)
    eps = [random_episode(rng) for _ in range(50)]
    lengths = np.array([e.size for e in eps])
    plan = (plan_bfd(lengths, 30, overlong="split", seed=3) if strategy == "bfd"
            else plan_stream(lengths, lambda i: eps[i], M, 30))
    whole = build(plan, eps)
    seg = plan.segments
    for r0 in range(0, plan.num_rows, 3):
        r1 = min(plan.num_rows, r0 + 3)
        a, b = seg.row_range(r0, r1)
        toks = [eps[e][s:s + t] for e, s, t in zip(seg.episode[a:b], seg.episode_start[a:b], seg.take[a:b])]
        part = assemble_rows(plan, r0, r1, np.concatenate(toks), M, PAD)
        np.testing.assert_array_equal(part.tokens, whole.tokens[r0:r1])
        np.testing.assert_array_equal(part.mask, whole.mask[r0:r1])
        assert part.segments.row.tolist() == (seg.row[a:b] - r0).tolist()
        assert part.segments.episode.tolist() == seg.episode[a:b].tolist()


def test_assemble_rows_checks_the_token_count():
    plan = plan_bfd(np.array([3, 4]), row_len=8)
    with pytest.raises(ValueError, match="need 7 segment tokens, got 6"):
        assemble_rows(plan, 0, 1, np.zeros(6, np.int64), M, PAD)




# -------------------------------------------------------------------------- stream
s0, u0, a0, u1, a1, u2, a2 = [10, 11], [20, 21], [30, 31], [40, 41], [50, 51], [60, 61, 62], [70, 71]
CUT_EXAMPLE = episode((U, u0), (A, a0), (U, u1), (A, a1), (U, u2), (A, a2), system=s0)
# positions: S0 s s E3 | U4 .. E7 | A8 .. E11 | U12 .. E15 | A16 .. E19 | U20 60 61 62 E24 | A25 70 71 E28 | EOS29


def stream(eps, row_len):
    plan = plan_stream(np.array([e.size for e in eps]), lambda i: eps[i], M, row_len)
    return plan, build(plan, eps)


def test_stream_golden_example_cut_inside_u2():
    plan, rows = stream([CUT_EXAMPLE], 22)  # row 0 ends after the first token of u2
    assert plan.num_rows == 2
    np.testing.assert_array_equal(rows.tokens[0], CUT_EXAMPLE[:22])
    expected = [S, 10, 11, E, U, 61, 62, E, A, 70, 71, E, EOS]
    assert rows.tokens[1].tolist() == expected + [PAD] * 9
    # a0 and a1 trained in row 0; a2 masked: the full <|USER|> u2 <|END|> is not in row 1
    assert np.flatnonzero(rows.mask[0]).tolist() == [8, 9, 10, 11, 16, 17, 18, 19]
    assert rows.mask[1].sum() == 0
    assert plan.segments.prefix.tolist() == [0, 5] and plan.tokens_placed == 22 + 13
    assert plan.prefix_tokens.tolist() == [S, 10, 11, E, U] and plan.tokens_injected == 5
    assert plan.stopped_conversations == 0 and plan.tokens_lost == 0


def test_stream_row_starting_at_the_user_marker_gets_the_system_span_and_trains_a2():
    plan, rows = stream([CUT_EXAMPLE], 20)  # row 1 starts exactly at <|USER|> u2
    assert rows.tokens[1, :13].tolist() == [S, 10, 11, E, U, 60, 61, 62, E, A, 70, 71, E]
    assert np.flatnonzero(rows.mask[1]).tolist() == [9, 10, 11, 12]
    assert plan.segments.prefix.tolist() == [0, 4]


def test_stream_without_a_system_span_injects_only_the_user_marker():
    ep = episode((U, u0), (A, a0), (U, u2), (A, a2))  # U0 .. E3 A4 .. E7 U8 60 61 62 E12 A13 .. E16 EOS17
    plan, rows = stream([ep], 10)
    assert rows.tokens[1, :9].tolist() == [U, 61, 62, E, A, 70, 71, E, EOS]
    assert plan.segments.prefix.tolist() == [0, 1]
    assert rows.mask[1].sum() == 0


def test_stream_row_starting_inside_a_user_span_that_does_not_end_stops_the_conversation():
    long_user = list(range(100, 130))
    ep1 = episode((U, u0), (A, a0), (U, long_user), (A, a2), system=s0)  # U12 then 30 tokens, E43
    ep2 = episode((U, u1), (A, a1))
    plan, rows = stream([ep1, ep2], 16)
    # row 0: ep1[:16]; row 1 starts inside the long user span: S s0 E U + 11 tokens, then stop
    assert rows.tokens[1].tolist() == [S, 10, 11, E, U] + ep1[16:27].tolist()
    assert rows.mask[1].sum() == 0
    assert plan.stopped_conversations == 1
    # the rest of ep1 is skipped; ep2 starts row 2 whole
    np.testing.assert_array_equal(rows.tokens[2, :ep2.size], ep2)
    assert plan.num_rows == 3 and plan.tokens_lost == ep1.size - 27
    assert np.flatnonzero(rows.mask[2]).tolist() == [4, 5, 6, 7]


def test_stream_row_starting_inside_an_assistant_span_is_not_rewritten():
    ep = episode((U, u0), (A, [30, 31, 32, 33]), (U, u1), (A, a1))  # A4 30 31 32 33 E9 U10 ..E13 A14 ..E17 EOS18
    plan, rows = stream([ep], 7)  # rows start at 7 (inside the assistant span) and 14 (at <|ASSISTANT|>)
    assert plan.tokens_injected == 0
    np.testing.assert_array_equal(rows.tokens.reshape(-1)[:ep.size], ep)
    # the assistant cut at row 0's end is untrained in both rows; so is a1, whose
    # context (the user span) is in row 1 while a1 starts row 2
    assert rows.tokens[1].tolist() == [32, 33, E, U, 40, 41, E]
    assert rows.mask.sum() == 0


def test_stream_row_starting_inside_a_tool_span_is_not_rewritten():
    ep = episode((U, u0), (A, a0), (T, [80, 81, 82]), (A, a1))  # T8 80 81 82 E12 A13 50 51 E16 EOS17
    plan, rows = stream([ep], 10)
    assert plan.tokens_injected == 0
    assert rows.tokens[1, :8].tolist() == [81, 82, E, A, 50, 51, E, EOS]
    assert rows.mask[1].sum() == 0  # its context (the tool span) is not complete in the row


def test_stream_prefix_cases():
    ep = CUT_EXAMPLE
    assert stream_prefix(ep, 21, M)[0].tolist() == [S, 10, 11, E, U] and stream_prefix(ep, 21, M)[1] == 24
    assert stream_prefix(ep, 24, M)[0].tolist() == [S, 10, 11, E, U]  # at the user span's END
    assert stream_prefix(ep, 20, M)[0].tolist() == [S, 10, 11, E]  # at <|USER|>
    for q in (1, 3, 8, 10, 11, 25, 29):  # inside the system span, at/inside assistant spans, EOS
        assert stream_prefix(ep, q, M) == (None, None)


def test_stream_row_starting_at_a_user_marker_without_system_is_not_changed():
    ep = episode((U, u0), (A, a0), (U, u1), (A, a1))  # U8 starts row 1
    plan, rows = stream([ep], 8)
    assert plan.segments.prefix.tolist() == [0, 0, 0] and plan.prefix_tokens.size == 0
    assert rows.tokens[1].tolist() == [U, 40, 41, E, A, 50, 51, E]
    assert rows.tokens[2].tolist() == [EOS] + [PAD] * 7
    assert np.flatnonzero(rows.mask[1]).tolist() == [4, 5, 6, 7]


def test_stream_places_every_token_once_when_nothing_is_rewritten():
    rng = np.random.default_rng(7)
    eps = [np.concatenate([rng.integers(0, 1000, int(rng.integers(1, 30))), [EOS]]) for _ in range(40)]
    plan, rows = stream(eps, 17)
    np.testing.assert_array_equal(rows.tokens.reshape(-1)[:plan.tokens_placed], np.concatenate(eps))
    assert plan.num_rows == -(-sum(e.size for e in eps) // 17)
    assert plan.whole_episodes().sum() < len(eps)  # cut episodes are not whole
