import numpy as np
import pytest

from sftdata.conversation import Conversation, ToolCall, Turn
from sftdata.errors import RecordError
from sftdata.render import render, render_batch, tool_call_text


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
