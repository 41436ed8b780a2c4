import json
import re

import pytest

from sftdata.chat.render import render
from sftdata.errors import RecordError
from sftdata.records.conversation import Turn, parse_record
from tests.helpers.paths import ROOT

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


def test_text_parts_spelled_with_value_are_text_joined_in_order():
    raw = {"messages": [{"role": "user", "content": [{"type": "text", "value": "a"}, "b",
                                                      {"text": "c"}, {"type": "text", "value": "d"}]},
                        {"role": "assistant", "content": [{"type": "text", "value": "ok"}]}]}
    assert [t.text for t in parse_record(raw, W).turns] == ["abcd", "ok"]


U = {"role": "user", "content": "u"}
A = {"role": "assistant", "content": "a"}
F = {"name": "f", "parameters": {"type": "object"}}
CHAT_ROLES_KNOWN = "user/human, assistant/gpt/chatgpt/bing/bard/model, system/developer"


def _call(args='{"x": 1}', name="f", cid="c1"):
    return {"role": "assistant", "tool_calls": [{"id": cid, "type": "function",
                                                 "function": {"name": name, "arguments": args}}]}


def _res(cid="c1"):
    return {"role": "tool", "tool_call_id": cid, "content": "r"}


def _oa(messages):
    return {"tools": [{"type": "function", "function": F}], "messages": messages}


# every rejection reason, with the exact message a user reads (after "FILE:line N: ")
REASONS = [
    ("invalid_json", "chat", b"{not json",
     "not valid JSON (unexpected character, expected a string key: line 1 column 2 (char 1)); each line must "
     "hold one JSON object"),
    ("invalid_json", "chat", b"[" * 1100 + b"]" * 1100,
     "the record is nested deeper than 1024 levels, which sftdata does not read; flatten the record"),
    ("invalid_utf8", "chat", b'{"messages": "\xff\xfe"}',
     "invalid UTF-8 at byte 14 of the record; re-encode the file as UTF-8"),
    ("not_an_object", "chat", b"[1, 2]", "the record is a list, not an object with 'messages' or 'conversations'"),
    ("not_an_object", "chat", {"messages": [U, 1]}, "message 1 is a number, not an object"),
    ("no_messages", "chat", {"text": "x", "id": 1}, "no 'messages' or 'conversations' list (keys: id, text)"),
    ("no_messages", "chat", {"messages": "x"}, "'messages' is a string, not a list of messages"),
    ("unknown_role", "chat", {"messages": [{"role": "narrator", "content": "x"}]},
     f"message 0 has role narrator; known roles: {CHAT_ROLES_KNOWN}"),
    ("unknown_role", "chat", {"messages": [{"content": "x"}]},
     f"message 0 has no 'role' key; known roles: {CHAT_ROLES_KNOWN}"),
    ("unknown_role", "chat", {"conversations": [{"value": "x"}]},
     f"message 0 has no 'from' key; known roles: {CHAT_ROLES_KNOWN}"),
    ("non_text_content", "chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "message 0 content part 0 is of type 'image_url'; only text parts are supported (drop or convert such parts)"),
    ("non_text_content", "chat+media", {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
     "message 0 content part 0 is of type 'input_audio'; only text, image and video parts are supported (drop or "
     "convert such parts)"),
    ("non_text_content", "tool", _oa([U, _call(), {"role": "tool", "content": [{"type": "file"}]}, A]),
     "message 2 content part 0 is of type 'file'; only text parts are supported (drop or convert such parts)"),
    ("non_text_content", "chat", {"messages": [{"role": "user", "content": ["a", 7]}]},
     "message 0 content part 1 is a number; only text parts are supported (drop or convert such parts)"),
    ("non_text_content", "chat", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "message 0 content part 0 is a text part without a 'text' string (keys: type); give its text as \"text\""),
    ("non_text_content", "chat", {"messages": [{"role": "user", "content": 5}]},
     "message 0 content is a number; expected a string or a list of text parts"),
    ("non_text_content", "chat", {"system": 3, "messages": []}, "top-level 'system' is a number, not a string"),
    ("misplaced_system", "chat", {"messages": [U, {"role": "system", "content": "s"}, A]},
     "a system message comes after the conversation started; move it to the start or drop it"),
    ("empty_conversation", "chat", {"messages": []}, "the record has no messages"),
    ("empty_conversation", "chat", {"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": ""}]},
     "every user and assistant message is empty"),
    ("empty_conversation", "chat", {"system": "S", "messages": [{"role": "user", "content": " "}]},
     "every user message is empty, and there is no assistant message"),
    ("no_assistant_turn", "chat", {"conversations": [{"from": "system", "value": "You are helpful."}]},
     "the record holds only a system message (no user or assistant message), so nothing would be trained"),
    ("no_assistant_turn", "chat", {"messages": [U]}, "no assistant message, so nothing would be trained"),
    ("empty_assistant_turn", "chat", {"messages": [U, {"role": "assistant", "content": None}]},
     "every assistant message is empty (null or blank content), so nothing would be trained"),
    ("empty_assistant_turn", "tool", _oa([U, {"role": "assistant", "content": None}]),
     "every assistant message is empty (null or blank content), so nothing would be trained"),
    ("no_trainable_turn", "chat", {"messages": [A]},
     "no assistant message comes after a user message (or a tool result), so none has a context to learn from "
     "and nothing would be trained"),
    ("tool_conversation", "chat", {"messages": [U, {"role": "tool", "content": "r"}]},
     "the record has tool schemas, calls or results; prepare it with `sftdata prepare-tool`"),
    ("invalid_arguments", "tool", _oa([U, _call('["x"]')]),
     "message 1: the arguments of call 'f' are a list, not an object; wrap them as {\"param\": value}"),
    ("invalid_tools", "tool", {"functions": {"name": "f"}, "messages": [U, A]},
     "'functions' is an object, expected a list of function schemas"),
    ("invalid_tool_call", "tool", _oa([U, {"role": "assistant", "tool_calls": {}}]),
     "message 1: 'tool_calls' is an object, expected a list"),
    ("unknown_function", "tool", _oa([U, _call(name="g"), _res(), A]),
     "message 1 calls 'g', which is not in 'tools' (f); declare it or fix the call"),
    ("unknown_tool_call_id", "tool", _oa([U, _call(), _res("zz"), A]),
     "message 2 answers tool_call_id 'zz', which matches none of the unanswered calls before it ('c1')"),
    ("orphan_tool_result", "tool", _oa([U, _res(), A]),
     "message 1 is a tool result but no unanswered call comes before it; drop it or add the call"),
    ("unanswered_tool_call", "tool", _oa([U, _call(), A]),
     "call 'f' (message 1) gets no tool result before message 2; add its result, or end the conversation with "
     "the call"),
    ("unclosed_think", "chat", {"messages": [U, {"role": "assistant", "content": "  <think>2 + 2 is 4"}]},
     "message 1 starts with <think> but never closes it with </think>; close the reasoning block, or remove the tag"),
    ("invalid_weight", "chat", {"messages": [U, dict(A, weight=0.5)]},
     "message 1 has weight 0.5; weight must be 0 (show the turn, do not train on it) or 1 (train on it)"),
    ("invalid_weight", "chat", {"messages": [U, dict(A, weight=True)]},
     "message 1 has weight true; weight must be 0 (show the turn, do not train on it) or 1 (train on it)"),
    ("invalid_weight", "chat", {"messages": [U, dict(A, train="no")]},
     "message 1 has train \"no\"; train must be true or false"),
    ("invalid_weight", "chat", {"messages": [U, dict(A, weight=1, train=False)]},
     "message 1 has weight 1 and train false, which disagree; keep one"),
    ("invalid_weight", "tool", {"conversations": [{"from": "human", "value": "u"},
                                                  {"from": "function_call", "value": '{"name": "f", "arguments": {}}'},
                                                  {"from": "function_call", "value": '{"name": "f", "arguments": {}}',
                                                   "weight": 0}]},
     "messages 1 and 2 are parallel calls of one assistant turn, but only one has weight 0 (or train false); give "
     "them the same weight"),
    ("invalid_reasoning", "chat", {"messages": [U, dict(A, reasoning_content={"text": "r"})]},
     "message 1 has 'reasoning_content' that is an object, not a string"),
    ("invalid_reasoning", "chat", {"messages": [U, {"role": "assistant", "reasoning_content": "r1",
                                                    "content": "<think>r2</think>a"}]},
     "message 1 gives its reasoning more than once, with different text ('reasoning_content', a <think> block); "
     "keep one"),
    ("non_text_content", "chat", {"messages": [U, {"role": "assistant", "content": [
        {"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {}}]}]},
     "message 1 content part 1 is of type 'input_audio'; an assistant message holds text, reasoning/thinking, "
     "refusal and tool_call parts only (drop or convert such parts)"),
    ("non_text_content", "chat", {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "t"}]}, A]},
     "message 0 content part 0 is a 'thinking' part in a user message; only an assistant message holds such parts"),
    ("non_text_content", "chat", {"messages": [U, {"role": "assistant", "content": [{"type": "reasoning"}]}]},
     "message 1 content part 0 is a 'reasoning' part without its text (keys: type); give it as \"thinking\""),
    ("non_text_content", "chat", {"messages": [U, {"role": "assistant", "content": None, "refusal": 3}]},
     "message 1 has 'refusal' that is a number, not a string"),
    ("invalid_tool_call", "tool", _oa([U, {"role": "assistant", "content": [{"type": "tool_call"}]}]),
     "message 1 content part 0 is a tool_call part without a 'value'; give the call as {\"name\": ..., "
     "\"arguments\": {...}} or its JSON text"),
    ("no_trainable_turn", "chat", {"messages": [U, dict(A, weight=0), U, dict(A, train=False)]},
     "every assistant message after the first user message (or tool result) has weight 0 or train false, so "
     "nothing would be trained"),
    ("invalid_template_kwargs", "chat", {"messages": [U, A], "chat_template_kwargs": ["enable_thinking"]},
     "'chat_template_kwargs' is a list; give an object of template variables, e.g. {\"enable_thinking\": false}"),
    ("invalid_template_kwargs", "tool", {"messages": [U, A], "chat_template_kwargs": {"tools": []}},
     "'chat_template_kwargs' sets 'tools', which sftdata gives the template itself; remove it"),
    # media ("+media": parse_record(..., media=True); tests/records/test_media.py has every spelling)
    ("non_text_content", "tool", {"messages": [U, A], "videos": ["v.mp4"]},
     "the record holds 'videos', which this command does not read: images and videos are read by prepare-chat and "
     "prepare-tool, with a vision model's processor"),
    ("invalid_media", "chat+media", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}, A]},
     "message 0 content part 0 is an 'image_url' part whose 'image_url.url' is null, not a reference: give the "
     "image as its file's path or URL, a string (a data: URL for inline bytes), e.g. 'photos/cat.jpg'"),
    ("invalid_media", "tool+media", {"messages": [U, A], "images": {"0": "x.jpg"}},
     "'images' is an object; give a list of image paths or URLs (strings), one per <image> in the messages"),
    ("media_in_reply", "chat+media", {"messages": [U, {"role": "assistant", "content": [{"type": "image", "image": "a.png"}]}]},
     "message 1 content part 0 is an 'image' part in an assistant message; images and videos are read in user and "
     "system messages only (a reply or tool result holds text): move it into the user message before it, or drop it"),
    ("media_placeholder_mismatch", "chat+media", {"messages": [U, A], "images": ["a.png"]},
     "'images' lists 1 image but the messages hold 0 <image> placeholders: put one <image> where each image stands "
     "(in a user or system message, in the order of the list), or list exactly one image per <image>"),
    ("reserved_character", "chat", {"messages": [{"role": "user", "content": "a \ufffc b"}, A]},
     "message 0 content holds the character U+FFFC, which sftdata uses to mark where an image or video stands; "
     "remove it"),
]


@pytest.mark.parametrize("reason, mode, raw, message", REASONS, ids=[f"{r[0]}-{i}" for i, r in enumerate(REASONS)])
def test_each_rejection_reason_and_its_exact_message(reason, mode, raw, message):
    line = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    mode, _, media = mode.partition("+")
    with pytest.raises(RecordError) as e:
        parse_record(line, W, mode, media=media == "media")
    assert (e.value.reason, e.value.detail, str(e.value)) == (reason, message, f"{W}: {message}")
    assert e.value.where == W


def test_too_long_has_its_exact_message(tok):
    conv = parse_record({"system": "s " * 30, "messages": [U, A]}, W)
    with pytest.raises(RecordError) as e:
        render(conv, tok, max_tokens=10)
    assert (e.value.reason, e.value.detail) == (
        "too_long", "the first user/assistant pair with the system span is 39 tokens > --max-tokens 10")


def test_every_reason_code_in_the_code_is_tested_above():
    root = ROOT / "sftdata"
    codes = set()
    files = sorted((root / "records").glob("*.py")) + [root / "chat" / "render.py"]
    for path in files + sorted((root / "prepare").glob("*.py")):
        codes |= set(re.findall(r'RecordError\(\s*"([a-z0-9_]+)"', path.read_text()))
    assert codes == {r[0] for r in REASONS} | {"too_long"}


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


def test_weight_zero_and_train_false_make_the_turn_context_and_are_counted():
    raw = {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "weight": 0},
                        {"role": "user", "content": "u2"}, {"role": "assistant", "content": "b", "weight": 1}]}
    c = parse_record(raw, W)
    assert c.turns == (Turn("user", "u"), Turn("assistant", "a", untrained="weight_0"), Turn("user", "u2"),
                       Turn("assistant", "b"))
    assert (c.repairs, c.turn_counts) == ((), ("untrained_weight_0",))
    raw["messages"][1] = {"role": "assistant", "content": "a", "train": False, "weight": 0.0}
    assert parse_record(raw, W).turns[1] == Turn("assistant", "a", untrained="weight_0")
    raw["messages"][1] = {"role": "assistant", "content": "a", "train": True}
    assert parse_record(raw, W).turn_counts == ()
    sharegpt = {"conversations": [{"from": "human", "value": "u"}, {"from": "gpt", "value": "a", "train": False},
                                  {"from": "human", "value": "u2"}, {"from": "gpt", "value": "b"}]}
    assert parse_record(sharegpt, W).turns[1] == Turn("assistant", "a", untrained="weight_0")


def test_weight_on_other_roles_is_not_read():
    raw = {"messages": [{"role": "user", "content": "u", "weight": "x"}, {"role": "assistant", "content": "a"}]}
    assert parse_record(raw, W).turns == (Turn("user", "u"), Turn("assistant", "a"))


def test_turns_of_different_weight_or_with_their_own_reasoning_are_not_merged():
    raw = {"messages": [U, dict(A, content="bad", weight=0), dict(A, content="good"),
                        dict(A, content="more", reasoning="why")]}
    c = parse_record(raw, W)
    assert c.turns == (Turn("user", "u"), Turn("assistant", "bad", untrained="weight_0"), Turn("assistant", "good"),
                       Turn("assistant", "more", reasoning="why"))
    assert c.repairs == ()
    # a reasoning-only message and the reply after it are one turn
    raw = {"messages": [U, {"role": "assistant", "reasoning_content": "why"}, dict(A, content="so")]}
    c = parse_record(raw, W)
    assert c.turns == (Turn("user", "u"), Turn("assistant", "so", reasoning="why")) and c.repairs == ("merged_same_role",)


def test_an_assistant_turn_before_any_user_turn_marked_weight_0_is_context_all_the_same():
    raw = {"messages": [dict(A, content="earlier", weight=0), U, A]}
    c = parse_record(raw, W)
    assert c.turns[0] == Turn("assistant", "earlier", untrained="weight_0")
    assert c.repairs == ("leading_assistant_untrained",) and c.turn_counts == ("untrained_weight_0",)
