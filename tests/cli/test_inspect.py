"""`sftdata inspect` through Typer's CliRunner: overview, episode render, --json, exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sftdata import report
from sftdata.cli import app
from tests.helpers.audit import make_dataset, make_packed, to_flat

runner = CliRunner()


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("cli"), bad_lines=2)


def run(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def test_overview(ds):
    r = run("inspect", ds, "--block-size", 20)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "sftdata format v1 · kind episodes · layout sharded · tokens uint32" in out
    assert "│ train │        6 │    146 │" in out and "│ val   │        2 │     33 │" in out
    assert "train: episodes by length (tokens)" in out and "train: episodes by trained share" in out
    assert "train at --block-size 20: 4 episodes (66.7%) are longer than 21 tokens" in out
    assert "rejected records: 2" in out and "invalid_json: 2" in out
    assert "sha256 " + report.overview(ds).sources[0]["sha256"] in out.replace("\n", "")


def test_overview_json_is_the_library_overview(ds):
    r = run("inspect", ds, "--json", "--block-size", 20)
    assert r.exit_code == 0
    assert json.loads(r.stdout) == json.loads(json.dumps(report.overview(ds, block_size=20).as_dict()))


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
    assert [e["episode"] for e in json.loads(r.stdout)["episodes"]] == report.sample_ids(6, 2, 5)


@pytest.mark.parametrize("args, message", [
    (["--tokens"], "--tokens needs --episode, --row, --record or --sample"),
    (["--episode", "0", "--sample", "2"], "give exactly one of --episode, --row, --record or --sample"),
    (["--episode", "0", "--block-size", "8"], "--block-size applies to the overview"),
])
def test_usage_errors_exit_2(ds, args, message):
    r = run("inspect", ds, *args)
    assert r.exit_code == 2 and message in r.output


def test_dataset_errors_exit_1(ds, tmp_path):
    r = run("inspect", tmp_path / "missing")
    assert r.exit_code == 1 and "does not exist" in r.output
    r = run("inspect", ds, "--record", 8)
    assert r.exit_code == 1 and "rejected at prepare time (invalid_json" in " ".join(r.output.split())
    r = run("inspect", ds, "--episode", 60)
    assert r.exit_code == 1 and "episode 60 does not exist" in r.output


def test_flat_layout(ds, tmp_path):
    flat = to_flat(ds, tmp_path / "flat")
    r = run("inspect", flat)
    assert r.exit_code == 0 and "older flat layout" in r.output
    r = run("inspect", flat, "--episode", 0)
    assert r.exit_code == 0 and "⟦<|ASSISTANT|>Paris.<|END|>⟧" in r.output
    assert "decoded with cl100k_base" in r.output


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return make_packed(tmp_path_factory.mktemp("cli_packed"), "bfd", block_size=63, shard_tokens=128)


def test_packed_overview_and_row(packed):
    r = run("inspect", packed)
    assert r.exit_code == 0, r.output
    assert "packed (bfd): --block-size 63, rows of 64 tokens, --overlong truncate, pad id 100257" in r.output
    assert "│ rows " in r.output and "│ fill " in r.output and "segments per row: train min 1 median 2 max 3" in r.output
    r = run("inspect", packed, "--row", 0, env={"NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    out = r.output.splitlines()
    assert out[1] == ("train row 0 · shard_00000 · 2 segment(s), 53 real tokens, 11 padding of 64 · "
                      f"{sum(s.trained_tokens for s in report.views(packed, rows=[0])[0][0].segments)} trained")
    assert out[2].startswith("segment 0 · offset 0, positions 0–27 · episode 1, input record 1, its tokens from 0")
    assert "segment 1 · offset 28, positions 0–24 · episode 5, input record 5" in r.output
    assert any(line.startswith("⟦<|ASSISTANT|>") and line.endswith("<|END|>⟧") for line in out)
    assert out[-1] == "padding: 11 × id 100257 at offsets 53–63 (seq_id -1, mask 0)"
    r = run("inspect", packed, "--row", 0, "--tokens")
    rows = [line for line in r.output.splitlines() if "│" in line]
    assert len(rows) == 64 and rows[28].split("│")[3].strip() == "1" and rows[28].split("│")[4].strip() == "0"
    r = run("inspect", packed, "--row", 3, "--json")
    (row,) = json.loads(r.stdout)["rows"]
    assert [s["offset"] for s in row["segments"]] == [0, 19, 37] and row["padding"] == 12


def test_packed_usage_errors(packed):
    r = run("inspect", packed, "--episode", 0)
    assert r.exit_code == 2 and "a packed dataset holds rows: use --row R" in r.output
    r = run("inspect", packed, "--block-size", 100)
    assert r.exit_code == 2 and "--block-size applies to episodes datasets" in r.output
