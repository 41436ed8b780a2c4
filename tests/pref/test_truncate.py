"""The one truncation policy of a pair, as a pure function of token flags."""

from __future__ import annotations

import numpy as np

from sftdata.pref.truncate import Cut, Truncation, plan_cut, run_starts

S, T = True, False  # a special token, a text token


def _flags(*f):
    return np.array(f, dtype=bool)


def test_run_starts():
    assert run_starts(_flags(S, S, T, T, S, T, S, S)).tolist() == [0, 4, 6]


def test_keep_end_cuts_the_prompt_where_a_turn_starts_and_both_completions_to_one_budget():
    prompt = _flags(S, T, T, T, S, T, T, S, S)  # <bos><u> a b c <E><u> d <E><a>: turns start at 0, 4, 7
    chosen, rejected = _flags(T, T, T, T, S), _flags(T, T, S)
    masks = [np.ones(5, np.uint8), np.ones(3, np.uint8)]
    cut = plan_cut(prompt, [chosen, rejected], masks, Truncation(max_length=8, max_prompt_length=5))
    assert cut == Cut(4, (3, 3))  # the prompt keeps 5 tokens from a turn start; each completion the same 3


def test_a_completion_is_never_cut_inside_a_run_of_special_tokens():
    chosen = _flags(T, T, S, S, S)  # text, then a 3-token special run
    cut = plan_cut(_flags(S, S), [chosen, _flags(T)], [np.ones(5, np.uint8), np.ones(1, np.uint8)],
                   Truncation(max_length=6))
    assert cut.ends == (2, 1)  # budget 4 would end inside the run: moved back before it


def test_a_completion_cut_to_no_trained_token_drops_the_pair():
    cut = plan_cut(_flags(S, S), [_flags(T, T, T), _flags(T)], [np.array([0, 1, 1], np.uint8), np.ones(1, np.uint8)],
                   Truncation(max_length=3))
    assert cut.reason == "completion_truncated_to_empty"
    assert cut.message == "completion 0 would keep no trained token within --max-length 3 after a 2-token prompt"


def test_keep_start_and_drop_never_cut_a_prompt():
    prompt = _flags(S, T, T, T, S)
    for policy in ("keep-start", "drop"):
        cut = plan_cut(prompt, [_flags(T)], [np.ones(1, np.uint8)], Truncation(max_length=9, max_prompt_length=3,
                                                                                policy=policy))
        assert cut.reason == "prompt_too_long"
    cut = plan_cut(_flags(S), [_flags(T, T, T)], [np.ones(3, np.uint8)], Truncation(max_length=3, policy="drop"))
    assert (cut.reason, cut.message) == ("too_long", "prompt + completion is 4 tokens, over --max-length 3 "
                                                     "(--truncation drop)")
