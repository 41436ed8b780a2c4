"""The mask rule over token ids (pure numpy: no tokenizer, no template)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sftdata.chat.loss_rule import TemplateRule
from sftdata.chat.stops import rule_stop_ids, serving_stop_ids
from sftdata.chat.template_rule import MaskRule, mask_disagreement, rule_mask, rule_spans, segment_rule_mask
from sftdata.errors import DatasetError

# Llama 3-like ids: 1 = <bos>, 2 = <start_header>, 3 = <end_header>, 4 = "\n\n", 5 = <eot>,
# 10 = "user", 11 = "assistant", 20.. = text
LLAMA = MaskRule(headers=((2, 11, 3, 4),), end_ids=(5,))


def test_worked_example():
    ids = np.array([1, 2, 10, 3, 4, 20, 5, 2, 11, 3, 4, 21, 22, 5], dtype=np.uint32)
    assert rule_mask(ids, LLAMA).tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert rule_mask(ids, LLAMA).dtype == np.uint8


def test_two_replies_and_an_unclosed_one():
    ids = np.array([2, 10, 3, 4, 20, 5, 2, 11, 3, 4, 21, 5, 2, 10, 3, 4, 22, 5, 2, 11, 3, 4, 23, 5,
                    2, 11, 3, 4, 24, 25])
    mask = rule_mask(ids, LLAMA)
    assert np.flatnonzero(mask).tolist() == [10, 11, 22, 23]
    starts, ends = rule_spans(ids, LLAMA)
    assert starts.tolist() == [10, 22] and ends.tolist() == [12, 24]


def test_several_headers_end_exclusive_and_a_header_inside_a_reply():
    # Mistral-like: 7 = [/INST], 8 = [/TOOL_RESULTS], 9 = </s>; the end token left out
    rule = MaskRule(headers=((7,), (8,)), end_ids=(9,), end_inclusive=False)
    ids = np.array([30, 7, 31, 32, 9, 33, 8, 34, 7, 35, 9])
    assert rule_mask(ids, rule).tolist() == [0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0]
    # the [/INST] at 8 lies inside the reply opened at 6: one span, not two
    assert rule_spans(ids, rule)[0].tolist() == [2, 7]


def test_header_at_the_very_end_and_empty_input():
    assert rule_mask(np.array([20, 2, 11, 3, 4]), LLAMA).tolist() == [0] * 5
    assert rule_mask(np.array([], dtype=np.uint32), LLAMA).tolist() == []
    assert rule_mask(np.array([2, 11]), LLAMA).tolist() == [0, 0]


def test_input_is_not_changed():
    ids = np.array([2, 11, 3, 4, 21, 5], dtype=np.uint16)
    before = ids.copy()
    rule_mask(ids, LLAMA)
    assert np.array_equal(ids, before)


def test_disagreement_names_the_first_token():
    ids = np.array([2, 11, 3, 4, 21, 5])
    assert mask_disagreement(ids, np.array([0, 0, 0, 0, 1, 1]), LLAMA) is None
    assert mask_disagreement(ids, np.array([0, 0, 0, 1, 1, 1]), LLAMA) == 3
    assert mask_disagreement(ids, np.array([0, 0, 0, 0, 1, 0]), LLAMA) == 5


def test_state_round_trip():
    rule = MaskRule(headers=((7,), (8, 9)), end_ids=(5, 6), end_inclusive=False, last_reply_only=True)
    state = json.loads(json.dumps(rule.state()))
    assert state == {"kind": "template-headers", "headers": [[7], [8, 9]], "end_ids": [5, 6], "end_inclusive": False,
                     "last_reply_only": True}
    assert MaskRule.from_state(state) == rule


def test_last_reply_only():
    """For templates served one episode per reply: only the episode's last reply is trained."""
    rule = MaskRule(headers=((2, 11, 3, 4),), end_ids=(5,), last_reply_only=True)
    ids = np.array([2, 11, 3, 4, 21, 5, 2, 10, 3, 4, 20, 5, 2, 11, 3, 4, 22, 5])
    assert np.flatnonzero(rule_mask(ids, rule)).tolist() == [16, 17]


def test_last_reply_only_keeps_the_spans_only_a_header_separates():
    """gpt-oss writes a reply's reasoning as a message of its own: ``H analysis E H final E``
    is one reply (two spans, the header between untrained); another turn between two spans
    ends the earlier reply. Per piece, with stops between pieces, and with a cut piece."""
    rule = MaskRule(headers=((2, 11, 3, 4),), end_ids=(5,), last_reply_only=True, joined_spans=True)
    ids = np.array([2, 11, 3, 4, 21, 5, 2, 10, 3, 4, 20, 5, 2, 11, 3, 4, 22, 5, 2, 11, 3, 4, 23, 5])
    assert np.flatnonzero(rule_mask(ids, rule)).tolist() == [16, 17, 22, 23]
    # a template whose replies are never several spans: the last span alone (Llama 3's two
    # assistant messages in a row stay two replies)
    assert np.flatnonzero(rule_mask(ids, MaskRule(((2, 11, 3, 4),), (5,), last_reply_only=True))).tolist() == [22, 23]
    assert MaskRule.from_state(rule.state()) == rule and "joined_spans" not in MaskRule(((1,),), (5,)).state()
    two = np.concatenate([ids, ids])
    assert np.flatnonzero(segment_rule_mask(two, np.array([24, 24]), rule)).tolist() == [16, 17, 22, 23,
                                                                                          40, 41, 46, 47]
    cut = segment_rule_mask(two, np.array([24, 24]), rule, cut=np.array([False, True]))
    assert np.flatnonzero(cut).tolist() == [16, 17, 22, 23, 40, 41, 46, 47]  # its first reply (4) was not last
    assert np.flatnonzero(rule_mask(ids[:18], rule)).tolist() == [16, 17]


def test_a_flag_per_segment_keeps_that_segment_s_last_reply_only():
    """An episode served as one reply's prefix in a dataset whose rule trains every reply:
    its flag keeps its last reply alone (joined spans with it), the other segments keep
    every reply; the same as each segment masked alone with the rule or its last-reply one."""
    rule = MaskRule(headers=((2, 11, 3, 4),), end_ids=(5,), joined_spans=True)
    ids = np.array([2, 11, 3, 4, 21, 5, 2, 10, 3, 4, 20, 5, 2, 11, 3, 4, 22, 5, 2, 11, 3, 4, 23, 5])
    assert np.flatnonzero(rule_mask(ids, rule)).tolist() == [4, 5, 16, 17, 22, 23]
    assert np.flatnonzero(rule_mask(ids, rule, last_only=True)).tolist() == [16, 17, 22, 23]
    assert mask_disagreement(ids, rule_mask(ids, rule, last_only=True), rule) == 4
    assert mask_disagreement(ids, rule_mask(ids, rule, last_only=True), rule, last_only=True) is None
    three = np.concatenate([ids, ids, ids[:12]])
    lengths = np.array([24, 24, 12])
    flags = np.array([True, False, True])
    got = segment_rule_mask(three, lengths, rule, last_only=flags)
    alone = np.concatenate([rule_mask(ids, rule, last_only=True), rule_mask(ids, rule),
                            rule_mask(ids[:12], rule, last_only=True)])
    assert np.array_equal(got, alone)
    assert np.flatnonzero(got).tolist() == [16, 17, 22, 23, 28, 29, 40, 41, 46, 47, 52, 53]
    assert np.array_equal(segment_rule_mask(three, lengths, rule, last_only=np.zeros(3, bool)),
                          segment_rule_mask(three, lengths, rule))
    with pytest.raises(ValueError, match=r"\(2,\) last-reply flags for 3 segments"):
        segment_rule_mask(three, lengths, rule, last_only=flags[:2])


@pytest.mark.parametrize("state", [
    None, {"kind": "other"}, {"kind": "template-headers", "headers": [], "end_ids": [5], "end_inclusive": True},
    {"kind": "template-headers", "headers": [[1, -2]], "end_ids": [5], "end_inclusive": True},
    {"kind": "template-headers", "headers": [[1]], "end_ids": [], "end_inclusive": True},
    {"kind": "template-headers", "headers": [[1]], "end_ids": [5], "end_inclusive": "yes"},
    {"kind": "template-headers", "headers": [[1]], "end_ids": [5], "end_inclusive": True, "last_reply_only": 1},
    {"kind": "template-headers", "headers": [[1]], "end_ids": [5], "end_inclusive": True, "end_seqs": [[]]},
    {"kind": "template-headers", "headers": [[1]], "end_ids": [5], "end_inclusive": True, "end_seqs": [4, 4]},
])
def test_bad_state(state):
    with pytest.raises(DatasetError, match=r"^ds/tokenizer_state.json: mask_rule .*re-prepare the dataset"):
        MaskRule.from_state(state, where="ds/tokenizer_state.json")


def test_vectorised_on_a_long_array():
    reply = [2, 11, 3, 4, 21, 22, 5]
    turn = [2, 10, 3, 4, 20, 5]
    parts = [turn + reply for _ in range(5000)]
    ids = np.concatenate([np.array(p) for p in parts])
    mask = rule_mask(ids, LLAMA)
    assert mask.sum() == 5000 * 3
    assert mask[6:13].tolist() == [0, 0, 0, 0, 1, 1, 1] and mask[-13:-7].tolist() == [0] * 6


def test_the_longer_of_two_headers_at_one_place_wins():
    """``<|im_start|>assistant\\n`` and the same plus an empty think block (40 41 42)."""
    rule = MaskRule(headers=((1, 11, 4), (1, 11, 4, 40, 41, 42)), end_ids=(5,))
    ids = np.array([1, 11, 4, 21, 5, 1, 10, 4, 20, 5, 1, 11, 4, 40, 41, 42, 22, 5])
    assert np.flatnonzero(rule_mask(ids, rule)).tolist() == [3, 4, 16, 17]


# RWKV World-like text marker: 40 = "User", 41 = "Assistant", 42 = ":", 4 = "\n\n" (one token
# at the end of a text), 3 = "\n" (twice before the next turn's text)
TEXT_MARKER = MaskRule(headers=((41, 42),), end_ids=(4,), end_seqs=((3, 3),))


def test_a_text_marker_of_several_tokens_ends_a_reply_through_its_last_token():
    ids = np.array([40, 42, 20, 3, 3, 41, 42, 21, 22, 3, 3, 40, 42, 23, 3, 3, 41, 42, 24, 3, 25, 4])
    assert np.flatnonzero(rule_mask(ids, TEXT_MARKER)).tolist() == [7, 8, 9, 10, 18, 19, 20, 21]
    # one "\n" inside a reply does not end it; the marker split across two segments ends nothing
    lengths = np.array([10, 12])
    got = segment_rule_mask(ids, lengths, TEXT_MARKER)
    assert np.flatnonzero(got).tolist() == [18, 19, 20, 21]  # the first segment's reply is open at its end
    state = json.loads(json.dumps(TEXT_MARKER.state()))
    assert state["end_seqs"] == [[3, 3]] and MaskRule.from_state(state) == TEXT_MARKER
    assert "end_seqs" not in LLAMA.state()  # recorded only where there is one: older rules read as before
    only_seqs = MaskRule.from_state({**state, "end_ids": []})
    assert np.flatnonzero(rule_mask(ids[:11], only_seqs)).tolist() == [7, 8, 9, 10]


def test_a_text_marker_s_last_token_ends_a_trained_reply_but_generation_stops_at_one_token_ids_only():
    """verify's stop scan accepts a reply ending with the marker's last token (``\\n`` of
    ``\\n``, ``\\n``); serving.json's stop ids are the one-token ends (``\\n\\n``), never ``\\n``
    (generation would stop at every newline): the marker is its stop string."""
    rule = TemplateRule(TEXT_MARKER, pad_id=0)
    assert rule_stop_ids(rule) == (4, 3) and serving_stop_ids(rule) == (4,)
    assert rule_stop_ids(TemplateRule(LLAMA, pad_id=0)) == serving_stop_ids(TemplateRule(LLAMA, pad_id=0)) == (5,)
