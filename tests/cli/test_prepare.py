import ast
import json
import re
from types import SimpleNamespace

from typer.testing import CliRunner

from sftdata import __version__
from sftdata.cli import app
from sftdata.cli.app import RateColumn, per_second
from sftdata.options.declared import taken_by
from tests.helpers.data import chat, write_jsonl
from tests.helpers.paths import ROOT

runner = CliRunner()


def test_prepare_chat_prints_a_summary_and_writes_the_dataset(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q1", "a1"), chat("q2", "a2"), "oops"])
    r = runner.invoke(app, ["prepare-chat", str(src), "--output-dir", str(tmp_path / "ds"), "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "records read" in r.output and "rejected: invalid_json" in r.output
    assert (tmp_path / "ds" / "dataset_metadata.json").is_file()


def test_prepare_chat_json(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(10)])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--val-split", "0.2",
                            "--json", "-j", "1"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["episodes"] == {"train": 8, "val": 2}
    assert out["records_read"] == 10 and out["rejected_total"] == 0


def test_errors_are_red_messages_with_exit_codes(tmp_path):
    r = runner.invoke(app, ["prepare-chat", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "ds")])
    assert r.exit_code == 1
    assert "error: input file" in r.output and "does not exist" in r.output
    assert "Traceback" not in r.output
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a"), "{bad"])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--strict", "-j", "1"])
    assert r.exit_code == 1
    assert "in.jsonl:line 2: not valid JSON" in r.output.replace("\n", "")
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--val-split", "2"])
    assert r.exit_code == 2 and "--val-split must be a fraction" in r.output


def test_version_and_help():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"sftdata {__version__}"
    r = runner.invoke(app, ["prepare-chat", "--help"])
    assert r.exit_code == 0 and "--val-split" in r.output and "--max-tokens" in r.output


def test_chat_script_has_the_seed_interface(tmp_path, capsys):
    import importlib.util

    path = ROOT / "scripts" / "prepare_chat_sft.py"
    spec = importlib.util.spec_from_file_location("prepare_chat_sft", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(10)] + ["{}"])
    assert mod.main(["--input", str(src), "--output_dir", str(tmp_path / "ds"), "--val_split", "0.2",
                     "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "train 8 episodes" in out and "val 2 episodes" in out and "11 records read, 1 rejected: no_messages 1" in out
    assert mod.main(["--input", str(src), "--output_dir", str(tmp_path / "ds"), "--val_split", "0.2"]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path / 'ds'}: up to date (build key ")
    assert mod.main(["--input", str(src), "--output_dir", str(tmp_path / "ds")]) == 1
    assert ("already exists and is not up to date: the option --val_split changed (0.2 -> 0.0). Pass --overwrite "
            "to rebuild it, or choose another --output_dir") in capsys.readouterr().err


def test_a_val_split_that_rounds_to_zero_is_warned(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(34)])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--val-split", "0.0001",
                            "-j", "1", "--json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["episodes"] == {"train": 34, "val": 0}
    assert r.stderr == ("warning: --val-split 0.0001 of 34 episodes rounds to 0: the val split is empty; use "
                        "--val-split 0.015 or more for at least one val episode, or leave it out for no val split\n")
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds2"), "--val-split", "0.015",
                            "-j", "1", "--json"])
    assert json.loads(r.stdout)["episodes"] == {"train": 33, "val": 1} and r.stderr == ""


def test_more_workers_than_cores_are_capped_with_a_warning(tmp_path, monkeypatch):
    from sftdata.cli import prepare_cmd
    from sftdata.prepare import driver

    monkeypatch.setattr(driver, "default_workers", lambda: 1)
    seen = []
    real = prepare_cmd.prepare
    monkeypatch.setattr(prepare_cmd, "prepare", lambda i, o, opts, progress=None, **kw: seen.append(opts.workers)
                        or real(i, o, opts, progress=progress, **kw))
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--workers", "1000", "--json"])
    assert r.exit_code == 0 and seen == [1]
    assert r.stderr == "warning: --workers 1000: this machine gives sftdata 1 core(s); using 1\n"
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds2"), "--workers", "1000", "-q"])
    assert r.exit_code == 0 and seen == [1, 1] and r.output == ""


def test_chat_script_errors_are_one_line(tmp_path, capsys):
    import importlib.util

    path = ROOT / "scripts" / "prepare_chat_sft.py"
    spec = importlib.util.spec_from_file_location("prepare_chat_sft", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    (tmp_path / "afile").write_text("x")
    assert mod.main(["--input", str(src), "--output_dir", str(tmp_path / "afile" / "ds"), "--workers", "1"]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'afile'}: File exists\n"


def test_the_summary_labels_are_never_wrapped(tmp_path):
    lead = {"messages": [{"role": "assistant", "content": "Hi."}, {"role": "user", "content": "q"},
                         {"role": "assistant", "content": "a"}]}
    src = write_jsonl(tmp_path / "in.jsonl", [lead, chat("q", "a")])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "-j", "1"])
    assert r.exit_code == 0
    rows = [line.split("│")[1].strip() for line in r.stderr.splitlines() if line.startswith("│")]
    assert rows[-3:] == ["repaired: leading_assistant_untrained", "time", "speed"]


def test_a_utf8_byte_order_mark_is_skipped(tmp_path):
    """Windows tools write one at the start of a file; the first record is not invalid JSON."""
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.jsonl").write_bytes(bom + (json.dumps(chat("q", "a")) + "\n").encode() * 2)
    (tmp_path / "b.json").write_bytes(bom + json.dumps([chat("q", "a")]).encode())
    for name in ("a.jsonl", "b.json"):
        r = runner.invoke(app, ["prepare-chat", str(tmp_path / name), "-o", str(tmp_path / f"{name}.ds"), "--json",
                                "-j", "1"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert (out["records_read"], out["rejected_total"]) == ((2, 0) if name == "a.jsonl" else (1, 0))


def test_chat_script_draws_the_progress_bar_on_stderr_unless_quiet(tmp_path, capsys):
    import importlib.util

    path = ROOT / "scripts" / "prepare_chat_sft.py"
    spec = importlib.util.spec_from_file_location("prepare_chat_sft", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(4)])
    assert mod.main(["--input", str(src), "--output_dir", str(tmp_path / "a"), "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("prepare-chat ━") and " 100% " in err
    assert mod.main(["--input", str(src), "--output_dir", str(tmp_path / "b"), "--workers", "1", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_the_scripts_use_library_functions_only():
    """scripts/ sit above the library like the CLI, beside it: no import of sftdata.cli."""
    scripts = ROOT / "scripts"
    for name in ("prepare_sft_common.py", "prepare_chat_sft.py", "prepare_tool_sft.py"):
        tree = ast.parse((scripts / name).read_text(encoding="utf-8"))
        mods = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "sftdata.prepare" in mods or name != "prepare_sft_common.py"
        assert not [m for m in mods if m.startswith("sftdata.cli")], name


def test_source_sha256_records_the_whole_file_sha256_of_a_large_input_read_in_ranges(tmp_path, monkeypatch):
    import hashlib

    import sftdata.sources.partitions as partitions

    monkeypatch.setattr(partitions, "WHOLE_SHA256_BYTES", 100)  # "large": over 100 bytes
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i}", f"answer {i}") for i in range(50)])
    for name, flag in (("plain", []), ("asked", ["--source-sha256"])):
        r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / name), "-j", "2", "-q", *flag])
        assert r.exit_code == 0, r.output
    plain, asked = (json.loads((tmp_path / n / "dataset_metadata.json").read_text()) for n in ("plain", "asked"))
    assert plain["sources"][0]["sha256"] is None and "source_sha256" not in plain["options"]
    assert asked["sources"][0]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert asked["options"]["source_sha256"] is True
    assert asked["sources"][0]["block_sha256"] == plain["sources"][0]["block_sha256"]


def test_the_progress_rate_reads_at_any_size():
    assert [per_second(n, "tokens") for n in (0, 12.4, 9_999, 38_240, 999_949, 999_999, 1_254_000)] == \
        ["0 tokens/s", "12 tokens/s", "9,999 tokens/s", "38.2k tokens/s", "999.9k tokens/s", "1.00M tokens/s", "1.25M tokens/s"]
    column = RateColumn()
    task = SimpleNamespace(elapsed=2.0, fields={"records": 42, "tokens": 3_000})
    assert column.render(task).plain == "21 records/s  1,500 tokens/s"
    task.fields["tokens"] = None  # a task that counts no tokens shows none (prepare-pref: never "0.00M tok/s")
    assert column.render(task).plain == "21 records/s"


def test_prepare_pref_progress_shows_records_per_second_not_a_zero_token_rate(tmp_path):
    r = runner.invoke(app, ["prepare-pref", str(ROOT / "sample_data/pairs.jsonl"), "-o", str(tmp_path / "p"), "-j", "1"])
    assert r.exit_code == 0, r.output
    bar = r.stderr.splitlines()[0]
    assert re.fullmatch(r"prepare-pref ━+ 100% [\d,.]+k? records/s [\d:]+ [\d:-]+", bar), bar


def test_the_scripts_take_the_declared_options_underscored_and_name_them_so_in_errors(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("prepare_tool_sft", ROOT / "scripts" / "prepare_tool_sft.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        mod.main(["--help"])
    except SystemExit:
        pass
    shown = set(re.findall(r"(--[a-z_0-9]+)", capsys.readouterr().out))
    declared = {"--" + o.flags[0][2:].replace("-", "_") for o in taken_by("prepare-tool") if o.flags and o.field}
    assert shown == declared | {"--help", "--input", "--output_dir", "--json", "--quiet"}
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    assert mod.main(["--input", str(src), "--output_dir", str(tmp_path / "ds"), "--template_max_steps", "0"]) == 2
    assert capsys.readouterr().err == "error: --template_max_steps must be positive, got 0\n"
