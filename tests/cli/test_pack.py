"""``sftdata pack`` through the command line."""

from __future__ import annotations

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.store import open_dataset

runner = CliRunner()


def test_pack_json_prints_only_the_report(source, tmp_path):  # noqa: F811
    res = runner.invoke(app, ["pack", str(source), "-o", str(tmp_path / "p"), "--block-size", "255", "--json"])
    assert res.exit_code == 0, res.output
    rep = orjson.loads(res.stdout)
    assert rep["strategy"] == "bfd" and rep["row_len"] == 256 and rep["pad_id"] == 100257
    train = rep["splits"]["train"]
    ds = open_dataset(tmp_path / "p")
    assert train["rows"] == ds.split("train").num_rows
    assert set(train) >= {"fill", "padding_fill", "lower_bound_rows", "bound_ratio", "overlong_episodes",
                          "trained_lost", "tokens_lost", "padding_rows"}
    assert train["fill"] > train["padding_fill"]


def test_pack_table_and_stream_options(source, tmp_path):  # noqa: F811
    res = runner.invoke(app, ["pack", str(source), "-o", str(tmp_path / "s"), "-b", "63", "--strategy", "stream",
                              "--pad-id", "0", "--seed", "9"])
    assert res.exit_code == 0, res.output
    for label in ("fill (real tokens / capacity)", "padding baseline: fill", "lower bound on rows",
                  "injected tokens", "conversations stopped", "trained tokens lost"):
        assert label in res.output
    meta = open_dataset(tmp_path / "s").packing
    assert (meta["strategy"], meta["pad_token_id"], meta["block_size"]) == ("stream", 0, 63)


@pytest.mark.parametrize("args, code, message", [
    (["--strategy", "ffd"], 2, "--strategy must be one of bfd, stream"),
    (["--overlong", "keep"], 2, "--overlong must be one of truncate, keep_end, split, drop, not 'keep'"),
    (["--block-size", "0"], 2, "--block-size must be at least 3 (a row of 4 tokens"),
    (["--block-size", "2"], 2, "--block-size must be at least 3 (a row of 4 tokens, <|USER|> <|END|> "
                               "<|ASSISTANT|> <|END|>, is the smallest that can train a reply), got 2"),
    (["--pad-id", "-1"], 2, "--pad-id -1 is not a token id"),
])
def test_pack_usage_errors(source, tmp_path, args, code, message):  # noqa: F811
    res = runner.invoke(app, ["pack", str(source), "-o", str(tmp_path / "x"), *args])
    assert res.exit_code == code
    assert res.output.startswith(f"error: {message}")  # the message alone: no progress bar drawn before it
    assert not (tmp_path / "x").exists()


def test_pack_dataset_errors_exit_1(source, tmp_path):  # noqa: F811
    res = runner.invoke(app, ["pack", str(tmp_path / "nope"), "-o", str(tmp_path / "x"), "-q"])
    assert res.exit_code == 1 and "does not exist" in " ".join(res.output.split())
    assert "Traceback" not in res.output
    runner.invoke(app, ["pack", str(source), "-o", str(tmp_path / "p"), "-q"])
    res = runner.invoke(app, ["pack", str(source), "-o", str(tmp_path / "p"), "-q", "-b", "64"])
    assert res.exit_code == 1 and "already exists and is not up to date" in " ".join(res.output.split())
    res = runner.invoke(app, ["pack", str(tmp_path / "p"), "-o", str(tmp_path / "pp"), "-q"])
    assert res.exit_code == 1 and "is a 'packed' dataset" in " ".join(res.output.split())
