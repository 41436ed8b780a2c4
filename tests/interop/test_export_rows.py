"""``sftdata export`` of pairs, KTO rows and RL prompts: TRL's tokenized columns with each
row's input record, equal to the dataset token for token, in JSONL and Parquet."""

from __future__ import annotations

import os

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.interop.export import ExportOptions, export
from sftdata.store import METADATA_FILE, read_json
from sftdata.torch import PairDataset
from tests.helpers.pairs import PAIR_LENGTHS, part_mask, part_tokens, write_rows

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
runner = CliRunner()


def expected_pair(r: int) -> dict:
    p, c, j = PAIR_LENGTHS[r]
    return {"row": r, "record": 10 + 2 * r, "prompt_ids": part_tokens(r, 0, p).tolist(),
            "chosen_ids": part_tokens(r, 1, c).tolist(), "rejected_ids": part_tokens(r, 2, j).tolist(),
            "chosen_mask": part_mask(1, c).tolist(), "rejected_mask": part_mask(2, j).tolist()}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return write_rows(tmp_path_factory.mktemp("p") / "pairs", "pairs", PAIR_LENGTHS, rows_per_shard=4,
                      val_lengths=[(2, 2, 2)])


def test_pairs_export_as_jsonl_with_trls_columns_in_order(pairs, tmp_path):
    report = export(pairs, tmp_path / "out", ExportOptions(format="jsonl"))
    assert report.kind == "pairs"
    assert report.columns == ["row", "record", "prompt_ids", "chosen_ids", "rejected_ids",
                              "chosen_mask", "rejected_mask"]
    lines = (tmp_path / "out" / "train.jsonl").read_bytes().splitlines()
    assert [list(orjson.loads(x)) for x in lines[:1]] == [report.columns]
    assert [orjson.loads(x) for x in lines] == [expected_pair(r) for r in range(9)]
    t = report.splits["train"]
    # the prompt counted once, as prepare-pref counts the split's tokens
    assert (t.rows, t.tokens) == (9, sum(p + c + j for p, c, j in PAIR_LENGTHS))
    assert t.tokens == read_json(pairs / METADATA_FILE)["splits"]["train"]["tokens"]
    assert t.trained_tokens == sum(c - 1 + j - 1 + (c == 1) + (j == 1) for _, c, j in PAIR_LENGTHS)
    assert report.splits["val"].rows == 1


def test_pairs_export_as_parquet_row_groups_of_whole_pairs(pairs, tmp_path):
    export(pairs, tmp_path / "out", ExportOptions(row_group_tokens=20))
    f = pq.ParquetFile(tmp_path / "out" / "train.parquet")
    assert f.metadata.num_row_groups > 2
    assert f.read().to_pylist() == [expected_pair(r) for r in range(9)]
    assert f.schema_arrow.field("chosen_mask").type == pa.list_(pa.int8())


def test_the_same_pairs_give_the_same_bytes(pairs, tmp_path):
    for name in ("a", "b"):
        export(pairs, tmp_path / name, ExportOptions(format="jsonl"))
    assert (tmp_path / "a" / "train.jsonl").read_bytes() == (tmp_path / "b" / "train.jsonl").read_bytes()


def test_kto_rows_export_their_completion_and_label(tmp_path):
    ds = write_rows(tmp_path / "k", "kto", [(2, 3), (1, 2)], labels=[1, 0], records=[4, 0])
    export(ds, tmp_path / "out")
    assert pq.read_table(tmp_path / "out" / "train.parquet").to_pylist() == [
        {"row": 0, "record": 4, "prompt_ids": [1, 2], "completion_ids": [300, 301, 302],
         "completion_mask": [1, 1, 0], "label": True},
        {"row": 1, "record": 0, "prompt_ids": [1001], "completion_ids": [1300, 1301],
         "completion_mask": [1, 0], "label": False}]


def test_rl_prompts_export_their_columns_byte_exact(tmp_path):
    ds = write_rows(tmp_path / "q", "prompts", [(2,), (1,)], columns=[{"answer": '"0.50"'}, {"answer": "[1, 2]"}])
    export(ds, tmp_path / "out", ExportOptions(format="jsonl"))
    rows = [orjson.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_bytes().splitlines()]
    assert rows == [{"row": 0, "record": 10, "prompt": [1, 2], "columns": '{"answer":"\\"0.50\\""}'},
                    {"row": 1, "record": 12, "prompt": [1001], "columns": '{"answer":"[1, 2]"}'}]


def test_the_command_line_exports_pairs(pairs, tmp_path):
    r = runner.invoke(app, ["export", str(pairs), "-o", str(tmp_path / "out"), "--format", "jsonl", "--json"])
    assert r.exit_code == 0, r.output
    out = orjson.loads(r.stdout)
    assert out["kind"] == "pairs" and out["splits"]["train"]["rows"] == 9


@pytest.mark.parametrize("kind", ["pairs", "kto"])
def test_an_exported_row_is_the_pair_datasets_item(pairs, kind, tmp_path):
    ds = pairs if kind == "pairs" else write_rows(tmp_path / "k", "kto", [(2, 3), (1, 2)], labels=[1, 0])
    export(ds, tmp_path / "out", ExportOptions(splits=("train",)))
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert [{k: v for k, v in r.items() if k != "row"} for r in rows] == list(PairDataset(ds))
