"""A chunk of preference records rendered at once (one tokenizer call, the masks of every
completion in one rule call) is exactly the records rendered one by one: the same ids,
masks and repairs, the same refusal with the same message for each refused record."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.chat.pair_rule import completion_mask, completion_masks
from sftdata.errors import RecordError
from sftdata.pref.options import PrefOptions
from sftdata.pref.render import render_record, render_records
from sftdata.pref.run import open_context
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
    _pair("It is blue, again.", "Green, again."),  # record 0's prompt: rendered and tokenized once in a chunk
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


@pytest.mark.parametrize("template,beside", [(False, False), (True, False), (True, True)],
                         ids=["markers", "chatml", "chatml-encoded-beside"])
def test_a_chunk_renders_exactly_as_its_records_one_by_one(tmp_path, monkeypatch, template, beside):
    """``beside``: the chunk's texts are encoded on a second thread (a run's, while its next
    chunk renders: ``start_records`` with a pool), and then finished: the same outcome."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import sftdata.pref.render as render

    ctx = _context(tmp_path, template)
    items = [(parse_preference(r, f"pairs.jsonl line {i + 1}"), f"pairs.jsonl line {i + 1}")
             for i, r in enumerate(RECORDS)]
    monkeypatch.setattr(render, "ENCODE_BATCH", 2)
    threads, real = [], getattr(ctx.tok, "encode_fast_batch", None)
    if real is not None:
        monkeypatch.setattr(ctx.tok, "encode_fast_batch",
                            lambda batch: threads.append(threading.current_thread().name) or real(batch))
    with ThreadPoolExecutor(1, thread_name_prefix="beside") as pool:
        started = render.start_records(items, ctx.tok, ctx.profile, ctx.policy, pool if beside else None)
        chunk = render.finish_records(started, ctx.tok, ctx.rule)
    assert threads == (["beside_0"] if beside else ["MainThread"] if template else [])
    alone = []
    for rec, where in items:
        try:
            alone.append(render_record(rec, ctx.tok, ctx.profile, ctx.rule, ctx.policy, where))
        except RecordError as e:
            alone.append(e)
    assert [_outcome(r) for r in chunk] == [_outcome(r) for r in alone]
    kinds = [o[1] if o[0] == "error" else "row" for o in map(_outcome, chunk)]
    special = "special_token_in_text" if template else "row"  # sftdata's markers encode text as text
    assert kinds == ["row", special, "no_assistant_turn", "row", "row", special, "row", "row"]
    assert chunk[7].prompt.tolist() == chunk[0].prompt.tolist()
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


def test_a_record_is_refused_for_its_first_sides_first_failing_step(tmp_path):
    """Chosen is checked through to its end before rejected: a chosen that fails late (its
    render does not begin with the prompt) is the refusal even when rejected fails early
    (a special token in its text, or an empty reply); a clean chosen lets rejected's be."""
    ctx = _context(tmp_path, True)
    late = "\n\nHello"  # the reply's leading newlines join the generation prompt's: not a prefix
    cases = [(_pair(late, "A <|im_end|> here"), "prompt_not_prefix"),
             (_pair(late, ""), "prompt_not_prefix"),
             (_pair("Fine.", "A <|im_end|> here"), "special_token_in_text"),
             (_pair("Fine.", late), "prompt_not_prefix")]
    items = [(parse_preference(r, f"line {i}"), f"line {i}") for i, (r, _) in enumerate(cases)]
    got = render_records(items, ctx.tok, ctx.profile, ctx.rule, ctx.policy)
    assert [g.reason for g in got] == [want for _, want in cases]
    assert "the chosen render" in got[0].detail and "the rejected render" in got[3].detail


@pytest.mark.parametrize("stage", ["encode", "locate"])
def test_a_tokenizer_failure_stays_with_its_record_and_side(tmp_path, monkeypatch, stage):
    """The tokenizers library failing on one text of the chunk (encoding it, or locating
    its replies' tokens) refuses that record alone, as tokenizer_error at the side it hit;
    the chunk's other records come out as they do with no failure."""
    from concurrent.futures import ThreadPoolExecutor

    import sftdata.pref.render as render
    from sftdata.errors import TokenizerFailure

    ctx = _context(tmp_path, True)
    tok = ctx.tok
    records = [RECORDS[0], _pair("Fine.", "BOOM goes the tokenizer."), RECORDS[3], RECORDS[4]]
    items = [(parse_preference(r, f"line {i}"), f"line {i}") for i, r in enumerate(records)]
    clean = [_outcome(r) for r in render_records(items, tok, ctx.profile, ctx.rule, ctx.policy)]
    real_many, real_one, real_ranges = tok.encode_rendered_many, tok.encode_rendered, tok.token_ranges_many

    def boom(texts):
        if any("BOOM" in t for t in texts):
            raise TokenizerFailure("the tokenizers library panicked encoding a rendered text: boom")

    if stage == "encode":
        monkeypatch.setattr(render, "ENCODE_BATCH", 2)  # the chunk is encoded on the pool's thread
        real_fast = tok.encode_fast_batch
        monkeypatch.setattr(tok, "encode_fast_batch", lambda batch: boom(batch.texts) or real_fast(batch))
        monkeypatch.setattr(tok, "encode_rendered_many", lambda texts: boom(texts) or real_many(texts))
        monkeypatch.setattr(tok, "encode_rendered", lambda text: boom([text]) or real_one(text))
    else:
        monkeypatch.setattr(tok, "token_ranges_many", lambda texts, *a: boom(texts) or real_ranges(texts, *a))
    with ThreadPoolExecutor(1) as pool:
        got = [_outcome(r) for r in render.finish_records(render.start_records(items, tok, ctx.profile, ctx.policy,
                                                                               pool), tok, ctx.rule)]
    assert got[1] == ("error", "tokenizer_error", "the tokenizers library panicked encoding a rendered text: boom")
    assert got[:1] + got[2:] == clean[:1] + clean[2:] and clean[1][0] == "row"


def test_a_prompt_shared_by_pairs_of_a_chunk_is_rendered_once(tmp_path, monkeypatch):
    """Three pairs of one prompt (UltraFeedback's several pairs per prompt) and one of
    another: two renders with the generation prompt in the chunk, the rows as alone."""
    from sftdata.template.chat_template import ChatTemplate

    ctx = _context(tmp_path, True)
    records = [_pair(f"Blue {i}.", f"Green {i}.") for i in range(3)] + \
        [_pair("Yes.", "No.", ({"role": "user", "content": "Another question?"},))]
    items = [(parse_preference(r, f"line {i}"), f"line {i}") for i, r in enumerate(records)]
    alone = [_outcome(render_record(rec, ctx.tok, ctx.profile, ctx.rule, ctx.policy, w)) for rec, w in items]
    real, prompts = ChatTemplate.render, []

    def counting(self, messages, **kw):
        if kw.get("add_generation_prompt"):
            prompts.append(messages[-1]["content"])
        return real(self, messages, **kw)

    monkeypatch.setattr(ChatTemplate, "render", counting)
    chunk = [_outcome(r) for r in render_records(items, ctx.tok, ctx.profile, ctx.rule, ctx.policy)]
    assert prompts == ["What color is the sky?", "Another question?"] and chunk == alone
