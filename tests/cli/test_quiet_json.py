"""`-q` / `--quiet` and `--json` mean the same on every command of the app (the list is the
app's own, never written here): `-q` prints nothing but errors (no progress, table, note or
warning), `--json` prints one JSON document on stdout and nothing else there, and both
are the one declaration of sftdata/cli/options.py."""

from __future__ import annotations

import itertools
import json
import shutil
import typing

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.cli.options import JsonOpt, QuietOpt
from tests.helpers.audit import shard
from tests.helpers.paths import ROOT

runner = CliRunner()
GROUP = typer.main.get_command(app)
NAMES = GROUP.list_commands(typer.Context(GROUP))
CONFIG = ROOT / "configs/sft/tiny.json"


def _run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    return r


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The datasets the recipes read: two episodes datasets (chat, tool), a pack of one, their mixture."""
    d = tmp_path_factory.mktemp("made")
    for args in (["prepare-chat", ROOT / "sample_data/chat.jsonl", "-o", d / "chat", "--val-split", "0.1", "-j", "1"],
                 ["prepare-tool", ROOT / "sample_data/tools.jsonl", "-o", d / "tool", "-j", "1"],
                 ["pack", d / "chat", "-o", d / "packed", "-b", "64"],
                 ["mix", f"{d / 'chat'}:0.8", f"{d / 'tool'}:0.2", "-o", d / "mix.json"]):
        assert _run(*args, "-q").exit_code == 0
    return d


_fresh = itertools.count()


def recipe(name: str, d, tmp) -> list:
    """A run of command ``name`` that prints (without -q) progress, a table, a warning or a
    result; every output folder is new."""
    out = tmp / f"out{next(_fresh)}"
    recipes = {
        "prepare-chat": ["prepare-chat", ROOT / "sample_data/chat.jsonl", "-o", out, "-j", "1"],
        "prepare-tool": ["prepare-tool", ROOT / "sample_data/tools.jsonl", "-o", out, "-j", "1"],
        "prepare-pref": ["prepare-pref", ROOT / "sample_data/pairs.jsonl", "-o", out, "-j", "1"],
        "prepare-rl": ["prepare-rl", ROOT / "sample_data/rl_prompts.jsonl", "-o", out, "-j", "1"],
        # block size 24 loses more than 1% of the trained tokens: a warning (issue 44: -q printed it)
        "pack": ["pack", d / "chat", "-o", out, "-b", "24"],
        "mix": ["mix", f"{d / 'chat'}:0.5", f"{d / 'tool'}:0.5", "-o", tmp / f"mix{next(_fresh)}.json"],
        "export": ["export", d / "packed", "-o", out, "--format", "jsonl"],
        "inspect": ["inspect", d / "chat"],
        "report": ["report", d / "chat", "-o", tmp / f"r{next(_fresh)}.html", "--sample", "1"],
        "verify": ["verify", d / "mix.json"],
        "replay-order": ["replay-order", d / "chat", "--config", CONFIG, "--step", "1"],
        "clean": ["clean", d],
    }
    assert name in recipes, f"add a run of `sftdata {name}` to this test's recipes"
    return recipes[name]


def _option(command, flag: str):
    return next(p for p in command.params if flag in getattr(p, "opts", ()))


@pytest.mark.parametrize("name", NAMES)
def test_every_command_declares_quiet_and_json_once(name):
    """The one declaration of options.py, as the parameter app.quiet_output reads."""
    command = GROUP.commands[name]
    for opts, alias, param in ((["--json"], JsonOpt, "as_json"), (["--quiet", "-q"], QuietOpt, "quiet")):
        option = _option(command, opts[0])
        assert (option.name, option.opts, option.help, option.is_flag) == \
            (param, opts, typing.get_args(alias)[1].help, True), name


def test_parsing_a_command_line_silences_nothing(made):
    """Only a command that runs is quiet: its line parsed alone (help examples) changes no output."""
    GROUP.commands["inspect"].make_context("inspect", [str(made / "chat"), "-q", "--json"])
    r = _run("inspect", made / "chat")
    assert r.exit_code == 0 and f"{made / 'chat'}" in r.stdout


@pytest.mark.parametrize("name", NAMES)
def test_quiet_prints_nothing_and_json_one_document(name, made, tmp_path):
    loud = _run(*recipe(name, made, tmp_path))
    assert loud.exit_code == 0, loud.output
    assert loud.output.strip()  # there is something for -q to silence
    r = _run(*recipe(name, made, tmp_path), "-q")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
    r = _run(*recipe(name, made, tmp_path), "--quiet")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
    r = _run(*recipe(name, made, tmp_path), "--json")
    assert r.exit_code == 0, r.output
    assert isinstance(json.loads(r.stdout), dict) and r.stdout.endswith("}\n")  # one document, nothing after it
    r = _run(*recipe(name, made, tmp_path), "--json", "-q")
    assert r.exit_code == 0 and r.stderr == ""
    assert isinstance(json.loads(r.stdout), dict)


def test_pack_quiet_drops_the_warning_it_prints_otherwise(made, tmp_path):
    r = _run(*recipe("pack", made, tmp_path), "--json")
    assert r.stderr.startswith("warning: train: pack loses ") and r.stderr.count("\n") == 1
    assert json.loads(r.stdout)["warnings"] == [r.stderr[len("warning: "):-1]]
    r = _run(*recipe("pack", made, tmp_path), "--json", "-q")
    assert r.stderr == "" and len(json.loads(r.stdout)["warnings"]) == 1


def test_quiet_still_prints_errors(made, tmp_path):
    r = _run("inspect", tmp_path / "nope", "-q")
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == (f"error: dataset folder {tmp_path / 'nope'} does not exist; check the path, or make the "
                        f"dataset with `sftdata prepare-chat INPUT --output-dir {tmp_path / 'nope'}`\n")
    r = _run("mix", f"{made / 'chat'}:x", "-o", tmp_path / "m.json", "-q")
    assert (r.exit_code, r.stderr) == (2, f"error: '{made / 'chat'}:x': the weight 'x' is not a number "
                                          f"(DATASET:WEIGHT, e.g. data/chat:0.8)\n")
    after = _run("inspect", made / "chat")  # the next command prints again
    assert after.exit_code == 0 and "chat" in after.stdout


def test_verify_quiet_says_a_failure_in_one_error_line(made, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(made / "chat", ds)
    p = shard(ds) / "mask.bin"
    m = np.fromfile(p, dtype=np.uint8)
    m[0] ^= 1
    m.tofile(p)
    loud = _run("verify", ds)
    assert loud.exit_code == 1 and "FAILED" in loud.stdout
    r = _run("verify", ds, "-q")
    assert (r.exit_code, r.stdout) == (1, "")
    problems = json.loads(_run("verify", ds, "--json").stdout)["problems"]
    p = problems[0]
    where = f"{p['file']} ({p['where']})" if p["where"] else p["file"]
    assert r.stderr == (f"error: {ds}: verify found {len(problems)} problem(s); the first: [{p['check']}] {where}: "
                        f"{p['message']}. To fix: {p['fix']}; `sftdata verify {ds}` without --quiet lists them all\n")


def test_replay_order_csv_is_printed_under_quiet(made):
    r = _run("replay-order", made / "chat", "--config", CONFIG, "--csv", "-q")
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout == _run("replay-order", made / "chat", "--config", CONFIG, "--csv").stdout
    assert r.stdout.splitlines()[0] == "epoch,position,episode,shard,length,record,step,rank,slot"
