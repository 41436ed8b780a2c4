"""The one-pass reading of plain tool records gives what the general parser gives, on every shape."""

import json
import random

import pytest

import sftdata.records.conversation as conversation
from sftdata.errors import RecordError
from sftdata.records.conversation import Conversation, ToolCall, Turn, TurnPolicy, parse_record
from sftdata.records.plain_tools import plain_tool_conversation

SCHEMAS = [{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {"type": "object"}}},
           {"name": "g", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
           {"name": "h", "description": ""}]
TOOLS = [None, [], "[]", "", "  ", "null", SCHEMAS, SCHEMAS[:1], json.dumps(SCHEMAS), json.dumps(SCHEMAS[1:]),
         "not json", [{"name": "f"}, {"name": "f"}], [{"type": "code"}], 5, {"name": "f"},
         [{"name": "f", "parameters": {"n": 123456789012345678901234}}]]
NAMES = ["f", "g", "h", "zz", ""]
ARGS = [{}, {"x": 1}, '{"x": 2}', "{}", "[1]", "not json", 3, None, '{"n": 123456789012345678901234}',
        {"s": "a  b\n"}]
IDS = ["c1", "c2", "c3", None, 7, ""]
TEXTS = ["hi", "Hello there.", "", "   ", "\n", None, 7, ["a", {"type": "text", "text": "b"}],
         "<think>why</think> because", "  <think>x</think>y", "multi\nline\n\nreply ", "a \ufffc b", "<image>look",
         [{"type": "image_url", "image_url": {"url": "a.png"}}, "b"]]
EXTRA = [{"weight": 0}, {"name": "bob"}, {"reasoning_content": "r"}, {"refusal": "no"}, {"train": True},
         {"function_call": {"name": "f", "arguments": {}}}, {"tool_call_id": "c1"}, {"tool_calls": None},
         {"tool_calls": []}]


def openai_call(rng: random.Random) -> dict:
    clean = rng.random() < 0.97
    fn = {"name": rng.choice(NAMES[:2] if clean else NAMES), "arguments": rng.choice(ARGS[:3] if clean else ARGS)}
    if rng.random() < 0.05:
        del fn["arguments"]
    shape = rng.random() if rng.random() < 0.1 else 0
    if shape < 0.7:
        c = {"id": rng.choice(IDS), "type": "function", "function": fn}
        if rng.random() < 0.02:
            c["type"] = "code"
        return c
    if shape < 0.9:
        return {**fn, "id": rng.choice(IDS)}
    return rng.choice([fn, "call", None])


def exchange(rng: random.Random, sharegpt: bool) -> list[dict]:
    """A user turn, then calls and their results (mostly in order), then a reply."""
    user = rng.choice(["q", "question?"] if rng.random() < 0.97 else ["", "  ", None, "<think>x</think>"])
    msgs = [{"from": rng.choice(["human", "user", "Human"]), "value": user} if sharegpt
            else {"role": rng.choice(["user", "User"]), "content": user}]
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        n = rng.choice([1, 1, 1, 2, 3])
        calls = [openai_call(rng) for _ in range(n)]
        if sharegpt:
            for c in calls:
                fn = c.get("function", c) if isinstance(c, dict) else c
                value = json.dumps(fn) if rng.random() < 0.97 else rng.choice([fn, "[]", "{bad", json.dumps([fn])])
                msgs.append({"from": rng.choice(["function_call", "function_call", "tool_call"]), "value": value})
                if rng.random() < 0.7:
                    break  # one call per turn, mostly
        else:
            m = {"role": "assistant", "tool_calls": calls}
            r = rng.random()
            if r < 0.5:
                m["content"] = None
            elif r < 0.8:
                m["content"] = rng.choice(["", "  ", "Let me check.", "<think>t</think>ok"])
            msgs.append(m)
            if rng.random() < 0.03:  # a second call-only message: parallel calls, merged
                msgs.append({"role": "assistant", "content": None, "tool_calls": [openai_call(rng)]})
        ids = [c.get("id") if isinstance(c, dict) else None for c in calls]
        order = list(range(n))
        if rng.random() < 0.1:
            rng.shuffle(order)
        for k in order[: n if rng.random() < 0.95 else rng.randint(0, n)]:
            result = rng.choice(["42", "", '{"ok": true}'] if rng.random() < 0.98 else [None, 3])
            if sharegpt:
                msgs.append({"from": rng.choice(["observation", "tool", "function_response"]), "value": result})
            else:
                m = {"role": rng.choice(["tool", "tool", "function"]), "content": result}
                if rng.random() < 0.8:
                    m["tool_call_id"] = ids[k] if rng.random() < 0.95 else rng.choice(IDS)
                msgs.append(m)
    if rng.random() < 0.9:
        reply = rng.choice(["a", "answer."] if rng.random() < 0.95 else ["", "  ", None, "<think>t</think>a"])
        msgs.append({"from": rng.choice(["gpt", "assistant"]), "value": reply} if sharegpt
                    else {"role": "assistant", "content": reply})
    return msgs


def records(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    out: list = [None, [], {}, {"messages": None}, {"conversations": "x"}, {"messages": [], "tools": SCHEMAS}]
    for _ in range(n):
        sharegpt = rng.random() < 0.5
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"from": "system", "value": rng.choice(["Sys.", "  "])} if sharegpt
                        else {"role": rng.choice(["system", "developer"]), "content": rng.choice(["Sys.", " "])})
        for _ in range(rng.randint(1, 3)):
            msgs += exchange(rng, sharegpt)
        for _ in range(rng.choice([0, 0, 0, 0, 1, 2])):  # a seam: a message dropped, repeated, moved or changed
            if not msgs:
                break
            k = rng.randrange(len(msgs))
            seam = rng.random()
            if seam < 0.25:
                del msgs[k]
            elif seam < 0.5:
                msgs.insert(k, msgs[rng.randrange(len(msgs))])
            elif seam < 0.75 and isinstance(msgs[k], dict):
                msgs[k] = {**msgs[k], **rng.choice(EXTRA)}
            else:
                msgs.insert(k, rng.choice([{"role": "system", "content": "late"}, {"from": "system", "value": "x"},
                                           {"from": "gpt", "value": rng.choice(TEXTS)},
                                           {"role": rng.choice(["narrator", "function_call", None]), "content": "x"},
                                           "not a message"]))
        rec: dict = {("conversations" if sharegpt else "messages"): msgs}
        if rng.random() < 0.8:
            rec["tools"] = rng.choice(TOOLS if rng.random() < 0.3 else [SCHEMAS, json.dumps(SCHEMAS)])
        if rng.random() < 0.1:
            rec.update(rng.choice([{"system": "Top."}, {"system": 5}, {"functions": SCHEMAS}, {"id": 3},
                                   {"messages": [], "conversations": []}, {"system": "\ufffc"}, {"images": []},
                                   {"images": ["a.png"]}, {"videos": None}, {"audios": ["a.wav"]}]))
        if rng.random() < 0.2:
            rec["chat_template_kwargs"] = rng.choice([{"enable_thinking": False}, {"date_string": "1 Jan"}, {},
                                                      None, "no", {"tools": []}])
        out.append(rec)
    return out


def outcome(obj, policy):
    try:
        return parse_record(obj, "f.jsonl:line 1", "tool", policy)
    except RecordError as e:
        return (e.reason, e.detail)


@pytest.mark.parametrize("seed,policy", list(enumerate(
    [TurnPolicy(), TurnPolicy("drop", "all"), TurnPolicy("keep", "last"), TurnPolicy(), TurnPolicy()])))
def test_the_one_pass_reading_equals_the_general_parser(seed, policy, monkeypatch):
    recs = records(2000, seed)
    fast = [outcome(r, policy) for r in recs]
    taken = sum(plain_tool_conversation(r) is not None for r in recs)
    monkeypatch.setattr(conversation, "plain_tool_conversation", lambda obj: None)  # the general parser alone
    general = [outcome(r, policy) for r in recs]
    assert fast == general
    assert 300 < taken < len(recs) - 300  # both paths were exercised


def test_a_plain_glaive_record_becomes_its_turns():
    rec = {"tools": json.dumps([{"name": "f", "parameters": {"type": "object"}}]), "conversations": [
        {"from": "system", "value": "Sys."}, {"from": "human", "value": "q"},
        {"from": "function_call", "value": '{"name": "f", "arguments": "{\\"x\\": 1}"}'},
        {"from": "observation", "value": "42"}, {"from": "gpt", "value": " It is 42. "}]}
    assert plain_tool_conversation(rec) == Conversation(
        (Turn("system", "Sys."), Turn("user", "q"), Turn("assistant", "", (ToolCall("f", {"x": 1}),)),
         Turn("tool", "42"), Turn("assistant", " It is 42. ")), ({"name": "f", "parameters": {"type": "object"}},),
        tool_specs=({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},))
    kwargs = {"enable_thinking": True}
    assert plain_tool_conversation({**rec, "chat_template_kwargs": kwargs}).template_kwargs == kwargs
    assert plain_tool_conversation({**rec, "chat_template_kwargs": {"tools": []}}) is None  # the general parser's


def test_a_plain_openai_record_keeps_call_ids_and_drops_blank_text_beside_calls():
    rec = {"tools": [{"type": "function", "function": {"name": "f"}}], "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "  ", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}},
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"}, {"role": "tool", "tool_call_id": "b", "content": ""},
        {"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f", "arguments": {}}}]}]}
    assert plain_tool_conversation(rec) == Conversation(
        (Turn("user", "q"), Turn("assistant", "", (ToolCall("f", {}, "a"), ToolCall("f", {}, "b"))),
         Turn("tool", "1", tool_call_id="a"), Turn("tool", "", tool_call_id="b"),
         Turn("assistant", "", (ToolCall("f", {}, "5"),))), ({"name": "f"},),
        tool_specs=({"type": "function", "function": {"name": "f"}},))


def test_consecutive_function_call_turns_are_one_turn_of_parallel_calls():
    rec = {"conversations": [{"from": "human", "value": "q"},
                             {"from": "function_call", "value": '{"name": "f", "arguments": {}}'},
                             {"from": "tool_call", "value": '[{"name": "g", "arguments": {"x": 1}}]'},
                             {"from": "observation", "value": "1"}, {"from": "observation", "value": "2"},
                             {"from": "gpt", "value": "a"}]}
    assert plain_tool_conversation(rec) == Conversation(
        (Turn("user", "q"), Turn("assistant", "", (ToolCall("f", {}), ToolCall("g", {"x": 1}))), Turn("tool", "1"),
         Turn("tool", "2"), Turn("assistant", "a")))
    assert plain_tool_conversation(rec) == parse_record(rec, "w", "tool")


U, A = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "a", "function": {"name": "f", "arguments": {}}}, {"id": "b", "function": {"name": "f", "arguments": {}}}]}


@pytest.mark.parametrize("rec", [
    {"messages": [U, CALL, {"role": "tool", "tool_call_id": "b", "content": "2"},
                  {"role": "tool", "tool_call_id": "a", "content": "1"}, A]},  # results reordered
    {"messages": [U, CALL, {"role": "tool", "tool_call_id": "a", "content": "1"}, A]},  # a call unanswered
    {"messages": [U, CALL, {"role": "tool", "tool_call_id": "a", "content": "1"},
                  {"role": "tool", "tool_call_id": "b", "content": "2"}, A], "tools": [{"name": "g"}]},  # unknown f
    {"messages": [U, {**A, "content": ""}, CALL]},  # a blank reply dropped
    {"messages": [U, A, CALL]},  # a reply merged with the calls after it
    {"messages": [A, U, A]},  # a leading assistant turn
    {"messages": [U, A, U]},  # a trailing user turn
    {"messages": [U, {**A, "weight": 0}, U, A]},
    {"messages": [U, A], "functions": [{"name": "f"}]},
    {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": '{"name": "f", '
                        '"arguments": {}}'}, {"from": "function_call", "value": '{"name": "f", "arguments": {}}'},
                       {"from": "observation", "value": "1"},
                       {"from": "function_call", "value": '{"name": "f", "arguments": {}}'}]},  # one unanswered
    {"messages": [U, A], "images": []},  # a media list, even empty: the general parser reads it
    {"messages": [U, CALL, {"role": "tool", "tool_call_id": "a", "content": "1 \ufffc"},
                  {"role": "tool", "tool_call_id": "b", "content": "2"}, A]},  # U+FFFC: the general parser refuses it
])
def test_records_that_need_the_general_parser_are_left_to_it(rec):
    assert plain_tool_conversation(rec) is None
