"""`sftdata prepare-tool`, the prepare-chat/prepare-tool boundary, scripts/prepare_tool_sft.py
and sample_data/tools.jsonl."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.chat.render import render
from sftdata.chat.tokenizer import load_tokenizer
from sftdata.cli import app
from sftdata.records.conversation import parse_record
from sftdata.store import open_dataset
from tests.helpers.paths import ROOT

runner = CliRunner()

WEATHER = {"name": "get_weather", "description": "Weather.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def good(i: int) -> dict:
    cid = f"c{i}"
    return {"tools": [{"type": "function", "function": WEATHER}], "messages": [
        {"role": "user", "content": f"Weather in city {i}?"},
        {"role": "assistant", "tool_calls": [{"id": cid, "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": f"C{i}"})}}]},
        {"role": "tool", "tool_call_id": cid, "content": f"{i} degrees"},
        {"role": "assistant", "content": f"It is {i} degrees."}]}


def glaive(i: int) -> dict:
    return {"tools": json.dumps([WEATHER]), "conversations": [
        {"from": "human", "value": f"Weather in city {i}?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": f"C{i}"}})},
        {"from": "observation", "value": f"{i} degrees"},
        {"from": "gpt", "value": f"It is {i} degrees."}]}


def write_jsonl(path: Path, records: list) -> Path:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in records))
    return path


BAD_ARGS = {"tools": [{"type": "function", "function": WEATHER}], "messages": [
    {"role": "user", "content": "x"},
    {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": "{oops"}}]}]}
UNKNOWN_FN = {"tools": [{"type": "function", "function": WEATHER}], "messages": [
    {"role": "user", "content": "x"},
    {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                          "function": {"name": "nope", "arguments": "{}"}}]}]}
CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}


def test_prepare_tool_json_summary_counts_and_episode_tokens(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [good(0), BAD_ARGS, glaive(1), CHAT, UNKNOWN_FN, good(2)])
    out = tmp_path / "ds"
    res = runner.invoke(app, ["prepare-tool", str(src), "-o", str(out), "--json", "-j", "1"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["records_read"] == 6
    assert s["episodes"] == {"train": 4}
    assert s["rejected"] == {"invalid_arguments": 1, "unknown_function": 1}
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(r["record"], r["reason"], r["where"]) for r in rejects] == [
        (1, "invalid_arguments", f"{src}:line 2"), (4, "unknown_function", f"{src}:line 5")]
    ds = open_dataset(out)
    split = ds.split("train")
    assert split.sources.tolist() == [0, 2, 3, 5]
    tok = load_tokenizer()
    for gid, rec in enumerate([good(0), glaive(1), CHAT, good(2)]):
        ids, mask = split.episode(gid)
        want = render(parse_record(rec, "w", "tool"), tok)
        assert ids.tolist() == want.ids.tolist() and mask.tolist() == want.mask.tolist()


def test_prepare_tool_strict_stops_with_line_and_reason(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [good(0), UNKNOWN_FN])
    res = runner.invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / "ds"), "--strict", "-q"])
    assert res.exit_code == 1
    err = " ".join(res.stderr.split())
    assert f"{src}:line 2: message 1 calls 'nope', which is not in 'tools'" in err
    assert "--strict stops at the first bad record" in err
    assert not (tmp_path / "ds").exists()


def test_prepare_chat_on_tool_records_points_to_prepare_tool(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [good(0), CHAT])
    res = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--json", "-j", "1"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rejected"] == {"tool_conversation": 1}
    (reject,) = [json.loads(line) for line in (tmp_path / "ds" / "rejects.jsonl").read_text().splitlines()]
    assert "prepare it with `sftdata prepare-tool`" in reject["message"]
    res = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds2"), "--strict", "-q"])
    assert res.exit_code == 1 and "sftdata prepare-tool" in " ".join(res.stderr.split())


def test_every_record_bad_is_an_error(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [BAD_ARGS, UNKNOWN_FN])
    res = runner.invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / "ds"), "-q"])
    assert res.exit_code == 1
    assert "every record was rejected (2 read; invalid_arguments: 1, unknown_function: 1)" in \
        " ".join(res.stderr.split())


def test_prepare_tool_has_the_options_of_prepare_chat():
    def options(name):
        cmd = next(c for c in app.registered_commands if c.name == name)
        import inspect

        return list(inspect.signature(cmd.callback).parameters)

    assert options("prepare-tool") == options("prepare-chat")
    res = runner.invoke(app, ["prepare-tool", "--help"])
    assert res.exit_code == 0
    text = " ".join(res.stdout.split())
    assert "--val-split" in text and "--max-tokens" in text and "docs/TOOLS.md" in text


def test_output_is_byte_identical_across_runs_and_workers(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [good(i) if i % 2 else glaive(i) for i in range(40)])
    for name, workers in (("a", "1"), ("b", "2")):
        res = runner.invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / name), "--val-split", "0.25",
                                  "-q", "-j", workers])
        assert res.exit_code == 0, res.output
    for split in ("train", "val"):
        for f in ("tokens.bin", "mask.bin", "episodes.idx", "sources.idx"):
            a = (tmp_path / "a" / split / "shard_00000" / f).read_bytes()
            assert a == (tmp_path / "b" / split / "shard_00000" / f).read_bytes()


def _script():
    spec = importlib.util.spec_from_file_location("prepare_tool_sft", ROOT / "scripts" / "prepare_tool_sft.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_script_is_a_thin_wrapper_with_the_seed_interface(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [good(i) for i in range(10)] + [UNKNOWN_FN])
    out = tmp_path / "ds"
    assert _script().main(["--input", str(src), "--output_dir", str(out), "--val_split", "0.2"]) == 0
    printed = capsys.readouterr().out
    assert "train 8 episodes" in printed and "val 2 episodes" in printed
    assert "11 records read, 1 rejected: unknown_function 1" in printed
    ds = open_dataset(out)
    assert ds.split("train").num_episodes == 8 and ds.split("val").num_episodes == 2
    assert ds.metadata["options"]["mode"] == "tool"
    assert _script().main(["--input", str(src), "--output_dir", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err


def test_sample_data_prepares_with_the_documented_rejections(tmp_path):
    res = runner.invoke(app, ["prepare-tool", str(ROOT / "sample_data" / "tools.jsonl"), "-o",
                              str(tmp_path / "ds"), "--json", "-j", "1"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["records_read"] == 32 and s["episodes"] == {"train": 24}
    assert s["rejected"] == {"invalid_arguments": 2, "invalid_json": 1, "no_assistant_turn": 1,
                             "orphan_tool_result": 1, "unanswered_tool_call": 1, "unknown_function": 1,
                             "unknown_tool_call_id": 1}
    assert s["repaired"] == {"reordered_tool_results": 1}


@pytest.mark.parametrize("val", ["1.0", "-0.1"])
def test_bad_val_split_is_a_usage_error(tmp_path, val):
    src = write_jsonl(tmp_path / "in.jsonl", [good(0)])
    res = runner.invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / "ds"), "--val-split", val, "-q"])
    assert res.exit_code == 2 and "--val-split must be a fraction in [0, 1)" in res.stderr
