"""Reading pairs, KTO rows and RL prompts (format_version 2): the rows of a split, and the
refusals of a dataset whose kind, version or shards are wrong."""

from __future__ import annotations

import re

import numpy as np
import orjson
import pytest

from sftdata.errors import DatasetError
from sftdata.storage import METADATA_FILE
from sftdata.store import open_dataset
from sftdata.store.format import METADATA_CHECKSUM, dumps_json, metadata_sha256
from sftdata.store.reader import refuse_row_kind
from sftdata.store.rows import RowSplit, row_split
from tests.helpers.pairs import PAIR_LENGTHS, sequence, write_rows


def edit_metadata(root, **changes) -> None:
    meta = orjson.loads((root / METADATA_FILE).read_bytes())
    meta.update(changes)
    meta[METADATA_CHECKSUM]["sha256"] = metadata_sha256(meta)
    (root / METADATA_FILE).write_bytes(dumps_json(meta))


def test_a_pairs_dataset_is_format_version_2_and_reads_as_rows_of_three_entries(tmp_path):
    root = write_rows(tmp_path / "p", "pairs", PAIR_LENGTHS, rows_per_shard=4)
    assert orjson.loads((root / METADATA_FILE).read_bytes())["format_version"] == 2
    ds = open_dataset(root)
    assert (ds.kind, ds.entries) == ("pairs", 3)
    rs = row_split(ds, "train")
    assert isinstance(rs, RowSplit) and rs.num_rows == 9
    assert rs.part_lengths.tolist() == [list(x) for x in PAIR_LENGTHS]
    assert rs.sequence_lengths.tolist() == [[p + c, p + r] for p, c, r in PAIR_LENGTHS]
    assert rs.records.tolist() == [10 + 2 * r for r in range(9)]
    assert rs.entry_ids([0, 5]).tolist() == [[0, 1, 2], [15, 16, 17]]
    toks, mask = rs.sequence(5, 1)  # the second pair of the second shard
    want_t, want_m = sequence(5, 1, PAIR_LENGTHS[5])
    assert toks.tolist() == want_t.tolist() and mask.tolist() == want_m.tolist()


def test_an_sft_reader_names_the_pair_loader(tmp_path):
    ds = open_dataset(write_rows(tmp_path / "k", "kto", [(2, 3)]))
    with pytest.raises(DatasetError, match=re.escape(
            f"{ds.root} is a kto dataset (KTO rows (prompt, completion, label)), not SFT episodes: pack reads "
            f"episodes or packed rows; read it with sftdata.loader.make_pair_loader")):
        refuse_row_kind(ds, "pack")


def test_a_pairs_dataset_recorded_as_version_1_is_refused(tmp_path):
    root = write_rows(tmp_path / "p", "pairs", PAIR_LENGTHS[:2])
    edit_metadata(root, format_version=1)
    with pytest.raises(DatasetError, match=re.escape(
            "dataset_metadata.json (format_version): a 'pairs' dataset is format_version 2, but this one records 1")):
        open_dataset(root)


def test_an_unknown_kind_asks_for_an_upgrade(tmp_path):
    root = write_rows(tmp_path / "p", "pairs", PAIR_LENGTHS[:2])
    edit_metadata(root, kind="reward")
    with pytest.raises(DatasetError, match=re.escape(
            "dataset_metadata.json (kind): kind 'reward' is not known (this sftdata reads episodes, packed, pairs, "
            "kto, prompts). To fix: upgrade sftdata, or re-create the dataset with this one")):
        open_dataset(root)


def test_a_shard_cut_inside_a_pair_is_refused(tmp_path):
    root = write_rows(tmp_path / "p", "pairs", PAIR_LENGTHS[:2])
    idx = root / "train" / "shard_00000" / "episodes.idx"
    idx.write_bytes(idx.read_bytes()[:-16])  # the last pair loses its rejected completion
    with pytest.raises(DatasetError, match=r"train/shard_00000/episodes.idx: 5 index entries are not whole rows of "
                                           r"3 \(a row never spans shards\)"):
        open_dataset(root)


def test_kto_labels_are_read_per_row_and_a_missing_labels_file_is_refused(tmp_path):
    root = write_rows(tmp_path / "k", "kto", [(2, 3), (1, 1), (3, 2)], labels=[0, 1, 1], rows_per_shard=2)
    assert row_split(open_dataset(root), "train").labels.tolist() == [0, 1, 1]
    (root / "train" / "shard_00001" / "labels.bin").unlink()
    with pytest.raises(DatasetError, match=r"train/shard_00001/labels.bin is missing"):
        open_dataset(root)


def test_rl_columns_are_read_as_written_and_a_damaged_line_is_named(tmp_path):
    cols = [{"answer": '"7"'}, {"answer": "[1,2]", "id": '"q2"'}]
    root = write_rows(tmp_path / "q", "prompts", [(3,), (2,)], columns=cols)
    rs = row_split(open_dataset(root), "train")
    assert rs.columns(np.array([1, 0])) == [cols[1], cols[0]]
    f = root / "train" / "shard_00000" / "columns.jsonl"
    f.write_bytes(f.read_bytes().replace(b'"row":1', b'"row":9'))  # same size: only the check sees it
    rs = RowSplit("prompts", open_dataset(root).split("train"))
    with pytest.raises(DatasetError, match=re.escape(f"{f}, line 2: expected")):
        rs.columns([0])
