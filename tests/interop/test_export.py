"""``sftdata export``: Parquet and JSONL that `datasets` and pyarrow read back equal to the
dataset token for token and label for label; streamed; written atomically; never over
anything but an earlier export."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tracemalloc

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import ConfigError, DatasetError, OutputExistsError, UsageError
from sftdata.interop import export as export_mod
from sftdata.interop.export import PARQUET_KEY, ExportOptions, export
from sftdata.loader import IGNORE_INDEX
from sftdata.storage.lock import OWNER_FILE, owner_record
from sftdata.store import METADATA_FILE, read_json
from sftdata.torch import SFTDataset
from tests.helpers.loader import make_dataset, make_flat, make_packed

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
runner = CliRunner()


@pytest.fixture(scope="module")
def packed(source, tmp_path_factory):  # noqa: F811
    return make_packed(source, tmp_path_factory.mktemp("packed") / "p")


def load_with_datasets(folder, tmp_path):
    datasets = pytest.importorskip("datasets")
    return datasets.load_dataset("parquet", data_dir=str(folder), cache_dir=str(tmp_path / "hf_cache"))


def test_episodes_read_back_with_datasets_equal_the_dataset(source, tmp_path):  # noqa: F811
    rep = export(source, tmp_path / "out")
    assert rep.kind == "episodes" and rep.columns == ["episode", "record", "input_ids", "labels", "attention_mask"]
    hf = load_with_datasets(tmp_path / "out", tmp_path)
    assert sorted(hf) == ["train", "validation"]  # val.parquet is the validation split to `datasets`
    for split, name in (("train", "train"), ("val", "validation")):
        ds = SFTDataset(source, split=split)
        rows = hf[name]
        assert len(rows) == len(ds) == rep.splits[split].rows
        sources = ds.split.sources
        for i in range(len(ds)):
            got, want = rows[i], ds[i]
            assert got["input_ids"] == want["input_ids"].tolist()
            assert got["labels"] == want["labels"].tolist()
            assert got["attention_mask"] == [1] * len(want["input_ids"])
            assert (got["episode"], got["record"]) == (i, int(sources[i]))
        assert rep.splits[split].tokens == int(ds.lengths.sum())
        assert rep.splits[split].trained_tokens == sum(int((ds[i]["labels"] != IGNORE_INDEX).sum()) for i in range(len(ds)))


def test_a_packed_dataset_exports_one_row_per_sequence_equal_to_its_segment(packed, tmp_path):
    rep = export(packed, tmp_path / "out")
    assert rep.columns == ["row", "episode", "record", "input_ids", "labels", "attention_mask"]
    hf = load_with_datasets(tmp_path / "out", tmp_path)["train"]
    ds = SFTDataset(packed)
    seg = ds.segments
    assert len(hf) == len(seg) == rep.splits["train"].rows and len(seg) > len(ds)  # rows hold several sequences
    for k in range(len(seg)):
        got, r, a, n = hf[k], int(seg.row[k]), int(seg.offset[k]), int(seg.length[k])
        item = ds[r]
        assert got["input_ids"] == item["input_ids"][a:a + n].tolist()
        assert got["labels"] == item["labels"][a:a + n].tolist()  # the same trained targets as the packed row
        assert got["attention_mask"] == [1] * n
        assert (got["row"], got["episode"], got["record"]) == (r, int(seg.episode[k]), int(seg.source[k]))
    assert rep.splits["train"].tokens == int(seg.length.sum())
    assert rep.splits["train"].trained_tokens == sum(int((ds[i]["labels"] != IGNORE_INDEX).sum()) for i in range(len(ds)))


def test_pyarrow_reads_row_groups_of_whole_rows_and_the_provenance(source, tmp_path):  # noqa: F811
    rep = export(source, tmp_path / "out", ExportOptions(row_group_tokens=500))
    f = pq.ParquetFile(tmp_path / "out" / "train.parquet")
    ds = SFTDataset(source)
    assert f.metadata.num_rows == len(ds)
    assert f.metadata.num_row_groups > 3
    lengths = ds.lengths
    first = 0
    for g in range(f.metadata.num_row_groups):
        n = f.metadata.row_group(g).num_rows
        span = int(lengths[first:first + n].sum())
        assert span <= 500 or n == 1  # a row group is whole rows of at most the budget (or one longer row)
        first += n
    prov = orjson.loads(f.schema_arrow.metadata[PARQUET_KEY])
    assert prov["split"] == "train" and prov["kind"] == "episodes" and prov["source"] == str(source.resolve())
    table = pq.read_table(tmp_path / "out" / "train.parquet")
    assert table.column("input_ids").to_pylist()[7] == ds[7]["input_ids"].tolist()
    assert table.schema.field("input_ids").type == pa.list_(pa.int64())
    meta = read_json(tmp_path / "out" / METADATA_FILE)
    assert meta["kind"] == "export" and sorted(meta["files"]) == ["train.parquet", "val.parquet"]
    assert meta["export"]["files"]["train"]["rows"] == rep.splits["train"].rows


def test_jsonl_holds_the_same_rows(packed, source, tmp_path):  # noqa: F811
    export(packed, tmp_path / "pq", ExportOptions(splits=("train",)))
    export(packed, tmp_path / "js", ExportOptions(format="jsonl", splits=("train",)))
    assert sorted(p.name for p in (tmp_path / "js").iterdir()) == [METADATA_FILE, "train.jsonl"]
    lines = [orjson.loads(x) for x in (tmp_path / "js" / "train.jsonl").read_bytes().splitlines()]
    assert lines == pq.read_table(tmp_path / "pq" / "train.parquet").to_pylist()
    export(source, tmp_path / "ep", ExportOptions(format="jsonl", splits=("val",)))
    first = orjson.loads((tmp_path / "ep" / "val.jsonl").read_bytes().splitlines()[0])
    assert first["input_ids"] == SFTDataset(source, split="val")[0]["input_ids"].tolist()


def test_unknown_record_numbers_are_null(tmp_path):
    path = make_flat(tmp_path / "flat", [4, 6])  # the older flat layout records no input record numbers
    export(path, tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / "train.parquet")
    assert table.column("record").to_pylist() == [None, None]
    assert table.column("input_ids").to_pylist() == [SFTDataset(path)[i]["input_ids"].tolist() for i in range(2)]


def test_memory_stays_flat_in_the_dataset_size(tmp_path):
    def peak_of(episodes: int) -> int:
        path = make_dataset(tmp_path / f"d{episodes}", [500] * episodes, shard_tokens=600_000)
        tracemalloc.start()
        export(path, tmp_path / f"o{episodes}", ExportOptions(row_group_tokens=50_000))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert pq.ParquetFile(tmp_path / f"o{episodes}" / "train.parquet").metadata.num_rows == episodes
        return peak

    peak_of(10)  # first imports (pyarrow) out of the way
    small, large = peak_of(6000), peak_of(18000)  # 3M and 9M tokens
    # 12,000 more episodes add their index (start, length, record: 24 bytes each), never their 6M tokens
    assert large - small < 48 * 12_000, (small, large)
    assert large < 9_000_000 * (8 + 8 + 1) / 5  # far from the split's columns held at once


def test_an_existing_output_is_refused_and_overwrite_replaces_only_an_export(source, packed, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    export(source, out, ExportOptions(splits=("val",)))
    with pytest.raises(OutputExistsError, match=r"out already exists and is not up to date: the option --split "
                                                 r'changed \(\["val"\] -> none\)\. Pass --overwrite to rebuild it, or '
                                                 r"choose another --output-dir$"):
        export(source, out)
    rep = export(source, out, ExportOptions(overwrite=True))
    assert sorted(rep.splits) == ["train", "val"] and (out / "train.parquet").is_file()
    (out / "notes.txt").write_text("mine")
    assert export(source, out, ExportOptions(overwrite=True)).up_to_date  # nothing to do: notes.txt stays
    with pytest.raises(OutputExistsError, match=r"holds files sftdata did not write: notes.txt"):
        export(source, out, ExportOptions(overwrite=True, format="jsonl"))
    assert (out / "notes.txt").read_text() == "mine" and (out / "train.parquet").is_file()
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("1,2")
    with pytest.raises(OutputExistsError, match=r"is not an earlier export of sftdata: --overwrite replaces only an "
                                                r"export \(never a dataset or other files\)"):
        export(source, other, ExportOptions(overwrite=True))
    with pytest.raises(OutputExistsError, match="is not an earlier export of sftdata"):
        export(source, packed, ExportOptions(overwrite=True))  # a dataset is never replaced by an export
    with pytest.raises(OutputExistsError, match="is not an earlier export of sftdata"):
        export(source, packed)  # nor told that --overwrite would replace it
    assert (packed / METADATA_FILE).is_file()
    for target in (source, source / "exp", source.parent):
        with pytest.raises(UsageError, match=r"would overlap the dataset .*; choose an --output-dir outside it"):
            export(source, target, ExportOptions(overwrite=True))


def test_an_unchanged_export_is_up_to_date_and_a_changed_one_names_what_changed(source, tmp_path):  # noqa: F811
    src, out = tmp_path / "d", tmp_path / "out"
    shutil.copytree(source, src)
    first = export(src, out, ExportOptions(splits=("val",)))
    assert first.build_key is not None and not first.up_to_date and first.changed == []
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()}
    again = export(src, out, ExportOptions(splits=("val",)))  # nothing written, the report is the export's
    assert again.up_to_date and again.build_key == first.build_key and again.changed == []
    assert (again.kind, again.columns, again.splits) == (first.kind, first.columns, first.splits)
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()} == before
    fmt = export(src, out, ExportOptions(splits=("val",), format="jsonl", overwrite=True))
    assert fmt.changed == ['the option --format changed ("parquet" -> "jsonl")'] and fmt.build_key != first.build_key
    assert sorted(p.name for p in out.iterdir()) == [METADATA_FILE, "val.jsonl"]
    shutil.rmtree(src)
    make_dataset(src, [5, 7, 9])  # another dataset at the same path
    with pytest.raises(OutputExistsError, match=r"already exists and is not up to date: the source dataset changed "
                                                 rf"\(its {METADATA_FILE} sha256 [0-9a-f]{{12}}\.\.\. -> "
                                                 r"[0-9a-f]{12}\.\.\.\)"):
        export(src, out, ExportOptions(format="jsonl", splits=("train",)))
    forced = export(src, out, ExportOptions(format="jsonl", splits=("train",), force=True))
    assert forced.changed == ["--force rebuilds it whatever its build key says"] and forced.splits["train"].rows == 3
    assert export(src, out, ExportOptions(format="jsonl", splits=("train",))).up_to_date


def test_an_edit_of_the_export_code_rebuilds_naming_it(source, tmp_path, monkeypatch):  # noqa: F811
    first = export(source, tmp_path / "out", ExportOptions(splits=("val",)))
    real = export_mod.base_components
    monkeypatch.setattr(export_mod, "base_components", lambda kind, paths: {**real(kind, paths), "code": "d" * 64})
    again = export(source, tmp_path / "out", ExportOptions(splits=("val",), overwrite=True))
    old = read_json(tmp_path / "out" / METADATA_FILE)  # the new record; the old key's code is this sftdata's
    assert again.changed == [f"the export code changed (source sha256 {real('export', export_mod.EXPORT_CODE)['code'][:12]}"
                             f"... -> dddddddddddd...)"]
    assert old["build"]["key"] == again.build_key != first.build_key


def test_a_failed_export_leaves_nothing(source, tmp_path, monkeypatch):  # noqa: F811
    def broken(self, chunk):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_mod.ParquetSink, "write", broken)
    with pytest.raises(OSError, match="No space left"):
        export(source, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # no output, no staging folder, no lock file


def test_errors_say_what_to_do(source, tmp_path, monkeypatch):  # noqa: F811
    with pytest.raises(UsageError, match=r"--format must be one of parquet, jsonl, got 'mds' \(MosaicML MDS is not "
                                         r"offered: docs/INTEROP.md says why\)"):
        export(source, tmp_path / "o", ExportOptions(format="mds"))
    with pytest.raises(DatasetError, match=r"has no split 'test' \(splits: train, val\)"):
        export(source, tmp_path / "o", ExportOptions(splits=("test",)))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ConfigError, match=r"--format parquet needs pyarrow: pip install 'sftdata\[parquet\]' \(or use "
                                          r"--format jsonl\)"):
        export(source, tmp_path / "o")
    assert not (tmp_path / "o").exists()
    flat = tmp_path / "flat" / "train"
    flat.mkdir(parents=True)
    np.arange(10, dtype="<u4").tofile(flat / "tokens.bin")
    np.array([[0, 10]], dtype="<u8").tofile(flat / "episodes.idx")
    with pytest.raises(DatasetError, match=r"split 'train' of .* has no mask.bin, so labels cannot say which tokens"):
        export(tmp_path / "flat", tmp_path / "o2", ExportOptions(format="jsonl"))


def test_the_command_line(source, tmp_path):  # noqa: F811
    r = runner.invoke(app, ["export", str(source), "-o", str(tmp_path / "o"), "--split", "val", "--json"])
    assert r.exit_code == 0, r.output
    rep = orjson.loads(r.stdout)
    assert sorted(rep) == ["build_key", "changed", "columns", "dataset", "format", "kind", "notes", "output_dir",
                           "seconds", "splits", "up_to_date"]
    assert sorted(rep["splits"]) == ["val"] and rep["splits"]["val"]["file"] == "val.parquet"
    assert rep["build_key"] is not None and rep["up_to_date"] is False and rep["changed"] == []
    r = runner.invoke(app, ["export", str(source), "-o", str(tmp_path / "o"), "--split", "val", "--json"])
    again = orjson.loads(r.stdout)
    assert r.exit_code == 0 and again["up_to_date"] is True and again["build_key"] == rep["build_key"]
    assert again["splits"] == rep["splits"] and again["columns"] == rep["columns"]
    r = runner.invoke(app, ["export", str(source), "-o", str(tmp_path / "o"), "--split", "val"])
    assert r.exit_code == 0 and " ".join(r.output.split()) == (f"{tmp_path / 'o'}: up to date (build key "
                                                              f"{rep['build_key'][:12]}...); nothing to do (--force "
                                                              f"rebuilds it)")
    r = runner.invoke(app, ["export", str(source), "-o", str(tmp_path / "o")])
    assert r.exit_code == 1 and " ".join(r.output.split()) == (f"error: {tmp_path / 'o'} already exists and is not up "
                                                              f'to date: the option --split changed (["val"] -> none). '
                                                              f"Pass --overwrite to rebuild it, or choose another "
                                                              f"--output-dir")
    r = runner.invoke(app, ["export", str(source), "-o", str(tmp_path / "o"), "--overwrite"])
    assert r.exit_code == 0 and " ".join(r.output.split()).startswith(f"rebuilding {tmp_path / 'o'}: the option "
                                                                      f'--split changed (["val"] -> none)')
    r = runner.invoke(app, ["export", str(source), "-o", str(tmp_path / "j"), "-f", "jsonl"])
    assert r.exit_code == 0 and "Exported" in r.output and "train.jsonl" in r.output
    r = runner.invoke(app, ["export", str(source), "-o", str(tmp_path / "x"), "--format", "csv"])
    assert r.exit_code == 2 and r.output.startswith("error: --format must be one of parquet, jsonl, got 'csv'")
    r = runner.invoke(app, ["export", str(tmp_path / "missing"), "-o", str(tmp_path / "y")])
    assert r.exit_code == 1 and "does not exist" in r.output


def test_an_up_to_date_export_sweeps_what_a_dead_export_left_beside_it(source, tmp_path):  # noqa: F811
    """Issue 44.5 for export: the rerun that finds the export up to date still removes a
    staging folder whose owner record names a dead process; a live run's and a user's
    folder of a similar name stay."""
    out = tmp_path / "e"
    export(source, out)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".e.tmp-{dead.pid}-0badc0de"
    stale.mkdir()
    (stale / OWNER_FILE).write_bytes(orjson.dumps(owner_record() | {"target": "e", "kind": "staging", "pid": dead.pid}))
    (stale / "part.jsonl").write_bytes(b"{}\n")
    live = tmp_path / f".e.tmp-{os.getpid()}-0000beef"
    live.mkdir()
    (live / OWNER_FILE).write_bytes(orjson.dumps(owner_record() | {"target": "e", "kind": "staging"}))
    users = tmp_path / ".e.tmp-2024-05"
    users.mkdir()
    assert export(source, out).up_to_date
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".e.")) == sorted([live.name, users.name])
