"""A reader that opens a dataset while a writer replaces it reads the old dataset or the
new one, never a mix: ``scan_dataset`` (what ``open_dataset`` and every reader start with)
notices that the dataset was replaced under it (a generation check: the folder's and the
metadata's identity before and after) and reads it again, a bounded number of times."""

from __future__ import annotations

import orjson
import pytest

import sftdata.store.reader as reader
from sftdata.errors import DatasetError
from sftdata.prepare import prepare
from sftdata.store import METADATA_FILE, scan_dataset
from sftdata.store.reader import GENERATION_TRIES
from tests.helpers.replace import OLD, replace_inside, two_inputs


def _episodes(meta: dict) -> dict[str, int]:
    return {split: info["episodes"] for split, info in meta["splits"].items()}


def test_a_scan_during_a_replacement_reads_the_new_dataset_whole(tmp_path, monkeypatch):
    few, many = two_inputs(tmp_path)
    ds = tmp_path / "ds"
    prepare([few], ds, OLD)
    old = orjson.loads((ds / METADATA_FILE).read_bytes())
    replaced = replace_inside(monkeypatch, reader, "_open_splits", ds, many)  # metadata read, files not yet
    scan = scan_dataset(ds)
    new = orjson.loads((ds / METADATA_FILE).read_bytes())
    assert replaced == [True] and _episodes(new) != _episodes(old)
    assert scan.problems == []
    assert scan.dataset.metadata == new
    assert {name: sp.num_items for name, sp in scan.dataset.splits.items()} == _episodes(new)


def test_a_dataset_replaced_at_every_read_is_refused_after_a_bounded_number_of_tries(tmp_path, monkeypatch):
    few, many = two_inputs(tmp_path)
    ds = tmp_path / "ds"
    prepare([few], ds, OLD)
    replace_inside(monkeypatch, reader, "_open_splits", ds, many, times=GENERATION_TRIES)
    with pytest.raises(DatasetError, match=rf"^{ds} was replaced {GENERATION_TRIES} times while it was being read "
                                           rf"\(another sftdata keeps writing it\); read it once that run has "
                                           rf"finished$"):
        scan_dataset(ds)
