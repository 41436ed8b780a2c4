"""``verify`` of a dataset that a writer replaces while it runs (after the metadata was
read, half-way through the shards) reports the new dataset, clean: it notices the
replacement (the store's generation check) and verifies again, so it never reports damage
that is not there."""

from __future__ import annotations

import orjson

import sftdata.verify.run as verify_run
from sftdata.prepare import prepare
from sftdata.store import METADATA_FILE
from sftdata.verify import verify
from tests.helpers.replace import OLD, replace_inside, two_inputs


def test_verify_during_a_replacement_reports_the_new_dataset_clean(tmp_path, monkeypatch):
    few, many = two_inputs(tmp_path)
    ds = tmp_path / "ds"
    prepare([few], ds, OLD)
    replaced = replace_inside(monkeypatch, verify_run, "check_shard", ds, many)  # mid-way through the shards
    report = verify(ds)
    assert replaced == [True]
    assert report.ok, [str(p) for p in report.problems]
    new = orjson.loads((ds / METADATA_FILE).read_bytes())
    assert {split: v["episodes"] for split, v in report.splits.items()} == {
        split: info["episodes"] for split, info in new["splits"].items()}
