"""`sftdata inspect` through Typer's CliRunner: overview, episode render, --json, exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from audit_data import make_dataset, to_flat
from sftdata import inspect as sft_inspect
from sftdata.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("cli"), bad_lines=2)


def run(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200", **(env or {})})


def test_overview(ds):
    r = run("inspect", ds, "--block-size", 20)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "sftdata format v1 · kind episodes · layout sharded · tokens uint32" in out
    assert "│ train │        6 │    146 │" in out and "│ val   │        2 │     33 │" in out
    assert "train: episodes by length (tokens)" in out and "train: episodes by trained share" in out
    assert "train at --block-size 20: 4 episodes (66.7%) are longer than 21 tokens" in out
    assert "rejected records: 2" in out and "invalid_json: 2" in out
    assert "sha256 " + sft_inspect.overview(ds).sources[0]["sha256"] in out.replace("\n", "")


def test_overview_json_is_the_library_overview(ds):
    r = run("inspect", ds, "--json", "--block-size", 20)
    assert r.exit_code == 0
    assert json.loads(r.stdout) == json.loads(json.dumps(sft_inspect.overview(ds, block_size=20).as_dict()))


def test_episode_render_marks_trained_text_without_colour(ds):
    r = run("inspect", ds, "--episode", 0, env={"NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[1].startswith("train episode 0 · input record 0 · shard_00000 tokens [0, 19) · 19 tokens, 4 trained")
    assert lines[2:6] == ["<|SYSTEM|>Be brief.<|END|>", "<|USER|>What is the capital of France?<|END|>",
                          "⟦<|ASSISTANT|>Paris.<|END|>⟧", "<|EOS|>"]
    assert "\x1b[" not in r.output


def test_episode_token_table(ds):
    r = run("inspect", ds, "-e", 0, "--tokens")
    assert r.exit_code == 0
    rows = [line for line in r.output.splitlines() if "│" in line]
    assert len(rows) == 19
    assert [int(row.split("│")[0]) for row in rows if "✓" in row] == [14, 15, 16, 17]
    assert "'Paris'" in rows[15] and "assistant" in rows[15]
    assert "<|USER|>" in rows[5] and "'What'" in rows[6]


def test_record_and_sample_json(ds):
    r = run("inspect", ds, "--record", 6, "--json")
    assert r.exit_code == 0
    (ep,) = json.loads(r.stdout)["episodes"]
    assert (ep["split"], ep["episode"], ep["record"]) == ("val", 1, 6)
    r = run("inspect", ds, "--sample", 2, "--seed", 5, "--json")
    assert [e["episode"] for e in json.loads(r.stdout)["episodes"]] == sft_inspect.sample_ids(6, 2, 5)


@pytest.mark.parametrize("args, message", [
    (["--tokens"], "--tokens needs --episode, --record or --sample"),
    (["--episode", "0", "--sample", "2"], "give exactly one of --episode, --record or --sample"),
    (["--episode", "0", "--block-size", "8"], "--block-size applies to the overview"),
])
def test_usage_errors_exit_2(ds, args, message):
    r = run("inspect", ds, *args)
    assert r.exit_code == 2 and message in r.output


def test_dataset_errors_exit_1(ds, tmp_path):
    r = run("inspect", tmp_path / "missing")
    assert r.exit_code == 1 and "does not exist" in r.output
    r = run("inspect", ds, "--record", 8)
    assert r.exit_code == 1 and "rejected at prepare time (invalid_json" in r.output.replace("\n", " ")
    r = run("inspect", ds, "--episode", 60)
    assert r.exit_code == 1 and "episode 60 does not exist" in r.output


def test_flat_layout(ds, tmp_path):
    flat = to_flat(ds, tmp_path / "flat")
    r = run("inspect", flat)
    assert r.exit_code == 0 and "older flat layout" in r.output
    r = run("inspect", flat, "--episode", 0)
    assert r.exit_code == 0 and "⟦<|ASSISTANT|>Paris.<|END|>⟧" in r.output
    assert "decoded with cl100k_base" in r.output
