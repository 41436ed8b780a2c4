"""A chunk of preference records rendered at once (one tokenizer call, the masks of every
completion in one rule call) is exactly the records rendered one by one: the same ids,
masks and repairs, the same refusal with the same message for each refused record."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.chat.pair_rule import completion_mask, completion_masks
from sftdata.errors import RecordError
from sftdata.pref.render import render_record, render_records
from sftdata.pref.run import PrefOptions, open_context
from sftdata.records.preference import parse_preference

U = {"role": "user", "content": "What color is the sky?"}


def _pair(chosen: str, rejected: str, prompt=(U,)) -> dict:
    return {"prompt": list(prompt), "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}]}


RECORDS = [
    _pair("It is blue.", "It is green, surely."),
    _pair("One.", "Two.", ({"role": "user", "content": "A <|im_end|> in the prompt."},)),  # special_token_in_text
    {"prompt": [U], "chosen": [{"role": "user", "content": "no"}], "rejected": [{"role": "assistant", "content": "x"}]},
    _pair("Blue, by day.", "Black at night.", (U, {"role": "assistant", "content": "Which sky?"},
                                              {"role": "user", "content": "Ours."})),
    {"prompt": [U], "completion": [{"role": "assistant", "content": "Blue."}], "label": True},  # KTO
    _pair("A <|im_end|> in text.", "Fine."),  # special_token_in_text under chatml
    _pair("Last one.", "Really the last."),
]


def _context(tmp_path, template: bool):
    if not template:
        return open_context(PrefOptions(), False)[0]
    pytest.importorskip("tokenizers")
    from sftdata.template import PRESETS
    from tests.helpers.templates import TOKENS, train_tokenizer

    specials, bos, eos, extra = TOKENS["chatml"]
    folder = train_tokenizer(tmp_path / "chatml", specials, bos, eos, extra, {"chat_template": PRESETS["chatml"],
                                                                                  "pad_token": "<|endoftext|>"})
    return open_context(PrefOptions(tokenizer=str(folder)), False)[0]


def _outcome(r):
    if isinstance(r, RecordError):
        return ("error", r.reason, r.detail)
    return ("row", r.prompt.tolist(), [c.tolist() for c in r.completions], [m.tolist() for m in r.masks], r.repairs)


@pytest.mark.parametrize("template", [False, True], ids=["markers", "chatml"])
def test_a_chunk_renders_exactly_as_its_records_one_by_one(tmp_path, template):
    ctx = _context(tmp_path, template)
    items = [(parse_preference(r, f"pairs.jsonl line {i + 1}"), f"pairs.jsonl line {i + 1}")
             for i, r in enumerate(RECORDS)]
    chunk = render_records(items, ctx.tok, ctx.profile, ctx.rule, ctx.policy)
    alone = []
    for rec, where in items:
        try:
            alone.append(render_record(rec, ctx.tok, ctx.profile, ctx.rule, ctx.policy, where))
        except RecordError as e:
            alone.append(e)
    assert [_outcome(r) for r in chunk] == [_outcome(r) for r in alone]
    kinds = [o[1] if o[0] == "error" else "row" for o in map(_outcome, chunk)]
    special = "special_token_in_text" if template else "row"  # sftdata's markers encode text as text
    assert kinds == ["row", special, "no_assistant_turn", "row", "row", special, "row"]
    assert [r.where for r in chunk if isinstance(r, RecordError)] == \
        [w for r, (_, w) in zip(chunk, items) if isinstance(r, RecordError)]
    assert render_records([], ctx.tok, ctx.profile, ctx.rule, ctx.policy) == []


@pytest.mark.parametrize("template", [False, True], ids=["markers", "chatml"])
def test_the_masks_of_many_completions_in_one_call_are_each_ones_own(tmp_path, template):
    ctx = _context(tmp_path, template)
    items = [(parse_preference(r, "x"), "x") for r in (RECORDS[0], RECORDS[3], RECORDS[4])]
    renders = render_records(items, ctx.tok, ctx.profile, ctx.rule, ctx.policy)
    pieces = [(r.prompt, c) for r in renders for c in r.completions]
    pieces += [(p, c[: max(1, c.shape[0] // 2)]) for p, c in pieces]  # cut completions: no end-of-turn
    pieces += [(p[3:], c) for p, c in pieces[:2]]  # a prompt cut at its start
    got = completion_masks(ctx.rule, pieces)
    want = [completion_mask(ctx.rule, p, c) for p, c in pieces]
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert [g.dtype for g in got] == [np.dtype(np.uint8)] * len(pieces)
    assert sum(int(g.sum()) for g in got) > 0 and completion_masks(ctx.rule, []) == []
