"""The seed 002 stream strategy: golden example and each boundary rule."""

from __future__ import annotations

import numpy as np
from test_packing import EOS, PAD, A, E, M, S, T, U, build, episode

from sftdata.stream_packing import plan_stream, stream_prefix

s0, u0, a0, u1, a1, u2, a2 = [10, 11], [20, 21], [30, 31], [40, 41], [50, 51], [60, 61, 62], [70, 71]
SEED_EXAMPLE = episode((U, u0), (A, a0), (U, u1), (A, a1), (U, u2), (A, a2), system=s0)
# positions: S0 s s E3 | U4 .. E7 | A8 .. E11 | U12 .. E15 | A16 .. E19 | U20 60 61 62 E24 | A25 70 71 E28 | EOS29


def stream(eps, row_len):
    plan = plan_stream(np.array([e.size for e in eps]), lambda i: eps[i], M, row_len)
    return plan, build(plan, eps)


def test_stream_golden_seed_002_example_cut_inside_u2():
    plan, rows = stream([SEED_EXAMPLE], 22)  # row 0 ends after the first token of u2
    assert plan.num_rows == 2
    np.testing.assert_array_equal(rows.tokens[0], SEED_EXAMPLE[:22])
    expected = [S, 10, 11, E, U, 61, 62, E, A, 70, 71, E, EOS]
    assert rows.tokens[1].tolist() == expected + [PAD] * 9
    # a0 and a1 trained in row 0; a2 masked: the full <|USER|> u2 <|END|> is not in row 1
    assert np.flatnonzero(rows.mask[0]).tolist() == [8, 9, 10, 11, 16, 17, 18, 19]
    assert rows.mask[1].sum() == 0
    assert plan.seg_prefix.tolist() == [0, 5] and plan.tokens_placed == 22 + 13
    assert plan.stopped_conversations == 0 and plan.tokens_lost == 0


def test_stream_row_starting_at_the_user_marker_gets_the_system_span_and_trains_a2():
    plan, rows = stream([SEED_EXAMPLE], 20)  # row 1 starts exactly at <|USER|> u2
    assert rows.tokens[1, :13].tolist() == [S, 10, 11, E, U, 60, 61, 62, E, A, 70, 71, E]
    assert np.flatnonzero(rows.mask[1]).tolist() == [9, 10, 11, 12]
    assert plan.seg_prefix.tolist() == [0, 4]


def test_stream_without_a_system_span_injects_only_the_user_marker():
    ep = episode((U, u0), (A, a0), (U, u2), (A, a2))  # U0 .. E3 A4 .. E7 U8 60 61 62 E12 A13 .. E16 EOS17
    plan, rows = stream([ep], 10)
    assert rows.tokens[1, :9].tolist() == [U, 61, 62, E, A, 70, 71, E, EOS]
    assert plan.seg_prefix.tolist() == [0, 1]
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
    assert plan.seg_prefix.sum() == 0
    np.testing.assert_array_equal(rows.tokens.reshape(-1)[:ep.size], ep)
    # the assistant cut at row 0's end is untrained in both rows; so is a1, whose
    # context (the user span) is in row 1 while a1 starts row 2
    assert rows.tokens[1].tolist() == [32, 33, E, U, 40, 41, E]
    assert rows.mask.sum() == 0


def test_stream_row_starting_inside_a_tool_span_is_not_rewritten():
    ep = episode((U, u0), (A, a0), (T, [80, 81, 82]), (A, a1))  # T8 80 81 82 E12 A13 50 51 E16 EOS17
    plan, rows = stream([ep], 10)
    assert plan.seg_prefix.sum() == 0
    assert rows.tokens[1, :8].tolist() == [81, 82, E, A, 50, 51, E, EOS]
    assert rows.mask[1].sum() == 0  # its context (the tool span) is not complete in the row


def test_stream_prefix_cases():
    ep = SEED_EXAMPLE
    assert stream_prefix(ep, 21, M)[0].tolist() == [S, 10, 11, E, U] and stream_prefix(ep, 21, M)[1] == 24
    assert stream_prefix(ep, 24, M)[0].tolist() == [S, 10, 11, E, U]  # at the user span's END
    assert stream_prefix(ep, 20, M)[0].tolist() == [S, 10, 11, E]  # at <|USER|>
    for q in (1, 3, 8, 10, 11, 25, 29):  # inside the system span, at/inside assistant spans, EOS
        assert stream_prefix(ep, q, M) == (None, None)


def test_stream_row_starting_at_a_user_marker_without_system_is_not_changed():
    ep = episode((U, u0), (A, a0), (U, u1), (A, a1))  # U8 starts row 1
    plan, rows = stream([ep], 8)
    assert plan.seg_prefix.tolist() == [0, 0, 0] and plan.prefixes == {}
    assert rows.tokens[1].tolist() == [U, 40, 41, E, A, 50, 51, E]
    assert rows.tokens[2].tolist() == [EOS] + [PAD] * 7
    assert np.flatnonzero(rows.mask[1]).tolist() == [4, 5, 6, 7]


def test_stream_places_every_token_once_when_nothing_is_rewritten():
    rng = np.random.default_rng(7)
    eps = [np.concatenate([rng.integers(0, 1000, int(rng.integers(1, 30))), [EOS]]) for _ in range(40)]
    plan, rows = stream(eps, 17)
    np.testing.assert_array_equal(rows.tokens.reshape(-1)[:plan.tokens_placed], np.concatenate(eps))
    assert plan.num_rows == -(-sum(e.size for e in eps) // 17)
