"""Tool probes that render like a user's data (issue 41): real model templates (the zoo's,
and those TRL's wheel ships, read from the installed packages at test time, never copied
here), each kept record compared with transformers' ``apply_chat_template``, ids exactly."""

from __future__ import annotations

import os

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import RecordError
from sftdata.records.conversation import parse_record
from sftdata.template import model_profile, records_episodes
from sftdata.tokenize.open import load_hf_tokenizer
from tests.helpers.data import write_jsonl
from tests.helpers.templates import TOKENS, train_tokenizer
from tests.helpers.zoo import RECORDS, ZOO, Entry, reference_messages, zoo_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the proof extra)")
DEEPSEEK = {"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>"}
TEMPLATES = {
    **ZOO,
    "trl-deepseekv3": Entry("deepseekv3", source="trl", **DEEPSEEK),
    "command-r-plus": Entry("CohereForAI-c4ai-command-r-plus-tool_use", bos="<BOS_TOKEN>", eos="<|END_OF_TURN_TOKEN|>"),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    made: dict = {}

    def get(name: str):
        if name not in made:
            m = zoo_model(tmp_path_factory.mktemp("tpl"), name, TEMPLATES[name])
            tok = load_hf_tokenizer(m.folder)
            profile = model_profile(tok, "model", m.entry.variables)
            made[name] = (m, tok, profile, transformers.AutoTokenizer.from_pretrained(str(m.folder)))
        return made[name]
    return get


def hf_ids(hf, record: dict, profile) -> list[int]:
    messages, tools = reference_messages(record, profile.arguments, reasoning=False)
    return list(hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False,
                                       **profile.user_variables))


@pytest.mark.parametrize("name", ["deepseek-v3.1", "trl-deepseekv3"])
def test_tool_schemas_a_template_never_renders_are_counted_not_refused(model, name):
    """DeepSeek V3's templates render calls and results but no schema: the record is kept,
    token-identical to transformers' render with its tools, and counted."""
    _, tok, profile, hf = model(name)
    assert profile.ignores_tool_schemas and profile.state()["chat_template"]["tool_schemas"] == "ignored"
    record = RECORDS["tool"]
    (res,) = records_episodes([(parse_record(record, "r", "tool"), "r")], profile, tok, None)
    assert not isinstance(res, RecordError), res.detail
    assert res.repairs == ("tool_schemas_ignored_by_template",)
    assert [ep.ids.tolist() for ep in res.episodes] == [hf_ids(hf, record, profile)]


@pytest.mark.parametrize("name", ["qwen3", "llama-3.1", "glm-4.6"])
def test_a_template_that_renders_schemas_is_not_said_to_ignore_them(model, name):
    _, tok, profile, _ = model(name)
    assert not profile.ignores_tool_schemas and profile.state()["chat_template"]["tool_schemas"] == "rendered"
    (res,) = records_episodes([(parse_record(RECORDS["tool"], "r", "tool"), "r")], profile, tok, None)
    assert not isinstance(res, RecordError) and "tool_schemas_ignored_by_template" not in res.repairs


def test_prepare_tool_warns_of_ignored_schemas_once_with_the_count(model, tmp_path):
    m, _, _, _ = model("trl-deepseekv3")
    records = [{**RECORDS["tool"], "messages": [{"role": "user", "content": f"Weather {i}?"},
                                                *RECORDS["tool"]["messages"][1:]]} for i in range(3)]
    src = write_jsonl(tmp_path / "t.jsonl", records)
    r = CliRunner().invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", str(m.folder),
                                 "-j", "1", "--allow-pad-as-stop"])
    assert r.exit_code == 0, r.output
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert warned == ["warning: 3 record(s) give tool schemas that the chat template never renders (the model does "
                      "not see them at inference either): they were left out of the render and counted as "
                      "tool_schemas_ignored_by_template; write them into the system message if the model should see "
                      "them"]
    meta = orjson.loads((tmp_path / "ds" / "dataset_metadata.json").read_bytes())
    assert meta["counts"]["repaired"] == {"tool_schemas_ignored_by_template": 3}


DESCRIBED = {"tools": [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                    "unit": {"type": "string", "description": "celsius or fahrenheit"}},
                   "required": ["city"]}}}], "messages": RECORDS["tool"]["messages"]}


def test_a_tool_template_that_loops_over_tools_learns_with_tools_given(model):
    """Command R+'s tool_use template loops over ``tools`` and prints every parameter's
    description: the probes give it tools, as a user's data does, instead of crashing on
    ``'NoneType' object is not iterable`` (issue 41). A record it renders is kept exactly; one
    it refuses (a chat without tools) is refused with its own message, as transformers does."""
    _, tok, profile, hf = model("command-r-plus")
    assert profile.tools_supported and profile.renders_tool_calls
    (res,) = records_episodes([(parse_record(DESCRIBED, "r", "tool"), "r")], profile, tok, None)
    assert not isinstance(res, RecordError), res.detail
    assert [ep.ids.tolist() for ep in res.episodes] == [hf_ids(hf, DESCRIBED, profile)]
    (res,) = records_episodes([(parse_record(RECORDS["chat"], "r", "chat"), "r")], profile, tok, None)
    assert isinstance(res, RecordError) and res.reason == "template_error"
    assert res.detail.startswith("chat template model failed: TypeError: 'NoneType' object is not iterable")
    with pytest.raises(TypeError, match="'NoneType' object is not iterable"):  # transformers refuses it too
        hf.apply_chat_template(RECORDS["chat"]["messages"], tokenize=False)


# writes an assistant's calls only when the conversation is given tools (as Hunyuan's and
# MiniMax's templates do)
CALLS_WITH_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
    "{%- if tools %}{%- for c in m.tool_calls or [] %}{{- '<tool_call>' + (c.function | tojson) + '</tool_call>' }}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def test_a_template_that_writes_calls_only_when_given_tools_renders_tool_calls(tmp_path):
    folder = train_tokenizer(tmp_path / "calls", *TOKENS["chatml"][:3], TOKENS["chatml"][3],
                             config={"chat_template": CALLS_WITH_TOOLS, "pad_token": "<|endoftext|>"})
    tok = load_hf_tokenizer(folder)
    profile = model_profile(tok, "model")
    assert profile.renders_tool_calls and profile.tools_supported  # refused up front by prepare-tool before
    (res,) = records_episodes([(parse_record(RECORDS["tool"], "r", "tool"), "r")], profile, tok, None)
    assert not isinstance(res, RecordError), res.detail
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert [ep.ids.tolist() for ep in res.episodes] == [hf_ids(hf, RECORDS["tool"], profile)]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>' \
        in res.episodes[0].text
