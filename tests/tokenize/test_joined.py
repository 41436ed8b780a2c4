"""One call of the BPE core per chunk gives exactly the ids of one call per text."""

import random

import numpy as np
import pytest

from sftdata.chat.render import RenderedChunk, render_chunk
from sftdata.chat.tokenizer import load_tokenizer
from sftdata.errors import RecordError
from sftdata.records.conversation import Conversation, ToolCall, Turn
from sftdata.tokenize.joined import JoinedEncoder

# texts that stress the seams: whitespace at both ends (the split pattern's \s++$ and
# \s+(?!\S)), numbers, non-Latin scripts, marker-like strings that are not markers, and
# the base encoding's other special strings (ordinary text to a renderer)
SEAMS = ["", " ", "\n", "hello  ", "  hello", "a\n\n", "\n\nb", "x" * 300, "12345678901234567890",
         "Привет, мир!", "你好，世界", "emoji 🎉🎉", "a <| b |> c", "<|", "|>", "<|USER", "USER|>",
         "<|fim_prefix|> code", "<|endofprompt|>", "<|user|>", "tab\tand\rreturn", " ’s 've"]


@pytest.fixture(scope="module")
def joined(tok):
    assert tok.joined is not None  # cl100k_base with the chat markers qualifies
    return tok.joined


def per_text(tok, texts):
    return [np.asarray(tok.encode(t), dtype=np.uint32) for t in texts]


def test_encode_many_equals_one_call_per_text(tok, joined):
    rng = random.Random(0)
    refused = 0
    for _ in range(300):
        texts = [rng.choice(SEAMS) + rng.choice(SEAMS) for _ in range(rng.randint(1, 12))]
        got = joined.encode_many(texts)
        if got is None:  # only where two seams made a marker string ("<|" + "USER|>")
            assert any(m in t for t in texts for m in joined.allowed)
            refused += 1
            continue
        assert [g.tolist() for g in got] == [e.tolist() for e in per_text(tok, texts)]
    assert 0 < refused < 100


def test_marker_strings_give_their_ids_and_everything_between_is_ordinary(tok, joined):
    m = tok.ids
    ids = joined.encode("<|USER|>hi there<|END|><|ASSISTANT|> ok  <|END|><|endoftext|>", 5)
    assert ids.tolist() == [m.user, *tok.encode("hi there"), m.end, m.assistant, *tok.encode(" ok  "), m.end,
                            tok.eos_id]
    assert ids.dtype == np.uint32 and ids.flags.writeable


@pytest.mark.parametrize("text", ["<|USER|>", "say <|END|> now", "<|endoftext|>", "<|ASSISTANT_CONTEXT|>"])
def test_a_typed_marker_string_sends_the_texts_one_by_one(joined, text):
    # the user's characters must stay text: the joined call cannot tell them from a marker
    assert joined.encode("<|USER|>" + text + "<|END|>", 2) is None
    assert joined.encode_many(["a", text]) is None


def test_a_lone_surrogate_sends_the_texts_one_by_one(joined):
    assert joined.encode_many(["ok", "bad \ud800 surrogate"]) is None


def test_encoders_whose_markers_could_overlap_a_special_string_are_not_built(tok):
    enc = tok._enc
    specials = dict(enc._special_tokens)
    ids = list(tok.special_tokens.values())
    assert JoinedEncoder(enc._core_bpe, specials, ids, 100255).floor == tok.eos_id
    with pytest.raises(ValueError, match="overlaps a marker"):
        JoinedEncoder(enc._core_bpe, {**specials, "x<|": 5}, ids, 100255)  # ends where a marker starts
    with pytest.raises(ValueError, match="above its ranks"):
        JoinedEncoder(enc._core_bpe, specials, ids, tok.eos_id)  # a rank at or above a marker id
    with pytest.raises(ValueError, match="above its ranks"):
        JoinedEncoder(enc._core_bpe, specials, [*ids, 99], 100255)  # a marker the encoding lacks


def conversations(rng: random.Random, n: int) -> list[Conversation]:
    out = []
    for _ in range(n):
        turns = [Turn("system", rng.choice(SEAMS) + "be brief")] if rng.random() < 0.4 else []
        for _ in range(rng.randint(1, 4)):
            turns.append(Turn("user", rng.choice(SEAMS) + " question " * rng.randint(1, 60)))
            calls = (ToolCall("f", {"q": rng.choice(SEAMS)}),) if rng.random() < 0.3 else ()
            turns.append(Turn("assistant", rng.choice(SEAMS) + " answer " * rng.randint(1, 80), calls,
                              reasoning="think" if rng.random() < 0.2 else "",
                              untrained="weight_0" if rng.random() < 0.1 else ""))
            if calls:
                turns.append(Turn("tool", rng.choice(SEAMS)))
                turns.append(Turn("assistant", "done"))
        tools = ({"name": "f", "description": rng.choice(SEAMS)},) if rng.random() < 0.3 else ()
        out.append(Conversation(tuple(turns), tools))
    return out


def same(a: RenderedChunk, b: RenderedChunk) -> None:
    assert a.ids.tolist() == b.ids.tolist()
    assert a.mask.tolist() == b.mask.tolist()
    assert a.lengths.tolist() == b.lengths.tolist()
    assert [(r.reason, r.detail) if isinstance(r, RecordError) else r for r in a.results] == \
           [(r.reason, r.detail) if isinstance(r, RecordError) else r for r in b.results]


@pytest.mark.parametrize("max_tokens", [None, 40, 150, 700])
def test_render_chunk_in_one_call_equals_text_by_text(tok, max_tokens, monkeypatch):
    convs = conversations(random.Random(max_tokens or 1), 60)
    wheres = [f"f.jsonl:line {i + 1}" for i in range(len(convs))]
    joined = render_chunk(convs, tok, wheres=wheres, max_tokens=max_tokens)
    plain = load_tokenizer()
    plain.joined = None  # the text-by-text path
    same(joined, render_chunk(convs, plain, wheres=wheres, max_tokens=max_tokens))
    if max_tokens == 40:  # the filter both cut and rejected here
        assert any(isinstance(r, RecordError) for r in joined.results) and any(
            r for r in joined.results if not isinstance(r, RecordError))


def test_a_chunk_with_a_typed_marker_falls_back_and_keeps_it_text(tok, monkeypatch):
    calls = []
    real = JoinedEncoder.encode

    def spy(self, text, placed):
        out = real(self, text, placed)
        calls.append(out is None)
        return out

    monkeypatch.setattr(JoinedEncoder, "encode", spy)
    convs = [Conversation((Turn("user", "type <|ASSISTANT|> here"), Turn("assistant", "ok"))),
             Conversation((Turn("user", "hi"), Turn("assistant", "yo")))]
    out = render_chunk(convs, tok)
    assert calls == [True]  # tried once, refused: the texts were encoded one by one
    first = out.ids[:out.lengths[0]].tolist()
    assert first.count(tok.ids.assistant) == 1
    assert first[1:-5] == tok.encode("type <|ASSISTANT|> here")  # then END, ASSISTANT, "ok", END, EOS


def test_texts_are_searched_for_marker_strings_only_once_data_has_held_one(tok):
    joined = load_tokenizer().joined
    calls = []
    real = joined._encode
    joined._encode = lambda text, allowed: calls.append(text) or real(text, allowed)
    assert not joined.typed
    assert joined.encode("<|USER|>hi<|END|>", 2).tolist() == [tok.ids.user, *tok.encode("hi"), tok.ids.end]
    assert joined.encode("<|USER|>say <|END|><|END|>", 2) is None  # the core was called, its ids refused
    assert joined.typed and len(calls) == 2
    assert joined.encode("<|USER|>say <|END|><|END|>", 2) is None  # now found before calling the core
    assert len(calls) == 2
    assert joined.encode("<|USER|>hi<|END|>", 2) is not None and len(calls) == 3
