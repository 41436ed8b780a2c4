"""`sftdata verify` through Typer's CliRunner: report, --json, --quick, exit codes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.verify import CHECKS
from tests.helpers.audit import make_dataset, shard, to_flat

runner = CliRunner()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("cli"))


@pytest.fixture
def ds(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "ds")
    return tmp_path / "ds"


def run(*args):
    return runner.invoke(app, ["verify", *map(str, args)])


def test_clean_dataset_exits_0(ds):
    r = run(ds)
    assert r.exit_code == 0, r.output
    for name in CHECKS:
        assert f"│ {name}" in r.output
    assert r.output.count("✓ ok") == len(CHECKS) - 1  # media: skipped, a text dataset
    assert "OK: no problem found" in r.output


def test_broken_dataset_exits_1_with_file_where_and_fix(ds):
    p = shard(ds) / "mask.bin"
    m = np.fromfile(p, dtype=np.uint8)
    m[6] = 1
    m.tofile(p)
    r = run(ds)
    assert r.exit_code == 1
    out = r.output
    assert "✗ failed (1)" in out and "FAILED: 5 problem(s)" in out  # counts x2, mask_rule, stops, checksums
    assert "✗ [mask_rule] train/shard_00000/mask.bin (episode 0 of train, byte 6 of mask.bin)" in out
    assert "trains 1 token(s) the mask rule leaves untrained (first: token 6, in a <|USER|> span)" in out
    assert "fix: this mask was not made by sftdata's mask rule" in out


def test_json_report(ds):
    r = run(ds, "--json")
    assert r.exit_code == 0
    rep = json.loads(r.stdout)
    assert rep["ok"] is True and [c["status"] for c in rep["checks"]] == \
        ["skipped" if c == "media" else "ok" for c in CHECKS]
    (shard(ds, "val") / "sources.idx").unlink()
    r = run(ds, "--json")
    assert r.exit_code == 1
    rep = json.loads(r.stdout)
    assert rep["ok"] is False
    assert [(p["check"], p["file"]) for p in rep["problems"]] == [("files", "val/shard_00000/sources.idx")]


def test_quick_skips_checksums(ds):
    p = shard(ds) / "tokens.bin"
    b = bytearray(p.read_bytes())
    b[15 * 4] ^= 1
    p.write_bytes(bytes(b))
    r = run(ds, "--quick")
    assert r.exit_code == 0 and "– skipped (--quick)" in r.output
    r = run(ds)
    assert r.exit_code == 1 and "[checksums] train/shard_00000/tokens.bin" in r.output


def test_quiet_prints_nothing_when_clean(ds):
    r = run(ds, "--quiet")
    assert r.exit_code == 0 and r.output == ""


def test_not_a_dataset_exits_1(tmp_path):
    r = run(tmp_path)
    assert r.exit_code == 1 and "holds no dataset" in r.output


def test_flat_layout_notes_and_tokenizer(ds, tmp_path):
    flat = to_flat(ds, tmp_path / "flat")
    r = run(flat)
    assert r.exit_code == 0 and "note: older flat layout" in r.output
    assert "– skipped (tokenizer unknown)" in r.output
    r = run(flat, "--tokenizer", "cl100k_base")
    assert r.exit_code == 0 and "checked with --tokenizer cl100k_base" in r.output


def test_packed_dataset(tmp_path):
    from tests.helpers.audit import make_packed

    packed = make_packed(tmp_path, "bfd", block_size=63, shard_tokens=128)
    r = run(packed)
    assert r.exit_code == 0, r.output
    for name in ("rows", "segments", "references", "padding"):
        assert f"│ {name}" in r.output
    seg = np.fromfile(shard(packed) / "segments.idx", dtype="<u8").reshape(-1, 7)
    seg[1, 1] = 30
    seg.tofile(shard(packed) / "segments.idx")
    r = run(packed, "--quick")
    assert r.exit_code == 1
    assert "✗ [segments] train/shard_00000/segments.idx (row 0 of train, segment 1, byte 56 of segments.idx)" in r.output
