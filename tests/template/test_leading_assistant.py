"""One leading-assistant policy for every tokenizer (issue 41): a reply that opens the
conversation answers no one, so it is not trained, under sftdata's markers or any chat
template, and counted the same way (``leading_assistant_untrained``); where a template
cannot render or cannot leave it untrained, it is dropped and counted under its own name
as well (``dropped_leading_assistant``). Every dataset verifies (the rule re-derives it)."""

from __future__ import annotations

import hashlib

import numpy as np
import orjson
import pytest

from sftdata.chat.template_rule import MaskRule, rule_mask, segment_rule_mask
from sftdata.errors import DatasetError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.store import open_dataset
from sftdata.verify import verify
from tests.helpers.audit import edit_metadata
from tests.helpers.data import write_jsonl
from tests.helpers.templates import TOKENS, train_tokenizer

OPENS = "Welcome, traveller! Ask me anything."
RECORDS = [
    {"conversations": [{"from": "gpt", "value": OPENS}, {"from": "human", "value": f"What is {i}+{i}?"},
                       {"from": "gpt", "value": f"It is {2 * i}."}]} for i in range(3)
] + [
    {"conversations": [{"from": "human", "value": f"Say {w}."}, {"from": "gpt", "value": f"{w}!"}]}
    for w in ("hello", "goodbye")
] + [
    {"system": "Be brief.", "conversations": [{"from": "gpt", "value": OPENS}, {"from": "gpt", "value": "Really."},
                                              {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]},
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return {name: train_tokenizer(root / name, *TOKENS[name][:3], TOKENS[name][3],
                                  config={"pad_token": TOKENS[name][0][0]})
            for name in ("llama3", "chatml", "gemma", "mistral")}


@pytest.mark.parametrize("tokenizer, template, dropped", [
    (None, None, 0),  # sftdata's markers, cl100k_base
    ("llama3", "llama3", 0),
    ("chatml", "qwen3", 0),
    ("gemma", "gemma", 0),
    ("mistral", "mistral", 4),  # its template gives a leading reply no header: dropped
])
def test_the_same_records_count_the_same_leading_replies_under_every_tokenizer(folders, tmp_path, tokenizer,
                                                                               template, dropped):
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    opts = PrepareOptions(workers=1, tokenizer=str(folders[tokenizer]) if tokenizer else None,
                          chat_template=template, allow_pad_as_stop=True)
    s = prepare([src], tmp_path / "ds", opts)
    assert s.rejected == {} and s.episodes == {"train": 6}
    assert s.repaired.get("leading_assistant_untrained") == 4  # the same under every tokenizer
    assert s.repaired.get("dropped_leading_assistant", 0) == dropped
    assert verify(tmp_path / "ds").ok
    meta = orjson.loads((tmp_path / "ds" / "dataset_metadata.json").read_bytes())
    assert meta["counts"]["repaired"]["leading_assistant_untrained"] == 4
    split = open_dataset(tmp_path / "ds").split("train")
    state = orjson.loads((tmp_path / "ds" / "tokenizer_state.json").read_bytes())
    if tokenizer is not None and not dropped:
        assert state["mask_rule"]["asked"], "the rule says which turns a reply answers"
    for i in range(split.num_episodes):  # never a token of the reply that answers no one
        _, mask = split.episode(i)
        mask = np.asarray(mask)
        trained_runs = int(((mask[1:] == 1) & (mask[:-1] == 0)).sum() + (mask[0] == 1))
        assert trained_runs == 1  # each record here has exactly one reply that answers someone


def test_a_rule_leaves_a_reply_with_no_asked_turn_before_it_untrained():
    """<a> opens a reply, <e> ends one, <u> opens a user turn (asked)."""
    a, e, u = 1, 2, 3
    rule = MaskRule(((a,),), (e,), asked=((u,),))
    ids = [a, 7, e, u, 8, e, a, 9, e]
    assert rule_mask(ids, rule).tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert rule_mask(ids, MaskRule(((a,),), (e,))).tolist() == [0, 1, 1, 0, 0, 0, 0, 1, 1]  # without: as before
    # per segment: the asked turn of one segment does not answer a reply of the next
    assert segment_rule_mask([u, 8, e, a, 9, e, a, 7, e], [6, 3], rule).tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 0]
    assert MaskRule.from_state(rule.state()) == rule and "asked" not in MaskRule(((a,),), (e,)).state()
    with pytest.raises(DatasetError, match="'asked' \\(lists of token ids\\) where given"):
        MaskRule.from_state({**rule.state(), "asked": [[]]})


def _edit_rule(ds, fn) -> None:
    """``fn`` applied to the recorded mask rule, as a writer that wrote it would record it
    (the state's size and sha256 in the metadata, the metadata resealed)."""
    state = orjson.loads((ds / "tokenizer_state.json").read_bytes())
    fn(state["mask_rule"])
    data = orjson.dumps(state)
    (ds / "tokenizer_state.json").write_bytes(data)

    def meta_fn(meta):
        fn(meta["tokenizer"]["mask_rule"])
        meta["files"]["tokenizer_state.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    edit_metadata(ds, meta_fn)


def test_a_rule_recorded_before_asked_existed_still_verifies_and_an_edited_one_fails(folders, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS[3:5])  # no leading reply: the same masks with or without it
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1, tokenizer=str(folders["llama3"]), chat_template="llama3",
                                                    allow_pad_as_stop=True))
    assert verify(tmp_path / "ds").ok
    _edit_rule(tmp_path / "ds", lambda rule: rule.pop("asked"))  # as an older sftdata wrote it
    assert verify(tmp_path / "ds").ok
    _edit_rule(tmp_path / "ds", lambda rule: rule.update(asked=[[1, 2, 3]]))  # not what the template gives
    problems = [p for p in verify(tmp_path / "ds", quick=True).problems if p.code == "template_rule"]
    assert len(problems) == 1 and "differs from the recorded one in asked" in problems[0].message


def test_a_cut_piece_drops_its_first_reply_once_whether_or_not_it_was_asked():
    """A packed piece that begins inside a user turn (``cut``): its first reply is untrained
    because its context may be cut, and the reply after it, which its own user turn asks,
    is trained; ``asked`` must not drop a second reply on top of the cut's."""
    u, a, e = 1, 2, 5
    episode = [u, 10, 11, e, a, 20, e, u, 12, e, a, 21, e]
    rule = MaskRule(((a,),), (e,), asked=((u,),))
    piece = episode[1:]  # begins inside the first user turn
    want = [0] * (len(piece) - 2) + [1, 1]
    assert segment_rule_mask(piece, [len(piece)], rule, cut=[True]).tolist() == want
    assert segment_rule_mask(piece, [len(piece)], MaskRule(((a,),), (e,)), cut=[True]).tolist() == want
    whole = segment_rule_mask(episode + piece, [len(episode), len(piece)], rule, cut=[False, True]).tolist()
    assert whole == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1] + want
