"""The mask rule as one interface: the chat markers' rule and a template's rule, per piece
(episodes, segments of packed rows), cut pieces, and loading the rule from a tokenizer state."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.chat.loss_rule import MarkerRule, TemplateRule, as_rule, rule_from_state
from sftdata.chat.markers import MarkerIds
from sftdata.chat.masking import loss_mask
from sftdata.chat.template_rule import segment_rule_mask
from sftdata.chat.tokenizer import load_tokenizer
from sftdata.errors import DatasetError
from sftdata.packing import Segments
from sftdata.packing.plan import row_mask, segment_masks
from sftdata.packing.strategies import stream_prefix
from sftdata.template import MaskRule, rule_mask

H1, H2, E = 5, 6, 9  # header <5 6>, end-of-turn 9
RULE = MaskRule(headers=((H1, H2),), end_ids=(E,))
T = TemplateRule(RULE, pad_id=E)
M = MarkerIds(system=100277, user=100278, assistant=100279, tool=100280, tool_call=100281, end=100282, eos=100257)


def pieces(rng, n):
    """Random pieces over a small alphabet that holds the header and end tokens often."""
    return [rng.choice([1, 2, H1, H2, E], size=int(rng.integers(0, 14))).astype(np.int64) for _ in range(n)]


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("last_only", [False, True])
def test_template_masks_equal_the_rule_on_each_piece_alone(seed, last_only):
    rng = np.random.default_rng(seed)
    rule = MaskRule(((H1, H2), (H1,)), (E, 2), end_inclusive=bool(seed % 2), last_reply_only=last_only)
    segs = pieces(rng, 6)
    toks = np.concatenate(segs)
    got = segment_rule_mask(toks, np.array([len(s) for s in segs]), rule)
    want = np.concatenate([rule_mask(s, rule) for s in segs])
    assert got.tolist() == want.tolist()


def test_template_rule_golden_pieces_and_cut():
    a = [1, H1, H2, 3, E, 1, H1, H2, 4, E]  # two replies: [3 E] and [4 E]
    b = [H1, H2, 7]  # a reply open where the piece ends: untrained
    toks = np.array(a + b + a, dtype=np.int64)
    lengths = np.array([10, 3, 10])
    assert T.masks(toks, lengths).tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1] + [0, 0, 0] + \
        [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    # the third piece begins inside its episode: its first reply is left untrained, the second kept
    cut = np.array([False, False, True])
    assert T.masks(toks, lengths, cut).tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1] + [0, 0, 0] + \
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    last = TemplateRule(MaskRule(((H1, H2),), (E,), last_reply_only=True), pad_id=0)
    assert last.masks(np.array(a), np.array([10])).tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]


def test_marker_rule_equals_loss_mask_and_ignores_cut():
    tok = load_tokenizer()
    m = tok.ids
    ep = np.array([m.user, 11, m.end, m.assistant, 12, m.end, m.eos], dtype=np.int64)
    rule = MarkerRule(m)
    assert rule.masks(np.concatenate([ep, ep]), np.array([7, 7])).tolist() == loss_mask(ep, m).tolist() * 2
    assert rule.masks(ep, np.array([7]), cut=np.array([True])).tolist() == loss_mask(ep, m).tolist()
    assert as_rule(m) == rule and as_rule(rule) is rule
    assert rule.where(ep, 4) == "a <|ASSISTANT|> span" and rule.where(ep, 6) == "the closing <|EOS|>"
    assert rule.span_names(ep) == ["user", "user", "user", "assistant", "assistant", "assistant", ""]
    assert rule.pad_id == rule.eos_id == m.eos and rule.kind == "markers"


def test_template_rule_where_and_span_names():
    ids = np.array([1, H1, H2, 3, E, 1])
    assert T.span_names(ids) == ["", "header", "header", "assistant", "assistant", ""]
    assert [T.where(ids, p) for p in (0, 1, 3)] == ["text outside any assistant reply", "an assistant header",
                                                     "an assistant reply"]
    assert T.eos_id is None and T.kind == "template"


def test_row_mask_cuts_template_segments_that_start_inside_their_episode():
    """A stream row holding the end of one episode (cut) and a whole one."""
    seg = Segments(row=np.array([0, 0]), offset=np.array([0, 7]), length=np.array([7, 5]), prefix=np.zeros(2, np.int64),
                   episode=np.array([0, 1]), episode_start=np.array([3, 0]), source=np.array([-1, -1]))
    row = np.array([3, E, H1, H2, 4, E, 2] + [1, H1, H2, 8, E] + [0], dtype=np.int64)
    assert row_mask(row, seg, 13, T).tolist() == [0] * 7 + [0, 0, 0, 1, 1] + [0]
    assert segment_masks(row[:7], np.array([7]), T).tolist() == [0, 0, 0, 0, 1, 1, 0]  # whole: trained
    assert stream_prefix(row, 3, T) == (None, None)  # a template's rows are never rewritten


def test_rule_from_state():
    tok = load_tokenizer()
    assert rule_from_state(None) is None
    assert rule_from_state(tok.state()) == MarkerRule(tok.ids)
    state = {"kind": "hf-tokenizers", "pad_id": 0, "eos_id": 9, "mask_rule": RULE.state()}
    assert rule_from_state(state) == TemplateRule(RULE, 0)
    assert rule_from_state({**state, "pad_id": None}).pad_id == 9
    with pytest.raises(DatasetError, match=r"x.json: mask_rule is not a 'template-headers' rule; re-prepare"):
        rule_from_state({"kind": "hf-tokenizers"}, "x.json")
    with pytest.raises(DatasetError, match=r"x.json records neither sftdata's chat markers \(special_tokens\) nor a "
                                           r"template's mask_rule"):
        rule_from_state({"format": "sftdata-tokenizer"}, "x.json")
    with pytest.raises(DatasetError, match="x.json is not a JSON object"):
        rule_from_state([], "x.json")
