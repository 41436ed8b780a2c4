import numpy as np
import pytest

from sftdata.chat import render as render_module
from sftdata.chat.render import render, render_batch, tool_call_text
from sftdata.errors import RecordError
from sftdata.records.conversation import Conversation, ToolCall, Turn


def conv(*turns, tools=()):
    return Conversation(tuple(Turn(r, t) for r, t in turns), tools)


def test_golden_chat_render_and_trained_ids(tok):
    m = tok.ids
    r = render(conv(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"),
                    ("user", "Bye"), ("assistant", "Ciao.")), tok)
    e = tok.encode
    expected = ([m.system] + e("Be brief.") + [m.end] + [m.user] + e("Hi") + [m.end]
                + [m.assistant] + e("Hello!") + [m.end] + [m.user] + e("Bye") + [m.end]
                + [m.assistant] + e("Ciao.") + [m.end] + [tok.eos_id])
    assert r.ids.tolist() == expected
    assert r.ids.dtype == np.uint32 and r.mask.dtype == np.uint8
    trained = r.ids[r.mask == 1].tolist()
    assert trained == [m.assistant] + e("Hello!") + [m.end] + [m.assistant] + e("Ciao.") + [m.end]


def test_marker_text_in_user_content_stays_ordinary_and_untrained(tok):
    r = render(conv(("user", "pretend <|ASSISTANT|> I said <|END|>"), ("assistant", "ok")), tok)
    ids, mask = r.ids.tolist(), r.mask.tolist()
    assert ids.count(tok.ids.assistant) == 1
    assert ids.count(tok.ids.end) == 2
    user_part = ids[1:ids.index(tok.ids.end)]
    assert user_part == tok.encode("pretend <|ASSISTANT|> I said <|END|>")
    assert mask[:ids.index(tok.ids.assistant)] == [0] * ids.index(tok.ids.assistant)


def test_tool_call_text_is_canonical():
    a = ToolCall("get", {"b": 1, "a": {"y": 2, "x": [1, "é"]}})
    assert tool_call_text(a) == '{"name":"get","arguments":{"a":{"x":[1,"é"],"y":2},"b":1}}'


def lengths(tok, *texts):
    return [len(tok.encode(t)) for t in texts]


def test_length_filter_everything_fits(tok):
    c = conv(("system", "s"), ("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2"))
    full = render(c, tok)
    r = render(c, tok, max_tokens=len(full.ids))
    assert r.ids.tolist() == full.ids.tolist() and r.pairs_dropped == 0


def test_length_filter_later_pair_only_has_to_fit_alone(tok):
    # system span 3 tokens + pair 1 (4 + 4) = 11; pair 2 = 8; the whole episode is 20 > 11
    c = conv(("system", "s"), ("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2"))
    r = render(c, tok, max_tokens=11)
    assert r.pairs_dropped == 0
    assert len(r.ids) == 20
    with pytest.raises(RecordError, match="is 11 tokens > --max-tokens 10"):
        render(c, tok, max_tokens=10)


def test_length_filter_drops_a_pair_that_does_not_fit_and_the_rest(tok):
    long = "word " * 50
    c = conv(("user", "u1"), ("assistant", "a1"), ("user", long), ("assistant", "a2"),
             ("user", "u3"), ("assistant", "a3"))
    r = render(c, tok, max_tokens=20)
    m = tok.ids
    e = tok.encode
    assert r.ids.tolist() == [m.user] + e("u1") + [m.end, m.assistant] + e("a1") + [m.end, tok.eos_id]
    assert r.pairs_dropped == 2


def test_length_filter_first_pair_too_long_rejects(tok):
    c = conv(("system", "a long system prompt " * 5), ("user", "u1"), ("assistant", "a1"))
    with pytest.raises(RecordError, match="first user/assistant pair with the system span is 31 tokens") as e:
        render(c, tok, max_tokens=20)
    assert e.value.reason == "too_long"


def test_render_batch_mixes_results_in_order(tok):
    ok = conv(("user", "u"), ("assistant", "a"))
    too_long = conv(("user", "x " * 100), ("assistant", "a"))
    out = render_batch([ok, too_long, ok], tok, wheres=["f:line 1", "f:line 2", "f:line 3"], max_tokens=30)
    assert [type(o).__name__ for o in out] == ["Rendered", "RecordError", "Rendered"]
    assert out[1].where == "f:line 2"
    assert out[0].ids.tolist() == out[2].ids.tolist()


def test_tool_spans_and_calls(tok):
    m = tok.ids
    c = Conversation((Turn("user", "weather?"),
                      Turn("assistant", "", (ToolCall("w", {"city": "Oslo"}),)),
                      Turn("tool", "rain"), Turn("assistant", "It rains.")),
                     tools=({"name": "w"},))
    r = render(c, tok)
    ids = r.ids.tolist()
    call = tok.encode('{"name":"w","arguments":{"city":"Oslo"}}')
    trained = r.ids[r.mask == 1].tolist()
    assert trained == [m.assistant, m.tool_call] + call + [m.end, m.assistant] + tok.encode("It rains.") + [m.end]
    assert ids[0] == m.system  # a system span is created for the schemas
    assert ids.count(m.tool) == 1


# -- reasoning and untrained (context) assistant turns ----------------------------------------------
def test_reasoning_renders_between_think_markers_inside_the_trained_assistant_span(tok):
    m, e = tok.ids, tok.encode
    c = Conversation((Turn("user", "2+2?"), Turn("assistant", "4.", reasoning="Two and two make four.")))
    r = render(c, tok)
    span = [m.assistant, m.think] + e("Two and two make four.") + [m.end_think] + e("4.") + [m.end]
    assert r.ids.tolist() == [m.user] + e("2+2?") + [m.end] + span + [tok.eos_id]
    assert r.mask.tolist() == [0] * (2 + len(e("2+2?"))) + [1] * len(span) + [0]
    assert (m.think, m.end_think) == (100283, 100284)


def test_a_context_turn_opens_with_assistant_context_and_is_never_trained(tok):
    m, e = tok.ids, tok.encode
    c = Conversation((Turn("user", "Legs of a spider?"), Turn("assistant", "Six.", untrained="weight_0"),
                      Turn("user", "Sure?"), Turn("assistant", "Eight.")))
    r = render(c, tok)
    head = [m.user] + e("Legs of a spider?") + [m.end, m.assistant_context] + e("Six.") + [m.end]
    head += [m.user] + e("Sure?") + [m.end]
    tail = [m.assistant] + e("Eight.") + [m.end]
    assert r.ids.tolist() == head + tail + [tok.eos_id]
    assert r.mask.tolist() == [0] * len(head) + [1] * len(tail) + [0]
    assert m.assistant_context == 100285


def test_a_context_turn_with_reasoning_and_a_call(tok):
    m, e = tok.ids, tok.encode
    call = ToolCall("w", {"city": "Oslo"})
    c = Conversation((Turn("user", "weather?"), Turn("assistant", "", (call,), reasoning="Ask the tool.",
                                                     untrained="train_on_last"),
                      Turn("tool", "rain"), Turn("assistant", "It rains.")), tools=({"name": "w"},))
    r = render(c, tok)
    ids = r.ids.tolist()
    ctx = [m.assistant_context, m.think] + e("Ask the tool.") + [m.end_think, m.tool_call] + e(tool_call_text(call))
    start = ids.index(m.assistant_context)
    assert ids[start:start + len(ctx) + 1] == ctx + [m.end]
    assert r.ids[r.mask == 1].tolist() == [m.assistant] + e("It rains.") + [m.end]


def test_a_tokenizer_from_a_six_marker_dataset_cannot_render_what_it_has_no_marker_for(tok):
    from sftdata.chat.markers import CHAT_MARKERS
    from sftdata.chat.tokenizer import load_tokenizer
    from sftdata.errors import TokenizerError

    six = load_tokenizer(markers=CHAT_MARKERS)
    assert render(conv(("user", "u"), ("assistant", "a")), six).ids.tolist() == render(
        conv(("user", "u"), ("assistant", "a")), tok).ids.tolist()
    c = Conversation((Turn("user", "u"), Turn("assistant", "a", reasoning="r")))
    with pytest.raises(TokenizerError, match=r"this tokenizer has no <\|THINK\|> marker \(it was rebuilt from a "
                                             r"dataset written before <\|THINK\|> existed\); render with "
                                             r"load_tokenizer\('cl100k_base'\)"):
        render(c, six)


def test_length_filter_keeping_no_trained_turn_rejects(tok):
    c = Conversation((Turn("user", "u1"), Turn("assistant", "bad", untrained="weight_0"),
                      Turn("user", "word " * 50), Turn("assistant", "good")))
    pair2 = 2 + len(tok.encode("word " * 50)) + 2 + len(tok.encode("good"))
    assert pair2 == 56
    with pytest.raises(RecordError) as e:
        render(c, tok, max_tokens=20)
    assert (e.value.reason, e.value.detail) == (
        "too_long", "pair 2 is 56 tokens > --max-tokens 20, and the pairs before it hold no trained assistant turn "
                    "(weight 0, train false or --train-on last), so nothing would be trained")
    # a trained turn in the kept pairs: the later pair is dropped as before
    c2 = Conversation((Turn("user", "u1"), Turn("assistant", "ok"), *c.turns[1:]))
    assert render(c2, tok, max_tokens=20).pairs_dropped == 1


def _random_conversations(seed: int, n: int) -> list[Conversation]:
    """Conversations of every kind of span: system or tools or neither, user and tool
    turns, trained and context assistant turns with and without reasoning, text and calls."""
    rng = np.random.default_rng(seed)
    words = ["hi", "the city", "é", "  spaced ", "\n", "<|USER|>", "{}", "42", ""]
    schema = {"name": "get", "description": "d", "parameters": {"type": "object"}}

    def text():
        return " ".join(rng.choice(words, size=int(rng.integers(0, 4))).tolist())

    out = []
    for _ in range(n):
        turns = [Turn("system", text() or "s")] if rng.random() < 0.4 else []
        for _ in range(int(rng.integers(1, 4))):
            turns.append(Turn("user", text()))
            calls = tuple(ToolCall("get", {"q": text()}) for _ in range(int(rng.integers(0, 3))))
            turns.append(Turn("assistant", text(), calls, reasoning=text() if rng.random() < 0.3 else "",
                              untrained="weight_0" if rng.random() < 0.2 else ""))
            if calls:
                turns.append(Turn("tool", text()))
                turns.append(Turn("assistant", text() or "ok"))
        out.append(Conversation(tuple(turns), (schema,) if rng.random() < 0.3 else ()))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_the_fast_rendered_text_is_the_reference_layouts_text(tok, seed):
    """``_rendered_text`` (straight from the turns) gives exactly the text of ``_plan``'s
    layout (``_text_of_plans``), markers and all, for every kind of span."""
    r = render_module
    convs = _random_conversations(seed, 40)
    marker = {i: s for s, i in tok.special_tokens.items()}
    texts: list[str] = []
    plans = [r._plan(c, tok, texts) for c in convs]
    assert r._rendered_text(convs, tok, marker) == r._text_of_plans(plans, texts, marker, marker[tok.eos_id])
