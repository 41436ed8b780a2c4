import pytest

from sftdata.conversation import Turn, parse_record
from sftdata.errors import RecordError

W = "f.jsonl:line 3"


def reject(raw, reason, match, mode="chat"):
    with pytest.raises(RecordError, match=match) as e:
        parse_record(raw, W, mode)
    assert e.value.reason == reason
    assert e.value.where == W
    assert str(e.value).startswith(W)


def test_openai_format():
    c = parse_record(b'{"messages":[{"role":"system","content":"S"},{"role":"user","content":"u"},'
                     b'{"role":"assistant","content":"a"}]}', W)
    assert c.turns == (Turn("system", "S"), Turn("user", "u"), Turn("assistant", "a"))
    assert c.repairs == ()


def test_sharegpt_format_with_top_level_system_and_aliases():
    raw = {"system": "S", "conversations": [{"from": "human", "value": "u"}, {"from": "gpt", "value": "a"},
                                             {"from": "user", "value": "u2"}, {"from": "chatgpt", "value": "a2"}]}
    c = parse_record(raw, W)
    assert [t.role for t in c.turns] == ["system", "user", "assistant", "user", "assistant"]
    assert [t.text for t in c.turns] == ["S", "u", "a", "u2", "a2"]


def test_text_parts_are_joined():
    raw = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                        {"role": "assistant", "content": "c"}]}
    assert parse_record(raw, W).turns[0].text == "ab"


@pytest.mark.parametrize("raw, reason, match", [
    (b"{not json", "invalid_json", "not valid JSON"),
    (b'{"messages": "\xff\xfe"}', "invalid_utf8", "invalid UTF-8"),
    (b"[1, 2]", "not_an_object", "JSON list, not an object"),
    (b'{"text": "x"}', "no_messages", "no 'messages' or 'conversations'"),
    (b'{"messages": "x"}', "no_messages", "'messages' is a str"),
    (b'{"messages": [1]}', "not_an_object", "message 0 is a JSON int"),
    (b'{"messages": [{"role": "narrator", "content": "x"}]}', "unknown_role", "message 0 has role narrator"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "non_text_content", "type 'image_url'"),
    (b'{"messages": [{"role": "user", "content": 5}]}', "non_text_content", "content is a int"),
    (b'{"messages": []}', "empty_conversation", "no messages"),
    (b'{"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": ""}]}',
     "empty_conversation", "every message is empty"),
    (b'{"messages": [{"role": "user", "content": "u"}]}', "no_assistant_turn", "no assistant message"),
    (b'{"messages": [{"role": "assistant", "content": "a"}]}', "no_trainable_turn", "before any user message"),
    (b'{"messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "s"}, '
     b'{"role": "assistant", "content": "a"}]}', "misplaced_system", "system message comes after"),
    (b'{"system": 3, "messages": []}', "non_text_content", "top-level 'system' is a int"),
])
def test_rejections(raw, reason, match):
    reject(raw, reason, match)


def test_tool_records_are_sent_to_prepare_tool():
    reject({"messages": [{"role": "user", "content": "u"}, {"role": "tool", "content": "r"}]},
           "tool_conversation", "sftdata prepare-tool")
    reject({"tools": [{"name": "f"}], "messages": [{"role": "user", "content": "u"}]},
           "tool_conversation", "sftdata prepare-tool")
    reject({"conversations": [{"from": "human", "value": "u"}, {"from": "function_call", "value": "{}"}]},
           "tool_conversation", "sftdata prepare-tool")


def test_repairs():
    c = parse_record({"messages": [
        {"role": "assistant", "content": "continued"},
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
        {"role": "assistant", "content": "  "},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "dangling"}]}, W)
    assert c.turns == (Turn("assistant", "continued"), Turn("user", "a\n\nb"), Turn("assistant", "x"))
    assert sorted(c.repairs) == ["dropped_empty_turn", "dropped_trailing_turns", "leading_assistant_untrained",
                                 "merged_same_role"]


def test_several_system_messages_are_joined_first():
    c = parse_record({"system": "A", "messages": [{"role": "system", "content": "B"},
                                                  {"role": "user", "content": "u"},
                                                  {"role": "assistant", "content": "a"}]}, W)
    assert c.turns[0] == Turn("system", "A\n\nB")


def test_weight_zero_is_counted_not_silently_dropped():
    raw = {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "weight": 0},
                        {"role": "user", "content": "u2"}, {"role": "assistant", "content": "b", "weight": 1}]}
    c = parse_record(raw, W)
    assert [t.text for t in c.turns] == ["u", "a", "u2", "b"]
    assert c.repairs == ("weight_0_ignored",)
    raw["messages"][1]["weight"] = 1
    assert parse_record(raw, W).repairs == ()
