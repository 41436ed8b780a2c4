"""The template is the contract (issue 31): capabilities probed one by one; messages reach the
template as it reads them (reasoning_content, schemas and arguments untouched); a render
that would lose a part of a record refuses it by name; repairs only where the template
refuses the record as given, counted; template variables from the command line and per
record, recorded and re-derived by verify; a stop appended where a template closes no last
reply. The templates here are written for these tests (no model's template text is copied);
each kept record is compared with transformers' ``apply_chat_template``."""

from __future__ import annotations

import json
import os

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import RecordError
from sftdata.records.conversation import parse_record
from sftdata.template import ChatTemplate, learn_profile, load_chat_template, records_episodes
from sftdata.tokenize.open import load_hf_tokenizer
from sftdata.verify import verify
from tests.helpers.data import chat, write_jsonl
from tests.helpers.templates import TOKENS, preset_tokenizer, train_tokenizer
from tests.helpers.zoo import reference_messages

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the proof extra)")
runner = CliRunner()

# alternating roles only, no system role, and a call-only message rendered as its (empty) text
ALTERNATING = (
    "{{- bos_token }}{%- for m in messages %}"
    "{%- if m.role == 'system' %}{{- raise_exception('System role not supported') }}{%- endif %}"
    "{%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{{- '<start_of_turn>' + ('model' if m.role == 'assistant' else m.role) + '\\n' + m.content | trim"
    " + '<end_of_turn>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}")
# the reply after tool results opens with no assistant header
HEADERLESS = (
    "{{- bos_token }}{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '<|User|>' + m.content }}"
    "{%- elif m.role == 'tool' %}{{- '<|out_begin|>' + m.content + '<|out_end|>' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|Assistant|>' }}{%- endif %}"
    "{%- for c in m.tool_calls or [] %}{{- '<|call|>' + c.function.name + '<|sep|>' + (c.function.arguments | tojson)"
    " + '<|call_end|>' }}{%- endfor %}{{- m.content + '<|eos|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|Assistant|>' }}{%- endif %}")
HEADERLESS_TOKENS = ["<|bos|>", "<|eos|>", "<|User|>", "<|Assistant|>", "<|out_begin|>", "<|out_end|>", "<|call|>",
                     "<|sep|>", "<|call_end|>"]
# a reply ends with the next message's role token; the last one with nothing
NEXT_ROLE_ENDS = ("{%- for m in messages %}{{- '<|' + m.role + '|>\\n' + m.content }}{%- endfor %}"
                  "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}")
NEXT_ROLE_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|pad|>"]
# prints the date it is given, and the tools as they are
DATED = ("{{- '<|im_start|>system\\nToday is ' + date_string + '.' }}{%- if tools %}{{- '\\n' + (tools | tojson) }}"
         "{%- endif %}{{- '<|im_end|>\\n' }}{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
         "{%- for c in m.tool_calls or [] %}{{- '<tool_call>' + (c.function | tojson) + '</tool_call>' }}{%- endfor %}"
         "{{- '<|im_end|>\\n' }}{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather", "strict": True, "x-rate-limit": 3,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output
    return r


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    out = {name: train_tokenizer(root / name, *TOKENS[name][:3], TOKENS[name][3], config={
        "chat_template": template, "pad_token": TOKENS[name][0][0]})
        for name, template in (("gemma", ALTERNATING), ("chatml", DATED))}
    out["headerless"] = train_tokenizer(root / "headerless", HEADERLESS_TOKENS, "<|bos|>", "<|eos|>",
                                        config={"chat_template": HEADERLESS})
    # renders no schema, but otherwise with tools than without
    flagged = "{%- if tools %}{{- 'Tools are on. ' }}{%- endif %}" + HEADERLESS
    out["flagged"] = train_tokenizer(root / "flagged", HEADERLESS_TOKENS, "<|bos|>", "<|eos|>",
                                     config={"chat_template": flagged})
    out["next_role"] = train_tokenizer(root / "next_role", NEXT_ROLE_TOKENS, None, "<|endoftext|>",
                                       config={"chat_template": NEXT_ROLE_ENDS, "pad_token": "<|pad|>"})
    return out


def episodes_of(folder, record, mode="tool", variables=None, **policy):
    """``(result, profile, tok)`` of one record under the folder's own template."""
    from sftdata.records.turns import TurnPolicy
    from sftdata.template import model_profile

    tok = load_hf_tokenizer(folder)
    profile = model_profile(tok, "model", variables)
    (res,) = records_episodes([(parse_record(record, "r", mode, TurnPolicy(**policy)), "r")], profile, tok, None)
    return res, profile, tok


def hf_ids(folder, messages, tools=None, **variables):
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    return list(hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False, **variables))


# ---------------------------------------------------------------- capabilities, one by one
def test_a_template_without_system_or_tools_still_renders_plain_chat_exactly(folders):
    res, profile, tok = episodes_of(folders["gemma"], chat("Hi", "Hello!", "Bye", "See you."))
    assert set(profile.unsupported) == {"system", "tools", "reasoning"} and not profile.renders_tool_calls
    assert profile.unsupported["system"] == "refused the conversation: System role not supported"
    assert res.episodes[0].ids.tolist() == hf_ids(folders["gemma"], chat("Hi", "Hello!", "Bye", "See you.")["messages"])
    with pytest.raises(RecordError) as e:
        raise episodes_of(folders["gemma"], chat("Hi", "Hello!", system="Be brief."))[0]
    assert (e.value.reason, e.value.detail) == (
        "template_cannot_render_system", "the record holds a system message, which chat template model cannot render "
        "(refused the conversation: System role not supported); drop the system message from the record, or use a "
        "template with a system role (--chat-template)")


def test_prepare_tool_refuses_up_front_a_template_that_renders_no_tool_call(folders, tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", [{"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}]}])
    r = cli("prepare-tool", src, "-o", tmp_path / "ds", "--tokenizer", folders["gemma"])
    assert r.exit_code == 1 and not (tmp_path / "ds").exists()
    assert " ".join(r.output.split()) == (
        "error: chat template model renders no tool call (a call's name does not appear in its render), so every tool "
        "call of the records would be lost; prepare-tool refuses it. Use the model's own template for tool use "
        "(--chat-template model:NAME for a named one such as tool_use, or its official template as a .jinja file), "
        "or prepare-chat for records without tools")
    assert "llama3" not in r.output  # its tool format is not Meta's 3.1 one: never suggested for a model's data


CALL_TURNS = [  # a question, a tool call, its result, the answer
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    {"role": "assistant", "content": "It is 18C."}]


def test_a_reply_with_no_header_of_its_own_after_tool_results_is_located(folders):
    """The tool probe's reply opens after the special token before it, so tools are
    supported (this template renders calls and results, no schema: the record has none)."""
    record = {"messages": CALL_TURNS}
    res, profile, tok = episodes_of(folders["headerless"], record)
    assert profile.tools_supported and profile.layout.header_texts == ("<|Assistant|>", "<|out_end|>")
    messages, tools = reference_messages(record)
    ep = res.episodes[0]
    assert ep.ids.tolist() == hf_ids(folders["headerless"], messages, tools) and ep.rule_mismatch is None
    assert [tok.decode(ep.ids[a:b]) for a, b in zip(*_runs(ep.mask))] == [
        '<|call|>get_weather<|sep|>{"city": "Paris"}<|call_end|><|eos|>', "It is 18C.<|eos|>"]


def test_a_schema_written_only_in_its_call_is_ignored_by_the_template_and_counted(folders):
    """The template renders the call (its name and argument names) but never a schema, and
    the same text with or without tools: the record is kept as transformers renders it with
    its tools, and its ignored schemas counted (issue 41)."""
    record = {"tools": [WEATHER], "messages": CALL_TURNS}
    res, profile, tok = episodes_of(folders["headerless"], record)
    assert profile.tools_supported and profile.ignores_tool_schemas
    assert not isinstance(res, RecordError) and res.repairs == ("tool_schemas_ignored_by_template",)
    messages, tools = reference_messages(record)
    assert res.episodes[0].ids.tolist() == hf_ids(folders["headerless"], messages, tools)
    hf = transformers.AutoTokenizer.from_pretrained(str(folders["headerless"]))
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False)
    assert "get_weather" in text and "Weather" not in text.replace("Weather in Paris?", "")


def test_a_schema_dropped_by_a_template_that_renders_otherwise_with_tools_is_refused(folders):
    """No schema in the render, but the render changes with tools: dropping the schemas would
    not give transformers' render, so the record is refused."""
    record = {"tools": [WEATHER], "messages": CALL_TURNS}
    res, profile, tok = episodes_of(folders["flagged"], record)
    assert profile.tools_supported and not profile.ignores_tool_schemas
    assert isinstance(res, RecordError) and (res.reason, res.detail) == (
        "template_drops_tools", "chat template model drops the tool schema 'get_weather' from its "
        "render, so it would be lost (never kept altered); use a chat template that renders the tools it is given "
        "(or write the tool schemas into the record's system message)")


def _runs(mask):
    import numpy as np

    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return edges[::2], edges[1::2]


# ---------------------------------------------------------------- messages as the template reads them
def test_tool_schemas_keep_every_key_and_arguments_their_own_text(folders):
    record = {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":  "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"}, {"role": "assistant", "content": "18C."}]}
    res, profile, tok = episodes_of(folders["chatml"], record, variables={"date_string": "26 Jul 2024"})
    assert not isinstance(res, RecordError), res.detail
    text = res.episodes[0].text
    assert '"strict": true, "x-rate-limit": 3' in text and '"additionalProperties": false' in text
    messages, tools = reference_messages(record, profile.arguments)
    assert res.episodes[0].ids.tolist() == hf_ids(folders["chatml"], messages, tools, date_string="26 Jul 2024")


def test_a_template_that_prints_arguments_as_they_are_gets_the_records_own_text(tmp_path):
    text = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}{%- for c in m.tool_calls or [] %}"
            "{{- c.function.name + ' ' + c.function.arguments }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    tok = preset_tokenizer(tmp_path, "chatml")
    profile = learn_profile(ChatTemplate("raw.jinja", "file", text), tok)
    assert profile.arguments == "string"
    record = {"messages": [{"role": "user", "content": "Paris?"}, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"city":  "Paris" }'}}]},
        {"role": "tool", "content": "18C"}, {"role": "assistant", "content": "18C."}]}
    (res,) = records_episodes([(parse_record(record, "r", "tool"), "r")], profile, tok, None)
    assert 'f {"city":  "Paris" }<|im_end|>' in res.episodes[0].text


def test_a_reply_holding_think_tags_is_not_cut_by_qwen3_when_its_reasoning_is_a_field(tmp_path):
    """Qwen3 splits content at its last </think> unless reasoning_content is given: the
    record's reasoning goes as the field, so a reply that itself holds </think> is whole;
    without reasoning the split would lose text, and the record is refused by name."""
    tok = preset_tokenizer(tmp_path, "qwen3")
    profile = learn_profile(load_chat_template("qwen3"), tok)
    reply = "Write </think> to close it."
    msgs = [{"role": "user", "content": "How?"}, {"role": "assistant", "reasoning_content": "Tags.", "content": reply}]
    (res,) = records_episodes([(parse_record({"messages": msgs}, "r"), "r")], profile, tok, None)
    assert res.episodes[0].text.endswith(f"<think>\nTags.\n</think>\n\n{reply}<|im_end|>\n")
    plain = [msgs[0], {"role": "assistant", "content": "The end tag is </think> here."}]
    (res,) = records_episodes([(parse_record({"messages": plain}, "r"), "r")], profile, tok, None)
    assert res.reason == "template_drops_reply" and res.detail.startswith(
        "chat template qwen3 drops assistant message 1's text from its render, so it would be lost (never kept "
        "altered); the template rewrites the text (look in it for text the template splits on, such as </think>)")


@pytest.mark.parametrize("policy, counts, trained", [
    ({}, ("reasoning_ignored_by_template",), "4.<|eot_id|>"),
    ({"reasoning": "inline"}, ("reasoning_inline",), "<think>\nAdd.\n</think>\n\n4.<|eot_id|>"),
])
def test_reasoning_a_template_ignores_is_dropped_and_counted_or_inlined_by_choice(tmp_path, policy, counts, trained):
    from sftdata.records.turns import TurnPolicy

    tok = preset_tokenizer(tmp_path, "llama3")
    profile = learn_profile(load_chat_template("llama3"), tok)
    assert not profile.supports("reasoning")
    record = {"messages": [{"role": "user", "content": "2+2?"},
                           {"role": "assistant", "reasoning_content": "Add.", "content": "4."}]}
    (res,) = records_episodes([(parse_record(record, "r", "chat", TurnPolicy(**policy)), "r")], profile, tok, None)
    assert res.counts == counts
    ep = res.episodes[0]
    assert [tok.decode(ep.ids[a:b]) for a, b in zip(*_runs(ep.mask))] == [trained]
    only = {"messages": [record["messages"][0], {"role": "assistant", "reasoning_content": "Add.", "content": ""}]}
    (res,) = records_episodes([(parse_record(only, "r"), "r")], profile, tok, None)
    assert res.reason == "template_drops_reasoning" and "prepare with --reasoning inline" in res.detail


# ---------------------------------------------------------------- repairs only where the template refuses
def test_a_leading_assistant_turn_is_untrained_and_dropped_only_where_the_template_refuses_it(folders, tmp_path):
    """A reply that opens the conversation answers no one: never trained, counted the same
    way under every template (issue 41); dropped (and counted so) where the template
    refuses it."""
    lead = {"messages": [{"role": "assistant", "content": "Welcome."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello!"}]}
    res, _, _ = episodes_of(folders["gemma"], lead, "chat")
    assert res.repairs == ("leading_assistant_untrained", "dropped_leading_assistant")
    assert res.episodes[0].ids.tolist() == hf_ids(folders["gemma"], lead["messages"][1:])
    chatml = preset_tokenizer(tmp_path, "chatml")  # a template that renders it: kept, as given, untrained
    profile = learn_profile(load_chat_template("chatml"), chatml)
    (res,) = records_episodes([(parse_record(lead, "r"), "r")], profile, chatml, None)
    ep = res.episodes[0]
    assert res.repairs == ("leading_assistant_untrained",)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "chatml"))
    assert ep.ids.tolist() == list(hf.apply_chat_template(lead["messages"], chat_template=profile.template.text,
                                                          tokenize=True, return_dict=False))
    assert [chatml.decode(ep.ids[a:b]) for a, b in zip(*_runs(ep.mask))] == ["Hello!<|im_end|>"]
    assert ep.text.startswith("<|im_start|>assistant\nWelcome.<|im_end|>") and ep.rule_mismatch is None


def test_same_role_turns_are_merged_only_where_the_template_refuses_them(folders, tmp_path):
    twice = {"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Are you there?"},
                          {"role": "assistant", "content": "Yes."}]}
    res, _, _ = episodes_of(folders["gemma"], twice, "chat")
    assert res.repairs == ("merged_same_role",)
    merged = [{"role": "user", "content": "Hi\n\nAre you there?"}, twice["messages"][2]]
    assert res.episodes[0].ids.tolist() == hf_ids(folders["gemma"], merged)
    chatml = preset_tokenizer(tmp_path, "chatml")
    (res,) = records_episodes([(parse_record(twice, "r"), "r")], learn_profile(load_chat_template("chatml"), chatml),
                              chatml, None)
    assert res.repairs == () and "<|im_start|>user\nHi<|im_end|>\n<|im_start|>user\nAre you there?" in \
        res.episodes[0].text


def test_the_results_of_parallel_calls_in_one_json_list_are_rendered_as_given_or_split(tmp_path):
    """LLaMA-Factory writes the results of N calls as one observation holding a JSON list:
    a template that renders the record as given gets it so; sftdata's markers get N results."""
    record = {"conversations": [
        {"from": "human", "value": "Weather in Paris and Rome?"},
        {"from": "function_call", "value": json.dumps([{"name": "w", "arguments": {"city": "Paris"}},
                                                       {"name": "w", "arguments": {"city": "Rome"}}])},
        {"from": "observation", "value": json.dumps(["18C", {"temp": 21}])},
        {"from": "gpt", "value": "18C and 21C."}]}
    conv = parse_record(record, "r", "tool")
    assert conv.repairs == ("split_tool_results",)
    assert [t.text for t in conv.turns if t.role == "tool"] == ["18C", '{"temp": 21}']
    assert [t.text for t in conv.given_turns if t.role == "tool"] == ['["18C", {"temp": 21}]']
    tok = preset_tokenizer(tmp_path, "chatml")
    (res,) = records_episodes([(conv, "r")], learn_profile(load_chat_template("chatml"), tok), tok, None)
    assert res.repairs == () and '<tool_response>\n["18C", {"temp": 21}]\n</tool_response>' in res.episodes[0].text


# ---------------------------------------------------------------- a stop where the template writes none
def test_a_template_that_ends_replies_with_the_next_role_gets_its_eos_appended(folders, tmp_path):
    record = chat("Hi", "Hello!", "Bye", "See you.", system="Be brief.")
    res, profile, tok = episodes_of(folders["next_role"], record, "chat")
    assert profile.appended_stop == "<|endoftext|>" and "<|endoftext|>" in profile.layout.end_texts
    ep = res.episodes[0]
    assert ep.ids.tolist() == hf_ids(folders["next_role"], record["messages"]) + [tok.token_id("<|endoftext|>")]
    assert [tok.decode(ep.ids[a:b]) for a, b in zip(*_runs(ep.mask))] == ["Hello!<|user|>", "See you.<|endoftext|>"]
    src = write_jsonl(tmp_path / "in.jsonl", [record] * 2)
    assert cli("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", folders["next_role"], "-q").exit_code == 0
    serving = orjson.loads((tmp_path / "ds" / "serving.json").read_bytes())
    assert serving["template"]["appended_stop"] == "<|endoftext|>"
    assert tok.token_id("<|endoftext|>") in serving["stop_ids"]
    assert verify(tmp_path / "ds").ok


# ---------------------------------------------------------------- template variables
def test_template_variables_from_the_command_line_and_per_record_recorded_and_rederived(folders, tmp_path):
    records = [chat("Hi", "Hello!"), {**chat("Hi", "Hello!"), "chat_template_kwargs": {"date_string": "1 Jan 2025"}}]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    ds = tmp_path / "ds"
    r = cli("prepare-chat", src, "-o", ds, "--tokenizer", folders["chatml"], "--template-var",
            'date_string="26 Jul 2024"', "--json")
    assert r.exit_code == 0, r.output
    tok = load_hf_tokenizer(folders["chatml"])
    from sftdata.store import open_dataset

    split = open_dataset(ds).split("train")
    texts = [tok.decode(split.episode(i)[0]) for i in range(2)]
    assert "Today is 26 Jul 2024." in texts[0] and "Today is 1 Jan 2025." in texts[1]
    state = orjson.loads((ds / "tokenizer_state.json").read_bytes())
    assert state["chat_template"]["variables"] == {"date_string": "26 Jul 2024"}
    assert orjson.loads((ds / "dataset_metadata.json").read_bytes())["options"]["template_vars"] == {
        "date_string": "26 Jul 2024"}
    assert verify(ds).ok
    state["chat_template"]["variables"] = {}  # not the variables the data was made with: the rule is not learned
    (ds / "tokenizer_state.json").write_bytes(orjson.dumps(state))
    problems = [p for p in verify(ds, quick=True).problems if p.code == "template_rule"]
    assert len(problems) == 1 and problems[0].message.startswith(
        "the recorded chat template does not learn again with its recorded variables: chat template model failed: "
        "UndefinedError")


def test_a_template_variable_that_is_not_json_is_a_usage_error(folders, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat("Hi", "Hello!")])
    r = cli("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", folders["chatml"], "--template-var",
            "date_string=26 Jul 2024")
    assert r.exit_code == 2 and " ".join(r.output.split()) == (
        "error: --template-var date_string=26 Jul 2024: the value is not JSON; a string needs quotes, e.g. "
        "--template-var date_string='\"26 Jul 2024\"'")
    r = cli("prepare-chat", src, "-o", tmp_path / "ds", "--template-var", "x=1")
    assert r.exit_code == 2 and "--template-var needs a model's own tokenizer" in r.output
