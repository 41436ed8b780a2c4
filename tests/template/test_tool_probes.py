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
from sftdata.tokenize.hf import load_hf_tokenizer
from tests.helpers.data import write_jsonl
from tests.helpers.zoo import RECORDS, ZOO, Entry, reference_messages, zoo_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the proof extra)")
DEEPSEEK = {"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>"}
TEMPLATES = {
    **ZOO,
    "trl-deepseekv3": Entry("deepseekv3", source="trl", **DEEPSEEK),
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
