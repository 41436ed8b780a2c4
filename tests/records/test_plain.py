"""The one-pass reading of plain records gives what the general parser gives, on every shape."""

import itertools
import random

import pytest

import sftdata.records.conversation as conversation
from sftdata.errors import RecordError
from sftdata.records.conversation import Conversation, Turn, TurnPolicy, parse_record
from sftdata.records.media import LIST_KEYS
from sftdata.records.plain import has_media_lists, plain_conversation

ROLES = ["user", "User", "HUMAN", "human", "assistant", "gpt", "model", "Assistant", "system", "developer",
         "tool", "function_call", "observation", "narrator", None, 3]
TEXTS = ["hi", "Hello there.", "", "   ", "\n", None, 7, ["a", {"type": "text", "text": "b"}],
         "<think>why</think> because", "  <think>x</think>y", "<think>never closed", "a <think> inside",
         "x" * 70, "multi\nline\n\nreply ", "a \ufffc b", "<image>look", "<video>",
         [{"type": "image", "image": "a.png"}, "b"], [{"type": "image"}, "b"]]
EXTRA = [{"weight": 0}, {"name": "bob"}, {"reasoning_content": "r"}, {"refusal": "no"},
         {"tool_calls": []}, {"train": True}]
TOP = [{"system": "Be kind."}, {"system": "  "}, {"system": None}, {"system": 5}, {"tools": []},
       {"tools": "[]"}, {"functions": None}, {"label": True}, {"id": "x1"},
       {"chat_template_kwargs": {"enable_thinking": False}}, {"chat_template_kwargs": {}},
       {"chat_template_kwargs": None}, {"chat_template_kwargs": ["enable_thinking"]},
       {"chat_template_kwargs": {"add_generation_prompt": True}}, {"images": ["a.png"]}, {"images": []},
       {"images": None}, {"videos": ["v.mp4"]}, {"audios": []}, {"audios": ["a.wav"]}, {"system": "s \ufffc"}]


def message(rng: random.Random, sharegpt: bool, role=None, text=None) -> dict:
    role = rng.choice(ROLES) if role is None else role
    text = rng.choice(TEXTS) if text is None else text
    m = {"from": role, "value": text} if sharegpt else {"role": role, "content": text}
    if rng.random() < 0.1:
        m.update(rng.choice(EXTRA))
    return m


def records(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    out: list = [None, [], "text", {}, {"messages": None}, {"messages": {}}, {"conversations": "x"}]
    for _ in range(n):
        sharegpt = rng.random() < 0.4
        if rng.random() < 0.6:  # mostly well-formed alternation, with a few seams
            msgs = [message(rng, sharegpt, "system", "Sys.")] if rng.random() < 0.3 else []
            for _ in range(rng.randint(1, 4)):
                msgs.append(message(rng, sharegpt, rng.choice(["user", "human", "User"]), rng.choice(
                    ["q", "question?", "x" * 80, ""] if rng.random() < 0.2 else ["q", "question?"])))
                msgs.append(message(rng, sharegpt, rng.choice(["assistant", "gpt"]), rng.choice(
                    ["a", "  answer", "<think>t</think>a", "   "] if rng.random() < 0.2 else ["a", "answer."])))
            if rng.random() < 0.1:
                msgs.append(message(rng, sharegpt, "user", "dangling"))
            if rng.random() < 0.05:
                msgs.insert(rng.randint(1, len(msgs)), message(rng, sharegpt, "system", "late"))
        else:
            msgs = [message(rng, sharegpt) for _ in range(rng.randint(0, 6))]
        if rng.random() < 0.05:
            msgs.append("not a message")
        rec = {("conversations" if sharegpt else "messages"): msgs}
        if rng.random() < 0.3:
            rec.update(rng.choice(TOP))
        if rng.random() < 0.02:
            rec = {"messages": msgs, "conversations": []}
        out.append(rec)
    return out


def outcome(obj, mode, policy):
    mode, _, media = mode.partition("+")  # "chat+media": parse_record(..., media=True)
    try:
        return parse_record(obj, "f.jsonl:line 1", mode, policy, media=media == "media")
    except RecordError as e:
        return (e.reason, e.detail)


@pytest.mark.parametrize("seed,mode,policy", [(i, *c) for i, c in enumerate(itertools.product(
    ["chat", "tool"], [TurnPolicy(), TurnPolicy("drop", "all"), TurnPolicy("keep", "last")]))]
    + [(6, "chat+media", TurnPolicy()), (7, "tool+media", TurnPolicy("keep", "last"))])
def test_the_one_pass_reading_equals_the_general_parser(seed, mode, policy, monkeypatch):
    recs = records(1500, seed)
    fast = [outcome(r, mode, policy) for r in recs]
    monkeypatch.setattr(conversation, "plain_conversation", lambda obj: None)  # the general parser alone
    general = [outcome(r, mode, policy) for r in recs]
    assert fast == general
    taken = sum(plain_conversation(r) is not None for r in recs)
    assert 150 < taken < len(recs) - 150  # both paths were exercised


def test_a_plain_record_becomes_its_messages_as_turns():
    rec = {"system": "Top.", "conversations": [
        {"from": "system", "value": "  "}, {"from": "system", "value": "Second."},
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": " Hello "}], "id": 3}
    assert plain_conversation(rec) == Conversation((Turn("system", "Top.\n\nSecond."), Turn("user", "Hi"),
                                                    Turn("assistant", " Hello ")))


def test_a_plain_record_keeps_its_template_variables():
    rec = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
           "chat_template_kwargs": {"enable_thinking": False, "date_string": "1 Jan"}}
    assert plain_conversation(rec) == Conversation((Turn("user", "Hi"), Turn("assistant", "Yo")), template_kwargs={
        "enable_thinking": False, "date_string": "1 Jan"})
    assert plain_conversation({**rec, "chat_template_kwargs": {}}).template_kwargs is None  # as the general parser


@pytest.mark.parametrize("rec", [
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " <think>r</think>a"}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "q2"},
                  {"role": "assistant", "content": "a"}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                  {"role": "system", "content": "late"}]},
    {"messages": [{"role": "user", "content": "q"}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": []},
    {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "a"}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
     "chat_template_kwargs": {"messages": []}},  # refused by the general parser, which names the record
    # media: a list (even empty or null) or U+FFFC in any text, which the general parser reads or refuses
    {"messages": [{"role": "user", "content": "<image>q"}, {"role": "assistant", "content": "a"}], "images": ["x"]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "images": []},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "videos": None},
    {"conversations": [{"from": "human", "value": "<audio>q"}, {"from": "gpt", "value": "a"}], "audios": ["x"]},
    {"messages": [{"role": "user", "content": "q\ufffc"}, {"role": "assistant", "content": "a"}]},
    {"messages": [{"role": "system", "content": "\ufffc"}, {"role": "user", "content": "q"},
                  {"role": "assistant", "content": "a"}]},
    {"system": "\ufffc", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
])
def test_records_that_need_the_general_parser_are_left_to_it(rec):
    assert plain_conversation(rec) is None


def test_the_media_lists_the_plain_readers_leave_to_the_general_parser_are_every_one_it_reads():
    assert LIST_KEYS == ("images", "videos", "audios")
    assert [has_media_lists({key: None}) for key in LIST_KEYS] == [True, True, True]
    assert has_media_lists({"messages": [], "image": "a.png", "video_list": []}) is False
