"""A chunk's episodes made in one pass (``chunk_episodes``, ``token_ranges_many``, the
sentinel plan cached by the sentinel render) are exactly what the record-by-record path
makes: the same ids, masks, spans, rule mismatches and errors, and a prepared dataset
byte-identical to one prepared record by record."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import numpy as np
import pytest

import sftdata.template.records as records_module
from sftdata.errors import RecordError, TokenizerFailure
from sftdata.prepare import PrepareOptions, prepare
from sftdata.records.conversation import parse_record
from sftdata.template import (
    ChatTemplate,
    chunk_episodes,
    episodes_of,
    learn_profile,
    load_chat_template,
    model_profile,
    records_episodes,
    render_messages,
    render_within,
)
from sftdata.template.episodes import _trie
from sftdata.template.records import _check_trained, _proven, fit_to_template, plan_record
from sftdata.template.spans import locate_replies, plain_structure
from sftdata.tokenize.open import load_hf_tokenizer
from tests.helpers.bpe import random_texts
from tests.helpers.data import chat, write_jsonl
from tests.helpers.templates import TOKENS, preset_tokenizer, train_tokenizer

DROPS_EARLIER = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and not loop.last %}{{- '(earlier reply)' }}{%- else %}{{- m.content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

RECORDS = [
    chat("Hi", "Hello!"),
    chat("  Hi\n", "def f():\n    return 1\n", "More?", " Sure. \n", system="Be brief."),
    chat("Wie geht's? 你好 🌍", "Gut, danke! 很好 👍", "Ünïcödé?", "Ja: café, naïve."),
    chat("Hi", "\n\nHello."),  # the reply merges with the header's newline: the rule parts from the render
    {"messages": [{"role": "assistant", "content": "Welcome."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"}]},  # a leading assistant message
    chat("say <|im_end|> please", "ok"),  # a special token's string as text: refused
    chat("a\ufdd2b", "ok"),  # a reserved character: refused
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "weight": 0},
                  {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye!"}]},  # context turn
    chat("What is 2+2?", "4.", "And 3+3?", "6.", "And 4+4?", "8." * 40),
]


def reference(items, profile, tok, max_tokens):
    """``records_episodes`` record by record: each record's episodes made and proven alone."""
    out = []
    for conv, where in items:
        try:
            conv = fit_to_template(conv, profile, where)
            _check_trained(conv, profile, where)
            plan, turns, repairs = plan_record(conv, profile, tok, where)
            render, dropped = episodes_of(plan, [tok.encode_rendered(t) for t in plan.texts], profile, where), 0
            if max_tokens is not None and max(len(e.ids) for e in render.episodes) > max_tokens:
                render, dropped = render_within(conv, profile, tok, max_tokens, where, turns)
            out.append(replace(_proven(render, dropped, profile, tok, where), repairs=repairs,
                               counts=conv.turn_counts))
        except RecordError as e:
            out.append(e)
    return out


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is type(w), (g, w)
        if isinstance(w, RecordError):
            assert (g.reason, g.detail, g.where) == (w.reason, w.detail, w.where)
            continue
        assert (g.per_reply, g.pairs_dropped, len(g.episodes)) == (w.per_reply, w.pairs_dropped, len(w.episodes))
        assert (g.repairs, g.counts) == (w.repairs, w.counts)
        for a, b in zip(g.episodes, w.episodes):
            assert a.ids.dtype == b.ids.dtype and a.ids.tobytes() == b.ids.tobytes()
            assert a.mask.dtype == b.mask.dtype and a.mask.tobytes() == b.mask.tobytes()
            assert (a.text, a.spans, a.rule_mismatch) == (b.text, b.spans, b.rule_mismatch)


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return {name: preset_tokenizer(root, name) for name in ("chatml", "llama3", "mistral")}


def items_of(records):
    return [(parse_record(r, f"in.jsonl:line {i + 1}", "chat"), f"in.jsonl:line {i + 1}")
            for i, r in enumerate(records)]


@pytest.mark.parametrize("preset", ["chatml", "llama3", "mistral", "drops-earlier"])
@pytest.mark.parametrize("max_tokens", [None, 30])
def test_a_chunk_gives_what_each_record_gives_alone(toks, preset, max_tokens):
    tok = toks["chatml" if preset == "drops-earlier" else preset]
    profile = learn_profile(ChatTemplate("drops.jinja", "file", DROPS_EARLIER), tok) if preset == "drops-earlier" \
        else model_profile(tok, preset)
    records = [r for r in RECORDS if "weight" not in str(r)]  # context turns: below, with --train-on last
    items = items_of(records)
    got = records_episodes(items, profile, tok, max_tokens)
    assert_same(got, reference(items, profile, tok, max_tokens))
    kinds = {type(g).__name__ if not isinstance(g, RecordError) else g.reason for g in got}
    assert {"RecordEpisodes", "reserved_character"} <= kinds
    if preset == "mistral":  # the leading assistant message: the template gives it no header, so it is dropped
        assert got[4].repairs == ("leading_assistant_untrained", "dropped_leading_assistant")
        assert len(got[4].episodes) == 1
    if preset in ("chatml", "llama3") and max_tokens is None:  # it answers no one: kept, untrained (issue 41)
        assert got[4].repairs == ("leading_assistant_untrained",) and len(got[4].episodes) == 1
    if preset == "chatml":  # "\n\nHello." merges with the header's newline
        assert got[3].reason == "rule_mismatch" and got[3].detail.startswith("token 11 ('\\n\\n'): the template's render trains it")


def test_a_chunk_gives_what_each_record_gives_alone_training_the_last_reply(toks):
    tok = toks["llama3"]
    profile = model_profile(tok, "llama3", last_reply_only=True)
    items = items_of(RECORDS)
    got = records_episodes(items, profile, tok, None)
    assert_same(got, reference(items, profile, tok, None))
    assert [ep.mask.sum() > 0 for ep in got[7].episodes] == [True]


def test_every_record_refused_or_none_at_all(toks):
    tok = toks["chatml"]
    profile = model_profile(tok, "chatml")
    assert records_episodes([], profile, tok, None) == []
    assert chunk_episodes([], [], profile, tok, []) == []
    items = items_of([chat("say <|im_end|>", "ok"), chat("a\ufdd3", "ok")])
    got = records_episodes(items, profile, tok, None)
    assert [e.reason for e in got] == ["special_token_in_text", "reserved_character"]


def test_a_reply_on_no_token_is_refused_as_alone(toks):
    """An empty reply whose template writes it with no end text of its own: the same error
    record by record and in a chunk, and the records around it unharmed."""
    tok = toks["chatml"]
    text = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
            "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    profile = learn_profile(ChatTemplate("plain.jinja", "file", text), tok)
    items = items_of([chat("Hi", "Hello!"), chat("Hi", "Hello!", "More", "Yes.")])
    assert_same(records_episodes(items, profile, tok, None), reference(items, profile, tok, None))


def test_token_ranges_many_equals_each_texts_own(tmp_path):
    """Random Unicode texts and random character spans: the joined pass of the fast engine
    and the library's per-text ranges agree with ``Encoded.token_ranges`` of each text."""
    specials, bos, eos, extra = TOKENS["chatml"]
    folder = train_tokenizer(tmp_path / "chatml", specials, bos, eos, extra, vocab_size=800)
    rng = random.Random(3)
    texts = random_texts(5, 200) + ["", "a", "<|im_start|>user\nHi<|im_end|>"]
    spans = []
    for t in texts:
        cuts = sorted(rng.randint(0, len(t)) for _ in range(2 * rng.randint(0, 3)))
        spans.append(list(zip(cuts[::2], cuts[1::2])))
    for engine in ("tiktoken", "hf"):
        tok = load_hf_tokenizer(folder, engine=engine)
        assert tok.engine == engine
        encoded = [tok.encode_rendered(t) for t in texts]
        lo, hi = tok.token_ranges_many(texts, encoded, spans)
        want = [e.token_ranges(s) if s else (np.empty(0, np.int64), np.empty(0, np.int64))
                for e, s in zip(encoded, spans)]
        assert lo.tolist() == np.concatenate([w[0] for w in want]).tolist()
        assert hi.tolist() == np.concatenate([w[1] for w in want]).tolist()


def test_plain_messages_are_located_by_their_structure_as_by_their_sentinel_copy(toks):
    tok = toks["llama3"]
    profile = model_profile(tok, "llama3")
    fn = profile.render_fn()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello!\n"}, {"role": "user", "content": ""},
            {"role": "assistant", "content": "Bye."}]
    assert plain_structure(msgs) == (("system", "Be brief."), ("user", True), ("assistant", True), ("user", ""),
                                     ("assistant", True))
    assert plain_structure([{"role": "assistant", "content": "<think>\nx\n</think>\n\ny"}]) is None
    assert plain_structure([{"role": "user", "content": "Hi", "name": "u"}]) is None
    uncached = locate_replies(fn, msgs, profile.layout)
    cached = profile.sentinel_fn()
    assert locate_replies(fn, msgs, profile.layout, sentinel_fn=cached) == uncached  # renders S, keeps it by structure
    assert locate_replies(fn, msgs, profile.layout, sentinel_fn=cached) == uncached  # S from the cache
    assert len(profile.renders) == 1


def test_a_special_token_in_a_tool_call_is_refused_by_its_path(toks):
    tok = toks["chatml"]
    profile = model_profile(tok, "chatml")
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"q": "x<|im_start|>"}}}]}]
    with pytest.raises(RecordError, match=r"message 1.tool_calls\[0\].function.arguments.q holds the special token "
                                          r"'<\|im_start\|>' as text") as e:
        render_messages(msgs, None, profile, tok)
    assert e.value.reason == "special_token_in_text"


def test_a_prepared_dataset_is_byte_identical_to_one_prepared_record_by_record(tmp_path, toks, monkeypatch):
    folder = train_tokenizer(tmp_path / "mistral", *TOKENS["mistral"][:3], config={"pad_token": "<unk>"})
    records = [*RECORDS, *(chat(f"Question {i}? ¿Qué? 问题", f"Answer {i}. ✓", "More.", "Done.") for i in range(40))]
    src = write_jsonl(tmp_path / "in.jsonl", records)

    def run(out):
        return prepare([src], out, PrepareOptions(tokenizer=str(folder), chat_template="mistral", workers=1,
                                                  val_split=0.1, max_tokens=60))

    fast = run(tmp_path / "chunk")

    def record_by_record(plans, encoded, profile, tok, wheres):
        out, at = [], 0
        for p, w in zip(plans, wheres):
            try:
                out.append(episodes_of(p, encoded[at:at + len(p.texts)], profile, w))
            except RecordError as e:
                out.append(e)
            at += len(p.texts)
        return out

    monkeypatch.setattr(records_module, "chunk_episodes", record_by_record)
    slow = run(tmp_path / "alone")
    assert fast.rejected == slow.rejected and fast.repaired == slow.repaired
    assert fast.repaired["dropped_leading_assistant"] == 1  # mistral gives a leading reply no header
    files = sorted(p.relative_to(tmp_path / "chunk") for p in (tmp_path / "chunk").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "alone") for p in (tmp_path / "alone").rglob("*") if p.is_file())
    for f in files:
        assert (tmp_path / "chunk" / f).read_bytes() == (tmp_path / "alone" / f).read_bytes(), f


def test_a_chunk_of_same_shaped_records_renders_one_sentinel_copy(toks):
    """The sentinel render is one per structure: a chunk of same-shaped records adds one."""
    tok = toks["chatml"]
    profile = learn_profile(load_chat_template("chatml"), tok)
    items = items_of([chat(f"Hi {i}", f"Hello {i}!") for i in range(20)])
    records_episodes(items, profile, tok, None)
    assert len(profile.renders) == 1


def test_many_texts_encoded_in_one_call_are_each_texts_own(tmp_path, monkeypatch):
    """Joined by a special token none of them holds, cut where it lies: the same ids and
    offsets as one call per text, for random Unicode with the added tokens mixed in, texts
    holding the first separator (the next is taken), and a lone surrogate (one by one)."""
    specials, bos, eos, extra = TOKENS["chatml"]
    tok = load_hf_tokenizer(train_tokenizer(tmp_path / "chatml", specials, bos, eos, extra, vocab_size=800))
    assert tok.engine == "tiktoken"
    fast = tok._fast
    first = fast._separators[0]
    texts = random_texts(9, 300) + ["", "Hi", f"a{first}b", "\n\n", "<|im_start|>user\nHi<|im_end|>\n"]
    cases = [texts, [f"x{s}y" for s in fast._separators], ["only one"]]
    for case in cases:
        many = tok.encode_rendered_many(case)
        assert [e.ids.tolist() for e in many] == [tok.encode_rendered(t).ids.tolist() for t in case]
        assert [e.offsets.tolist() for e in many] == [tok.encode_rendered(t).offsets.tolist() for t in case]
    assert fast.encode_rendered_many(texts) is not None  # one call, with the next separator
    assert fast.encode_rendered_many([f"x{s}y" for s in fast._separators]) is None  # every separator held: one by one
    assert fast.encode_rendered_many(["a", "b\ud800c"]) is None  # then the library says what it says of it
    refused = r"the tokenizers library failed \(TypeError\) encoding a rendered text with .*: TextInputSequence must be str$"
    with pytest.raises(TokenizerFailure, match=refused):
        tok.encode_rendered("b\ud800c")
    with pytest.raises(TokenizerFailure, match=refused):
        tok.encode_rendered_many(["a", "b\ud800c"])
    hf = load_hf_tokenizer(tmp_path / "chatml", engine="hf")
    assert [e.ids.tolist() for e in hf.encode_rendered_many(texts)] == \
        [e.ids.tolist() for e in tok.encode_rendered_many(texts)]
    # the pieces a run uses to encode on a second thread: joined here, encoded there, cut here
    batch = tok.fast_batch(texts)
    assert tok.encodes_apart and batch.texts == texts and batch.sep != first
    got = tok.fast_batch_results(batch, tok.encode_fast_batch(batch), len(texts))
    assert [e.ids.tolist() for e in got] == [tok.encode_rendered(t).ids.tolist() for t in texts]
    assert tok.fast_batch(["only one"]) is None and tok.fast_batch([f"x{s}y" for s in fast._separators]) is None
    surrogate = tok.fast_batch(["a", "b\ud800c"])
    assert tok.encode_fast_batch(surrogate) is None  # left to the library, one by one
    assert tok.fast_batch_results(surrogate, None, 2) == [None, None]
    assert not hf.encodes_apart and hf.fast_batch(texts) is None
    from sftdata.tokenize import guard  # the second thread's call leaves standard error alone (progress goes on)

    held = []
    monkeypatch.setattr(guard._stderr, "enter", lambda: held.append("enter"))
    monkeypatch.setattr(guard._stderr, "exit", lambda: held.append("exit"))
    tok.encode_fast_batch(batch)
    assert held == []
    tok.encode_rendered_many(texts)
    assert held[:1] == ["enter"] and held.count("enter") == held.count("exit")


def test_the_special_token_scan_matches_exactly_the_special_tokens():
    """The prefix-tree regex check_texts scans a record with: every word, nothing shorter
    or merely sharing a prefix, words that are prefixes of others included."""
    words = sorted(["<|a|>", "<|ab|>", "<|a", "<|b|>", "x", "xy", "[INST]", "[/INST]", "a.b"])
    pattern = re.compile(_trie(words))
    assert all(pattern.fullmatch(w) for w in words)
    for text in ["<|", "<|c|>", "<|ab", "y", "[INST", "[/INST", "aXb", "<|b"]:
        assert pattern.fullmatch(text) is None, text
    assert _trie([]) == ""
