"""Every spelling of reasoning, text, refusal and per-turn weight gives exact tokens and
masks; each --reasoning / --train-on policy too. Expectations are built from the
tokenizer's encode of the texts plus the marker ids."""

import pytest

from sftdata.chat.render import render
from sftdata.errors import RecordError
from sftdata.records.content import read_content
from sftdata.records.conversation import Turn, TurnPolicy, parse_record

W = "f.jsonl:line 1"
U = {"role": "user", "content": "Is 91 prime?"}
REASON = "91 = 7 x 13."
REPLY = "No."


def expected(tok, *spans):
    """(ids, mask) of spans ``(kind, items)``: kind "ctx" (never trained) or "trained";
    items are marker names or texts."""
    m = tok.ids
    names = {"U": m.user, "A": m.assistant, "X": m.assistant_context, "E": m.end, "K": m.think, "k": m.end_think,
             "S": m.system, "C": m.tool_call, "T": m.tool}
    ids, mask = [], []
    for kind, items in spans:
        part = []
        for it in items:
            part += [names[it]] if it in names else tok.encode(it)
        ids += part
        mask += [int(kind == "trained")] * len(part)
    return ids + [tok.eos_id], mask + [0]


def rendered(tok, raw, policy=TurnPolicy(), mode="chat"):
    r = render(parse_record(raw, W, mode, policy), tok)
    return r.ids.tolist(), r.mask.tolist()


SPELLINGS = {
    "reasoning_content": {"role": "assistant", "reasoning_content": REASON, "content": REPLY},
    "reasoning": {"role": "assistant", "reasoning": REASON, "content": REPLY},
    "thinking": {"role": "assistant", "thinking": REASON, "content": REPLY},
    "think tags": {"role": "assistant", "content": f"<think>\n{REASON}\n</think>\n\n{REPLY}"},
    "think tags after blanks": {"role": "assistant", "content": f"\n  <think>{REASON}</think>{REPLY}"},
    "reasoning part": {"role": "assistant", "content": [{"type": "reasoning", "text": REASON},
                                                        {"type": "text", "text": REPLY}]},
    "thinking part (Anthropic)": {"role": "assistant", "content": [{"type": "thinking", "thinking": REASON,
                                                                    "signature": "x"},
                                                                   {"type": "text", "text": REPLY}]},
    "reasoning part with value, after the text": {"role": "assistant", "content": [
        {"type": "text", "value": REPLY}, {"type": "reasoning", "value": f"  {REASON}\n"}]},
    "two spellings of the same text": {"role": "assistant", "reasoning_content": REASON,
                                       "content": f"<think>{REASON}</think>{REPLY}"},
}


@pytest.mark.parametrize("name", SPELLINGS)
def test_every_reasoning_spelling_gives_the_same_tokens_and_mask(tok, name):
    ids, mask = rendered(tok, {"messages": [U, SPELLINGS[name]]})
    assert (ids, mask) == expected(tok, ("ctx", ["U", "Is 91 prime?", "E"]),
                                   ("trained", ["A", "K", REASON, "k", REPLY, "E"]))
    assert parse_record({"messages": [U, SPELLINGS[name]]}, W).turn_counts == ("reasoning_kept",)


def test_sharegpt_value_with_think_tags(tok):
    raw = {"conversations": [{"from": "human", "value": "Is 91 prime?"},
                             {"from": "gpt", "value": f"<think>{REASON}</think>\n{REPLY}"}]}
    assert rendered(tok, raw) == expected(tok, ("ctx", ["U", "Is 91 prime?", "E"]),
                                          ("trained", ["A", "K", REASON, "k", REPLY, "E"]))
    assert parse_record(raw, W).repairs == ("reasoning_from_think_tags",)


@pytest.mark.parametrize("reasoning", ["", "  \n", "<think>\n\n</think>"])
def test_empty_reasoning_is_not_rendered_and_is_counted(tok, reasoning):
    msg = ({"role": "assistant", "content": reasoning + "\n\n" + REPLY} if reasoning.startswith("<think>")
           else {"role": "assistant", "reasoning_content": reasoning, "content": REPLY})
    c = parse_record({"messages": [U, msg]}, W)
    assert c.turns[1] == Turn("assistant", REPLY) and c.turn_counts == ("reasoning_empty",)
    assert rendered(tok, {"messages": [U, msg]}) == expected(tok, ("ctx", ["U", "Is 91 prime?", "E"]),
                                                             ("trained", ["A", REPLY, "E"]))


def test_think_tags_are_read_only_at_the_start_of_an_assistant_message(tok):
    mid = {"role": "assistant", "content": f"Well <think>{REASON}</think>"}
    assert parse_record({"messages": [U, mid]}, W).turns[1] == Turn("assistant", mid["content"])
    user = {"role": "user", "content": "<think>mine</think>"}
    assert parse_record({"messages": [user, {"role": "assistant", "content": "ok"}]}, W).turns[0].text == user["content"]


def test_a_reasoning_only_message_is_a_turn(tok):
    raw = {"messages": [U, {"role": "assistant", "reasoning_content": REASON, "content": None}]}
    assert rendered(tok, raw) == expected(tok, ("ctx", ["U", "Is 91 prime?", "E"]),
                                          ("trained", ["A", "K", REASON, "k", "E"]))


# -- text parts and refusal ---------------------------------------------------------------------------
def test_text_parts_in_both_spellings_and_bare_strings_join_in_order():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "value": "b"}, "c", {"text": "d"}]
    assert read_content(parts, W, 0, "user").text == "abcd"
    assert read_content(parts, W, 0, "assistant").text == "abcd"


@pytest.mark.parametrize("msg", [
    {"role": "assistant", "content": None, "refusal": "I can't help with that."},
    {"role": "assistant", "content": "", "refusal": "I can't help with that."},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]},
    {"role": "assistant", "content": "I can't help with that.", "refusal": "I can't help with that."},
], ids=["field, null content", "field, empty content", "part", "field equal to the content"])
def test_a_refusal_is_the_reply(tok, msg):
    raw = {"messages": [U, msg]}
    assert rendered(tok, raw) == expected(tok, ("ctx", ["U", "Is 91 prime?", "E"]),
                                          ("trained", ["A", "I can't help with that.", "E"]))
    assert parse_record(raw, W).repairs == (("refusal_as_reply",) if msg.get("refusal") != msg["content"] else ())


def test_a_refusal_beside_other_text_follows_it():
    raw = {"messages": [U, {"role": "assistant", "content": "Sorry.", "refusal": "I can't."}]}
    assert parse_record(raw, W).turns[1].text == "Sorry.\n\nI can't."
    parts = [{"type": "text", "text": "Sorry. "}, {"type": "refusal", "refusal": "I can't."}]
    assert parse_record({"messages": [U, {"role": "assistant", "content": parts}]}, W).turns[1].text == "Sorry. I can't."


def test_an_assistant_with_only_a_refusal_is_not_no_assistant_turn():
    c = parse_record({"messages": [U, {"role": "assistant", "content": None, "refusal": "No."}]}, W)
    assert [t.role for t in c.turns] == ["user", "assistant"]


@pytest.mark.parametrize("part_type", ["input_audio", "file", "audio"])
def test_a_part_of_another_type_names_its_type_and_message(part_type):
    raw = {"messages": [U, {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": part_type}]}]}
    with pytest.raises(RecordError) as e:
        parse_record(raw, W)
    assert e.value.reason == "non_text_content"
    assert e.value.detail.startswith(f"message 1 content part 1 is of type {part_type!r}; ")


# -- per-turn weight and the policies ---------------------------------------------------------------------
TWO_TURNS = {"messages": [
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "reasoning_content": "R1", "content": "A1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "reasoning_content": "R2", "content": "A2"}]}


@pytest.mark.parametrize("policy, first, second, counts", [
    (TurnPolicy("keep", "all"), ("trained", ["A", "K", "R1", "k", "A1", "E"]),
     ("trained", ["A", "K", "R2", "k", "A2", "E"]), ["reasoning_kept"] * 2),
    (TurnPolicy("last", "all"), ("trained", ["A", "A1", "E"]), ("trained", ["A", "K", "R2", "k", "A2", "E"]),
     ["reasoning_dropped", "reasoning_kept"]),
    (TurnPolicy("drop", "all"), ("trained", ["A", "A1", "E"]), ("trained", ["A", "A2", "E"]),
     ["reasoning_dropped"] * 2),
    (TurnPolicy("keep", "last"), ("ctx", ["X", "K", "R1", "k", "A1", "E"]),
     ("trained", ["A", "K", "R2", "k", "A2", "E"]), ["reasoning_kept", "untrained_train_on_last", "reasoning_kept"]),
    (TurnPolicy("last", "last"), ("ctx", ["X", "A1", "E"]), ("trained", ["A", "K", "R2", "k", "A2", "E"]),
     ["reasoning_dropped", "untrained_train_on_last", "reasoning_kept"]),
], ids=["keep-all", "last-all", "drop-all", "keep-last", "last-last"])
def test_each_policy_gives_exact_tokens_masks_and_counts(tok, policy, first, second, counts):
    ids, mask = rendered(tok, TWO_TURNS, policy)
    assert (ids, mask) == expected(tok, ("ctx", ["U", "Q1", "E"]), first, ("ctx", ["U", "Q2", "E"]), second)
    assert sorted(parse_record(TWO_TURNS, W, policy=policy).turn_counts) == sorted(counts)


def test_train_on_last_trains_the_last_turn_the_record_allows(tok):
    raw = {"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                        {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"},
                        {"role": "user", "content": "Q3"}, {"role": "assistant", "content": "A3", "weight": 0}]}
    ids, mask = rendered(tok, raw, TurnPolicy(train_on="last"))
    assert (ids, mask) == expected(tok, ("ctx", ["U", "Q1", "E", "X", "A1", "E", "U", "Q2", "E"]),
                                   ("trained", ["A", "A2", "E"]), ("ctx", ["U", "Q3", "E", "X", "A3", "E"]))
    assert sorted(parse_record(raw, W, policy=TurnPolicy(train_on="last")).turn_counts) == [
        "untrained_train_on_last", "untrained_weight_0"]


def test_weight_0_renders_context_exactly(tok):
    raw = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"},
                        {"role": "assistant", "content": "bad", "weight": 0},
                        {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "good", "weight": 1}]}
    assert rendered(tok, raw) == expected(tok, ("ctx", ["S", "Be brief.", "E", "U", "Q1", "E", "X", "bad", "E", "U", "Q2",
                                                        "E"]),
                                          ("trained", ["A", "good", "E"]))


def test_drop_leaves_a_reasoning_only_turn_empty_and_it_goes(tok):
    raw = {"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "reasoning_content": "R1"},
                        {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]}
    c = parse_record(raw, W, policy=TurnPolicy("drop"))
    assert c.turns == (Turn("user", "Q1\n\nQ2"), Turn("assistant", "A2"))
    assert sorted(set(c.repairs)) == ["dropped_empty_turn", "merged_same_role"]
    assert c.turn_counts == ("reasoning_dropped",)
    only = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "reasoning_content": "R"}]}
    with pytest.raises(RecordError) as e:
        parse_record(only, W, policy=TurnPolicy("drop"))
    assert (e.value.reason, e.value.detail) == (
        "empty_assistant_turn", "every assistant message holds only reasoning, which --reasoning drop removes, so "
                                "nothing would be trained")


def test_the_worked_example_of_docs_format(tok):
    """docs/FORMAT.md, "Worked example: an untrained turn, and reasoning"."""
    raw = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5.", "weight": 0},
                        {"role": "user", "content": "Sure?"},
                        {"role": "assistant", "reasoning_content": "2+2=4.", "content": "4."}]}
    ids, mask = rendered(tok, raw)
    assert ids == [100278, 17, 10, 17, 30, 100282, 100285, 20, 13, 100282, 100278, 40914, 30, 100282,
                   100279, 100283, 17, 10, 17, 28, 19, 13, 100284, 19, 13, 100282, 100257]
    assert mask == [0] * 14 + [1] * 12 + [0]
    assert rendered(tok, raw, TurnPolicy(train_on="last")) == (ids, mask)
    dropped = rendered(tok, raw, TurnPolicy(reasoning="drop"))
    assert dropped == (ids[:15] + ids[23:], mask[:15] + mask[23:])


def test_null_keys_as_parquet_structs_hold_them_are_absent():
    """A Parquet column of structs gives every message every key, null where absent."""
    null = dict.fromkeys(("reasoning_content", "reasoning", "thinking", "refusal", "weight", "train"))
    raw = {"messages": [dict(null, role="user", content="Q"),
                        dict(null, role="assistant", content=[{"type": "text", "text": "A", "value": None,
                                                               "thinking": None}])]}
    c = parse_record(raw, W)
    assert c.turns == (Turn("user", "Q"), Turn("assistant", "A")) and c.turn_counts == () and c.repairs == ()
    part = {"type": "tool_call", "value": None, "text": '{"name": "f", "arguments": {}}'}
    tool = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": [part]}]}
    assert [c.name for c in parse_record(tool, W, "tool").turns[1].tool_calls] == ["f"]
