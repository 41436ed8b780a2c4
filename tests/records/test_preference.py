"""Preference and RL record forms: each form's prompt and completions exactly, and each reject."""

from __future__ import annotations

import pytest

from sftdata.errors import RecordError
from sftdata.records.conversation import parse_record
from sftdata.records.preference import detect_form, parse_preference, parse_prompt, value_texts

U = {"role": "user", "content": "What color is the sky?"}
A_BLUE = {"role": "assistant", "content": "It is blue."}
A_GREEN = {"role": "assistant", "content": "It is green."}


def test_trl_conversational_explicit_prompt():
    r = parse_preference({"prompt": [U], "chosen": [A_BLUE], "rejected": [A_GREEN]}, "f:line 1")
    assert (r.form, r.prompt, r.completions, r.label, r.key) == ("trl", (U,), ((A_BLUE,), (A_GREEN,)), None, "messages")
    assert r.conversations() == [{"messages": [U, A_BLUE]}, {"messages": [U, A_GREEN]}]


def test_trl_standard_rows_become_a_user_and_an_assistant_message():
    r = parse_preference({"prompt": "Sky?", "chosen": "Blue.", "rejected": "Green."}, "f:line 1")
    assert r.prompt == ({"role": "user", "content": "Sky?"},)
    assert r.completions == (({"role": "assistant", "content": "Blue."},), ({"role": "assistant", "content": "Green."},))


def test_trl_implicit_prompt_is_the_common_prefix_of_messages_ending_before_the_assistant():
    r = parse_preference({"chosen": [U, A_BLUE], "rejected": [U, A_GREEN]}, "f:line 1")
    assert r.prompt == (U,) and r.completions == ((A_BLUE,), (A_GREEN,))


def test_implicit_prompt_where_one_side_is_a_prefix_of_the_other_is_refused():
    # TRL's extract_prompt takes [U] as the prompt here and leaves chosen one message short (trl#6960, #6472)
    with pytest.raises(RecordError, match=r"^f:line 3: 'chosen' is the other conversation's first 2 message\(s\), so "
                                          r"it has no completion of its own; give 'prompt' explicitly$") as e:
        parse_preference({"chosen": [U, A_BLUE], "rejected": [U, A_BLUE, U, A_GREEN]}, "f:line 3")
    assert e.value.reason == "implicit_prompt_ambiguous"


def test_implicit_prompt_that_diverges_at_a_user_message_is_refused():
    with pytest.raises(RecordError, match="first differ at message 0, which is not an assistant message") as e:
        parse_preference({"chosen": [U, A_BLUE], "rejected": [{"role": "user", "content": "x"}, A_BLUE]}, "w")
    assert e.value.reason == "implicit_prompt_ambiguous"


def test_standard_rows_without_a_prompt_are_not_split_in_text():
    with pytest.raises(RecordError, match=r"split in text, which merges tokens across it \(trl#1153\)") as e:
        parse_preference({"chosen": "Sky? Blue.", "rejected": "Sky? Green."}, "w")
    assert e.value.reason == "implicit_prompt_in_text"


def test_identical_completions_are_refused():
    with pytest.raises(RecordError, match="a pair needs two different completions") as e:
        parse_preference({"prompt": [U], "chosen": [A_BLUE], "rejected": [A_BLUE]}, "w")
    assert e.value.reason == "identical_completions"


def test_kto_rows_both_spellings():
    r = parse_preference({"prompt": [U], "completion": [A_BLUE], "label": True}, "w")
    assert (r.form, r.prompt, r.completions, r.label) == ("kto", (U,), ((A_BLUE,),), True)
    r = parse_preference({"messages": [U, A_GREEN], "label": False}, "w")  # LLaMA-Factory's KTO
    assert (r.prompt, r.completions, r.label) == ((U,), ((A_GREEN,),), False)
    with pytest.raises(RecordError, match=r"'label' is a string 'yes'; give true \(desirable\) or false") as e:
        parse_preference({"prompt": "x", "completion": "y", "label": "yes"}, "w")
    assert e.value.reason == "invalid_label"


def test_ultrafeedback_takes_the_best_and_the_worst_score():
    obj = {"instruction": "Sky?", "completions": [
        {"response": "Blue.", "overall_score": 8.5}, {"response": "Green.", "overall_score": 2},
        {"response": "Red.", "overall_score": 2}, {"response": "Azure.", "overall_score": 8.5}]}
    r = parse_preference(obj, "w")
    assert r.form == "ultrafeedback" and r.prompt == ({"role": "user", "content": "Sky?"},)
    assert r.completions == (({"role": "assistant", "content": "Blue."},), ({"role": "assistant", "content": "Green."},))
    obj["completions"] = [{"response": "a", "score": 1}, {"response": "b", "score": 1}]
    with pytest.raises(RecordError, match="every completion scores 1; nothing is preferred") as e:
        parse_preference(obj, "w")
    assert e.value.reason == "no_preference"


def test_llamafactory_sharegpt_and_alpaca_pairs():
    obj = {"conversations": [{"from": "human", "value": "Hi"}], "chosen": {"from": "gpt", "value": "Hello!"},
           "rejected": {"from": "gpt", "value": "Go away."}}
    r = parse_preference(obj, "w")
    assert (r.form, r.key) == ("llamafactory", "conversations")
    assert r.conversations()[0] == {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]}
    r = parse_preference({"instruction": "Add", "input": "2+2", "chosen": "4", "rejected": "5"}, "w")
    assert r.prompt == ({"role": "user", "content": "Add\n2+2"},)


def test_tools_tool_calls_and_reasoning_reach_the_conversation():
    call = {"role": "assistant", "content": None, "reasoning_content": "Look it up.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = parse_preference({"prompt": [U], "chosen": [call], "rejected": [A_GREEN], "tools": tools}, "w")
    conv = parse_record(r.conversations()[0], "w", "tool")
    assert conv.turns[-1].tool_calls[0].name == "get_weather" and conv.turns[-1].reasoning == "Look it up."
    assert conv.tools and r.carried == {"tools": tools}


def test_no_form_fits():
    assert detect_form({"messages": [U, A_BLUE]}) is None
    with pytest.raises(RecordError, match=r"^w: no preference form fits the keys \(messages\)") as e:
        parse_preference({"messages": [U, A_BLUE]}, "w")
    assert e.value.reason == "not_preference_record"
    with pytest.raises(RecordError, match=r"--format kto needs 'label', which the record lacks"):
        parse_preference({"prompt": [U], "chosen": [A_BLUE], "rejected": [A_GREEN]}, "w", "kto")


def test_rl_prompt_and_its_columns():
    p = parse_prompt({"prompt": "2+2?", "answer": 4, "meta": {"src": "gsm8k"}}, "w")
    assert p.prompt == ({"role": "user", "content": "2+2?"},) and p.columns == ("answer", "meta")
    with pytest.raises(RecordError, match="an RL prompt ends where the model's reply begins") as e:
        parse_prompt({"messages": [U, A_BLUE]}, "w")
    assert e.value.reason == "prompt_ends_with_assistant"


def test_value_texts_are_byte_exact():
    raw = b'{"a" : 1.50, "b":"x\\\\\\"y", "c": [1, {"d": "]"}] , "e":null, "f": 1e400}'
    assert value_texts(raw) == {b'"a"': b"1.50", b'"b"': b'"x\\\\\\"y"', b'"c"': b'[1, {"d": "]"}]', b'"e"': b"null",
                                b'"f"': b"1e400"}
