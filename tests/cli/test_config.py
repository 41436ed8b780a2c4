"""``--config run.toml`` on every prepare command: the same bytes as the same options given
as flags, the command line over the file, and every error one line with exit code 2. Also:
the options every prepare command takes, as its --help lists them."""

from __future__ import annotations

import json
import sys

import pytest
import typer
from typer.testing import CliRunner

from sftdata.cli import app
from tests.helpers.data import chat, write_jsonl

runner = CliRunner()
PAIR = {"prompt": [{"role": "user", "content": "Sky?"}], "chosen": [{"role": "assistant", "content": "Blue."}],
        "rejected": [{"role": "assistant", "content": "Green, surely."}]}


def _files(ds):
    return {p.relative_to(ds).as_posix(): p.read_bytes() for p in sorted(ds.rglob("*")) if p.is_file()}


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("command, record, flags, toml", [
    ("prepare-chat", chat("q", "a"), ["--val-split", "0.25", "--seed", "7", "--max-tokens", "64", "--dedup", "exact",
                                      "--shard-tokens", "100", "--reasoning", "drop", "--max-record-bytes", "1M",
                                      "--decontaminate", "EVAL"],
     'val-split = 0.25\nseed = 7\nmax_tokens = 64\ndedup = "exact"\nshard_tokens = 100\nreasoning = "drop"\n'
     'max_record_bytes = "1M"\ndecontaminate = ["EVAL"]\n'),
    ("prepare-pref", PAIR, ["--val-split", "0.25", "--seed", "7", "--max-length", "64", "--truncation", "drop",
                            "--format", "trl", "--source-sha256"],
     'val_split = 0.25\nseed = 7\nmax-length = 64\ntruncation = "drop"\nformat = "trl"\nsource_sha256 = true\n'),
])
def test_a_run_from_a_config_file_writes_the_same_bytes_as_the_same_flags(tmp_path, command, record, flags, toml):
    src = write_jsonl(tmp_path / "in.jsonl", [record] * 2 + [{**record, "x": i} for i in range(6)])
    evals = write_jsonl(tmp_path / "evals.jsonl", [{"prompt": "nothing in common here at all"}])
    flags = [str(evals) if f == "EVAL" else f for f in flags]
    (tmp_path / "run.toml").write_text(toml.replace("EVAL", str(evals)), encoding="utf-8")
    # the two datasets are written side by side in folders of the same name: their files are compared byte for byte
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _run(command, src, "-o", tmp_path / "a" / "ds", "-j", "1", "-q", *flags).exit_code == 0
    r = _run(command, src, "-o", tmp_path / "b" / "ds", "-j", "1", "-q", "--config", tmp_path / "run.toml")
    assert r.exit_code == 0, r.output
    flagged, configured = _files(tmp_path / "a" / "ds"), _files(tmp_path / "b" / "ds")
    assert sorted(flagged) == sorted(configured) and flagged == configured
    meta = json.loads(configured["dataset_metadata.json"])
    assert (meta["options"]["val_split"], meta["options"]["seed"]) == (0.25, 7)


def test_the_command_line_overrides_the_file_and_the_resolved_options_are_recorded(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(8)])
    (tmp_path / "run.toml").write_text("val_split = 0.5\nseed = 9\n", encoding="utf-8")
    r = _run("prepare-chat", src, "-o", tmp_path / "ds", "--config", tmp_path / "run.toml", "--val-split", "0.25",
             "--json", "-q")
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())
    assert (meta["options"]["val_split"], meta["options"]["seed"], json.loads(r.stdout)["episodes"]) == \
        (0.25, 9, {"train": 6, "val": 2})


def test_a_flag_the_file_turns_on_is_turned_off_by_its_no_form(tmp_path):
    """``strict = true`` in the file, ``--no-strict`` on the command line: the command line
    wins, so the bad record is skipped and counted instead of stopping the run; without it
    the file's --strict stops at line 2."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q0", "a0"), {"bad": 1}, chat("q2", "a2")])
    (tmp_path / "run.toml").write_text("strict = true\n", encoding="utf-8")
    r = _run("prepare-chat", src, "-o", tmp_path / "ds", "--config", tmp_path / "run.toml", "--no-strict", "--json", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rejected"] == {"no_messages": 1}
    assert json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())["options"]["strict"] is False
    r = _run("prepare-chat", src, "-o", tmp_path / "ds2", "--config", tmp_path / "run.toml", "-q")
    assert r.exit_code == 1 and "in.jsonl:line 2:" in r.output and not (tmp_path / "ds2").exists()


@pytest.mark.parametrize("command", ["prepare-chat", "prepare-tool", "prepare-pref", "prepare-rl"])
def test_a_bad_key_is_one_line_and_exit_code_2_on_every_command(tmp_path, command):
    cfg = tmp_path / "run.toml"
    cfg.write_text("val_split = 0.1\nvalsplit = 0.2\n", encoding="utf-8")
    r = _run(command, tmp_path / "in.jsonl", "-o", tmp_path / "ds", "--config", cfg)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"error: --config {cfg}: {command} takes no option 'valsplit'; it takes max_record_bytes, ")
    assert r.stderr.count("\n") == 1 and r.stdout == ""
    assert not (tmp_path / "ds").exists()


def test_a_wrong_type_and_a_missing_file_are_one_line_and_exit_code_2(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('seed = "seven"\n', encoding="utf-8")
    r = _run("prepare-pref", tmp_path / "in.jsonl", "-o", tmp_path / "ds", "--config", cfg)
    assert (r.exit_code, r.stderr) == (2, f"error: --config {cfg}: seed takes a whole number, not str \"seven\"\n")
    r = _run("prepare-chat", tmp_path / "in.jsonl", "-o", tmp_path / "ds", "--config", tmp_path / "none.toml")
    assert (r.exit_code, r.stderr) == \
        (2, f"error: --config {tmp_path / 'none.toml'}: cannot read it (No such file or directory)\n")


def test_yaml_without_pyyaml_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("val_split: 0.1\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    r = _run("prepare-rl", tmp_path / "in.jsonl", "-o", tmp_path / "ds", "--config", cfg)
    assert (r.exit_code, r.stderr) == (2, f"error: --config {cfg}: reading YAML needs PyYAML: pip install "
                                          f"'sftdata[yaml]' (or write the file as TOML)\n")


def test_a_yaml_config_writes_the_same_bytes_as_the_flags(tmp_path):
    pytest.importorskip("yaml", reason="PyYAML (the yaml extra) is not installed here (the floors run has none)")
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(8)])
    (tmp_path / "run.yml").write_text("val-split: 0.25\nseed: 5\n", encoding="utf-8")
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    assert _run("prepare-chat", src, "-o", tmp_path / "a" / "ds", "-q", "--val-split", "0.25", "--seed", "5").exit_code == 0
    assert _run("prepare-chat", src, "-o", tmp_path / "b" / "ds", "-q", "--config", tmp_path / "run.yml").exit_code == 0
    assert _files(tmp_path / "a" / "ds") == _files(tmp_path / "b" / "ds")


def _options(command: str) -> list[str]:
    group = typer.main.get_command(app)
    cmd = group.get_command(typer.Context(group), command)
    return [p.opts[0] for p in cmd.params if isinstance(p, typer.core.TyperOption)]


SHARED = ["--output-dir", "--config", "--max-record-bytes", "--source-sha256", "--strict", "--overwrite", "--force",
          "--wait", "--tokenizer", "--chat-template", "--template-var"]
TAIL = ["--dedup", "--dedup-threshold", "--decontaminate", "--decontaminate-ngram", "--workers", "--memo-mb",
        "--engine", "--ray-address", "--json", "--quiet"]


def test_every_prepare_command_takes_the_declared_options_in_their_panels():
    chat_options = [*SHARED[:5], "--media-root", *SHARED[5:], "--per-reply", "--template-max-steps",
                    "--template-max-output", "--tokenizer-engine", "--allow-pad-as-stop", "--reasoning", "--train-on",
                    "--max-tokens", "--val-split", "--seed", "--shard-tokens", *TAIL]
    assert _options("prepare-chat") == _options("prepare-tool") == chat_options
    assert _options("prepare-pref") == [
        *SHARED, "--template-max-steps", "--template-max-output", "--tokenizer-engine", "--allow-pad-as-stop",
        "--reasoning", "--train-on", "--max-length", "--max-prompt-length", "--truncation", "--format", "--val-split",
        "--seed", "--shard-tokens", *TAIL]
    assert _options("prepare-rl") == [
        *SHARED, "--template-max-steps", "--template-max-output", "--tokenizer-engine", "--allow-pad-as-stop",
        "--reasoning", "--max-prompt-length", "--val-split", "--seed", "--shard-tokens", *TAIL]


def test_prepare_pref_help_shows_the_options_it_gained_and_what_they_mean_for_pairs():
    r = runner.invoke(app, ["prepare-pref", "--help"], env={"COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"})
    assert r.exit_code == 0
    lines = {line.split()[1]: line for line in r.output.splitlines() if line.startswith("│ ") and "--" in line[:8]}
    for flag in ("--template-max-steps", "--template-max-output", "--tokenizer-engine", "--memo-mb", "--source-sha256",
                 "--train-on", "--config"):
        assert flag in lines, flag
    assert "Pairs and prompts keep no memo: accepted, and unused." in lines["--memo-mb"]
    assert "Of a completion's replies (a completion with tool calls and their results has several)." in lines["--train-on"]
    assert [p for p in ("Input and output", "Tokenizer and template", "Split and shards", "Curation", "Run")
            if f"╭─ {p} " in r.output] == ["Input and output", "Tokenizer and template", "Split and shards",
                                           "Curation", "Run"]


def test_a_value_out_of_range_names_the_file_and_key_it_came_from_and_the_flag_alone_otherwise(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(4)])
    cfg = tmp_path / "run.toml"
    cfg.write_text("max_length = 1\n", encoding="utf-8")
    r = _run("prepare-pref", src, "-o", tmp_path / "ds", "--config", cfg)
    assert (r.exit_code, r.stderr) == (2, f"error: --config {cfg}: max_length: --max-length must be at least 2, got 1\n")
    r = _run("prepare-pref", src, "-o", tmp_path / "ds", "--config", cfg, "--max-length", "0")
    assert (r.exit_code, r.stderr) == (2, "error: --max-length must be at least 2, got 0\n")


@pytest.mark.parametrize("command", ["prepare-chat", "prepare-tool"])
def test_media_root_reaches_the_options_and_the_build_key_from_a_flag_or_the_config(tmp_path, monkeypatch, command):
    from sftdata.cli import prepare_cmd

    seen = []
    real = prepare_cmd.prepare
    monkeypatch.setattr(prepare_cmd, "prepare", lambda i, o, opts, progress=None, **kw: seen.append(opts.media_root)
                        or real(i, o, opts, progress=progress, **kw))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imgs").mkdir()
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    (tmp_path / "run.toml").write_text('media-root = "imgs"\n')
    runs = {"flag": ["--media-root", "imgs"], "config": ["--config", "run.toml"], "none": []}
    for name, args in runs.items():
        assert _run(command, src, "-o", name, "-j", "1", "-q", *args).exit_code == 0
    assert seen == ["imgs", "imgs", None]
    options = {name: json.loads((tmp_path / name / "dataset_metadata.json").read_text())["options"] for name in runs}
    assert options["flag"] == options["config"] == {**options["none"], "media_root": "imgs"}
    assert "media_root" not in options["none"]  # a run without it keeps its earlier bytes and key
    keys = {name: json.loads((tmp_path / name / "dataset_metadata.json").read_text())["build"]["key"] for name in runs}
    assert keys["flag"] == keys["config"] != keys["none"]


def test_a_media_root_that_is_no_folder_is_one_line_with_exit_code_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    r = _run("prepare-chat", src, "-o", "ds", "--media-root", "nope")
    assert (r.exit_code, r.stderr) == (2, "error: --media-root nope: no such folder; give the folder that relative "
                                          "image and video paths in the records are read from\n")
    assert not (tmp_path / "ds").exists()
