"""verify holds the metadata to the data, to the tokenizer state and to itself: token ids
below every recorded vocabulary, the tokenizer identity, the recorded value ranges, the
metadata's own sha256, file sizes on --quick, and the input files (--sources). Each case
with its exact message and exit status, through the library and the CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import sftdata.verify.run as verify_run
from sftdata.cli import app
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.store import open_dataset
from sftdata.store.format import METADATA_CHECKSUM, metadata_sha256
from sftdata.verify import verify
from tests.helpers.audit import edit_metadata, make_dataset, shard

RECREATE = "re-create the dataset with `sftdata prepare-chat` / `sftdata prepare-tool`"
runner = CliRunner()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("meta"), bad_lines=1)


@pytest.fixture
def ds(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "ds")
    return tmp_path / "ds"


def meta_of(ds: Path) -> dict:
    return json.loads((ds / "dataset_metadata.json").read_text())


def cli(*args):
    return runner.invoke(app, ["verify", *map(str, args)], env={"NO_COLOR": "1"})


def cli_json(*args) -> tuple[int, dict]:
    r = cli(*args, "--json")
    return r.exit_code, json.loads(r.stdout)


def failed(report) -> dict[str, int]:
    return {c.name: c.problems for c in report.checks if c.status == "failed"}


def status(report, name: str) -> tuple[str, str]:
    (c,) = [c for c in report.checks if c.name == name]
    return c.status, c.note


# ---------------------------------------------------------------------- the metadata's own sha256
def test_the_writer_records_the_metadata_sha256_over_its_canonical_json(ds):
    meta = meta_of(ds)
    body = {k: v for k, v in meta.items() if k != METADATA_CHECKSUM}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert METADATA_CHECKSUM == "metadata_checksum"
    assert meta["metadata_checksum"] == {"version": 1, "sha256": hashlib.sha256(canonical).hexdigest()}
    assert metadata_sha256(meta) == meta["metadata_checksum"]["sha256"]
    assert status(verify(ds), "metadata_checksum") == ("ok", "")


def test_an_edited_source_sha256_fails_verify_naming_the_file_and_the_fix(ds):
    recorded = meta_of(ds)["metadata_checksum"]["sha256"]
    edit_metadata(ds, lambda m: m["sources"][0].__setitem__("sha256", "0" * 64), reseal=False)
    got = metadata_sha256(meta_of(ds))
    message = (f"dataset_metadata.json was edited after it was written: its values hash to {got[:16]}..., the sha256 "
               f"it records is {recorded[:16]}...; its counts, sizes, checksums, sources and tokenizer summary can no "
               "longer be trusted")
    fix = "restore dataset_metadata.json from a good copy of the dataset, or " + RECREATE
    for quick in (False, True):  # the metadata is small: hashed on --quick too
        (p,) = verify(ds, quick=quick).problems
        assert (p.check, p.file, p.where, p.message, p.fix) == ("metadata_checksum", "dataset_metadata.json",
                                                                "metadata_checksum", message, fix)
    code, rep = cli_json(ds)
    assert code == 1 and rep["ok"] is False and [p["message"] for p in rep["problems"]] == [message]
    r = cli(ds, "--quick")
    assert r.exit_code == 1
    assert "✗ [metadata_checksum] dataset_metadata.json (metadata_checksum)" in r.output
    assert f"fix: {fix}" in r.output


def test_any_edited_value_shows_and_reformatting_does_not(ds):
    for edit in (lambda m: m["counts"].__setitem__("records_read", 10), lambda m: m["options"].__setitem__("seed", 1),
                 lambda m: m["files"]["rejects.jsonl"].__setitem__("bytes", 1), lambda m: m.__setitem__("extra", 1)):
        out = ds.parent / "edited"
        shutil.copytree(ds, out)
        edit_metadata(out, edit, reseal=False)
        assert "metadata_checksum" in failed(verify(out, quick=True))
        shutil.rmtree(out)
    meta = meta_of(ds)  # the same values, re-indented and in another key order: not an edit
    (ds / "dataset_metadata.json").write_text(json.dumps(dict(reversed(list(meta.items()))), indent=4))
    r = verify(ds)
    assert r.ok and status(r, "metadata_checksum") == ("ok", "")


def test_an_older_dataset_without_the_checksum_passes_and_still_opens(ds):
    edit_metadata(ds, lambda m: m.pop("metadata_checksum"))
    r = verify(ds)
    assert r.ok and status(r, "metadata_checksum") == ("skipped", "not recorded, older dataset")
    open_dataset(ds)  # readers keep opening it
    res = cli(ds)
    assert res.exit_code == 0 and "│ metadata_checksum │ – skipped (not recorded, older dataset) │" in res.output


def test_a_malformed_or_unknown_checksum_record(ds):
    edit_metadata(ds, lambda m: m.__setitem__("metadata_checksum", "abc"), reseal=False)
    (p,) = verify(ds, quick=True).problems
    assert (p.check, p.message) == ("metadata_checksum", "metadata_checksum is 'abc', not {\"version\": 1, \"sha256\": "
                                                         "...}: dataset_metadata.json was edited")
    edit_metadata(ds, lambda m: m.__setitem__("metadata_checksum", {"version": 2, "sha256": "x"}), reseal=False)
    r = verify(ds, quick=True)
    assert r.ok and status(r, "metadata_checksum") == ("skipped", "version 2 is unknown to this sftdata")


def test_a_packed_dataset_is_sealed_too(ds, tmp_path):
    out = tmp_path / "packed"
    pack(ds, out, PackOptions(block_size=64))
    meta = meta_of(out)
    assert meta["metadata_checksum"] == {"version": 1, "sha256": metadata_sha256(meta)}
    r = verify(out)
    assert r.ok and status(r, "metadata_checksum") == ("ok", "") and status(r, "ranges") == ("ok", "")
    edit_metadata(out, lambda m: m["packing"].__setitem__("seed", 7), reseal=False)
    (p,) = verify(out, quick=True).problems
    assert p.check == "metadata_checksum" and p.fix.endswith("or re-create it with `sftdata pack`")


# ---------------------------------------------------------------------- vocabulary and tokenizer identity
def test_metadata_vocab_size_50_while_the_tokens_reach_100282_fails(ds):
    """The case reported: verify used to say OK."""
    edit_metadata(ds, lambda m: m["tokenizer"].__setitem__("vocab_size", 50), reseal=False)
    r = verify(ds)
    assert failed(r) == {"metadata_checksum": 1, "tokenizer": 1, "vocab": 3, "ranges": 3}
    assert [p.check for p in r.problems][:3] == ["metadata_checksum", "tokenizer", "vocab"]
    tok = r.problems[1]
    assert (tok.file, tok.message, tok.fix) == (
        "dataset_metadata.json", "the tokenizer recorded in dataset_metadata.json is not the one in "
        "tokenizer_state.json (metadata vs state: vocab_size 50 vs 100,286): one of them was edited, or they come from "
        "different datasets", "restore both files from the same good copy of the dataset, or " + RECREATE)
    assert r.problems[2].message == ("token 0 of episode 0 is id 100,277, past the vocabulary (50 ids): no tokenizer "
                                     "can decode it (3 more episodes like it in this shard)")
    code, rep = cli_json(ds, "--quick")
    assert code == 1 and [p["check"] for p in rep["problems"]][:2] == ["metadata_checksum", "tokenizer"]


def test_ids_are_held_to_the_smallest_recorded_vocabulary(ds):
    # as if written so (resealed): no edit to see, the disagreement alone fails
    edit_metadata(ds, lambda m: m["tokenizer"].__setitem__("vocab_size", 50))
    r = verify(ds, quick=True)
    assert failed(r) == {"tokenizer": 1, "vocab": 3, "ranges": 3}
    assert r.problems[-1].message == ("dataset_metadata.json records token ids up to 100,282 in val/shard_00000, past "
                                      "the vocabulary (50 ids): a loader would refuse the shard")


def test_tokenizer_state_vocab_size_edited(ds):
    p = ds / "tokenizer_state.json"
    raw = p.read_bytes()
    p.write_bytes(raw.replace(b'"vocab_size": 100286', b'"vocab_size":     50'))  # the same size
    assert p.stat().st_size == len(raw) and json.loads(p.read_text())["vocab_size"] == 50
    r = verify(ds, quick=True)
    assert failed(r) == {"tokenizer": 2, "vocab": 3, "ranges": 3}
    assert [(q.file, q.where, q.message) for q in r.problems if q.check == "tokenizer"] == [
        ("dataset_metadata.json", "tokenizer", "the tokenizer recorded in dataset_metadata.json is not the one in "
         "tokenizer_state.json (metadata vs state: vocab_size 100,286 vs 50): one of them was edited, or they come "
         "from different datasets"),
        ("tokenizer_state.json", "vocab_size", "tokenizer_state.json records vocab_size 50, but the tokenizer rebuilt "
         "from it has 100,286 ids: the file was edited")]
    assert failed(verify(ds))["checksums"] == 1  # its sha256 is in the metadata's files


def test_tokenizer_identity_name_and_eos(ds):
    edit_metadata(ds, lambda m: m["tokenizer"].update(name="o200k_base", eos_id=1))
    r = verify(ds, quick=True)
    (p,) = r.problems
    assert (p.check, p.message) == ("tokenizer", "the tokenizer recorded in dataset_metadata.json is not the one in "
                                    "tokenizer_state.json (metadata vs state: eos_id 1 vs 100,257; name 'o200k_base' "
                                    "vs 'cl100k_base'): one of them was edited, or they come from different datasets")
    assert cli(ds, "--quick").exit_code == 1


# ---------------------------------------------------------------------- recorded value ranges
def test_recorded_ranges_are_held_to_the_vocabulary_on_quick(ds):
    edit_metadata(ds, lambda m: m["splits"]["train"]["shards"][0].update(token_id_range=[0, 100300],
                                                                          mask_value_range=[0, 2]))
    r = verify(ds, quick=True)
    fix = "restore dataset_metadata.json and the shard from a good copy, or " + RECREATE
    assert [(p.check, p.file, p.where, p.message, p.fix) for p in r.problems] == [
        ("ranges", "dataset_metadata.json", "train/shard_00000 token_id_range", "dataset_metadata.json records token "
         "ids up to 100,300 in train/shard_00000, past the vocabulary (100,286 ids): a loader would refuse the shard",
         fix),
        ("ranges", "dataset_metadata.json", "train/shard_00000 mask_value_range", "dataset_metadata.json records mask "
         "values up to 2 in train/shard_00000; a mask holds 0 and 1 only: a loader would refuse the shard", fix)]
    code, rep = cli_json(ds, "--quick")
    assert code == 1 and {c["name"]: c["status"] for c in rep["checks"]}["ranges"] == "failed"


def test_a_malformed_recorded_range(ds):
    edit_metadata(ds, lambda m: m["splits"]["val"]["shards"][0].__setitem__("token_id_range", [9, 3]))
    (p,) = verify(ds, quick=True).problems
    assert p.message == ("token_id_range of val/shard_00000 is [9, 3], not [smallest, largest] of its token ids: "
                         "dataset_metadata.json was edited")


def test_recorded_ranges_are_held_to_the_data_on_a_full_verify(ds):
    p = shard(ds, "val") / "tokens.bin"
    t = np.fromfile(p, dtype="<u4")
    t[1] = 1  # a text token of val episode 0: a valid id below the recorded 6..100,282
    t.tofile(p)
    r = verify(ds)
    assert failed(r) == {"ranges": 1, "checksums": 1}
    (q,) = [q for q in r.problems if q.check == "ranges"]
    assert (q.file, q.message) == ("val/shard_00000/tokens.bin", "val/shard_00000/tokens.bin holds token ids "
                                   "1..100,282; dataset_metadata.json recorded 6..100,282 (token_id_range): the data "
                                   "or the metadata changed after they were written")
    assert verify(ds, quick=True).ok  # --quick holds the ranges to the vocabulary only: no pass over the data


def test_ranges_of_an_older_dataset_without_the_checksum_are_measured(ds):
    def edit(m):
        m.pop("metadata_checksum")
        m["splits"]["train"]["shards"][0]["mask_value_range"] = [0, 0]
    edit_metadata(ds, edit)
    (p,) = verify(ds).problems
    assert (p.check, p.file, p.message) == ("ranges", "train/shard_00000/mask.bin", "train/shard_00000/mask.bin holds "
                                            "mask values 0..1; dataset_metadata.json recorded 0..0 (mask_value_range): "
                                            "the data or the metadata changed after they were written")


def test_a_dataset_recording_no_ranges_passes(ds):
    def edit(m):
        for sp in m["splits"].values():
            for sh in sp["shards"]:
                sh.pop("token_id_range")
                sh.pop("mask_value_range")
    edit_metadata(ds, edit)
    r = verify(ds)
    assert r.ok and status(r, "ranges") == ("skipped", "not recorded, older dataset")


# ---------------------------------------------------------------------- --quick checks every listed file's size
@pytest.mark.parametrize("name", ["rejects.jsonl", "tokenizer_state.json"])
def test_quick_checks_the_top_level_file_sizes(ds, name):
    recorded = meta_of(ds)["files"][name]["bytes"]
    assert recorded == (ds / name).stat().st_size
    with open(ds / name, "ab") as f:
        f.write(b"\n\n")
    r = verify(ds, quick=True)
    (p,) = r.problems
    assert (p.check, p.file, p.message, p.fix) == (
        "sizes", name, f"{name} is {recorded + 2:,} bytes; dataset_metadata.json recorded {recorded:,}: it changed "
        "after prepare", RECREATE)
    res = cli(ds, "--quick")
    assert res.exit_code == 1 and f"✗ [sizes] {name}" in res.output


def test_quick_reports_a_missing_top_level_file(ds):
    (ds / "rejects.jsonl").unlink()
    (p,) = verify(ds, quick=True).problems
    assert (p.check, p.message) == ("files", "rejects.jsonl is missing")


def test_quick_checks_the_shard_file_sizes(ds):
    with open(shard(ds, "val") / "sources.idx", "ab") as f:
        f.write(b"\0" * 8)
    r = verify(ds, quick=True)
    assert [(p.check, p.file, p.message) for p in r.problems if p.file.endswith("sources.idx")] == [
        ("sizes", "val/shard_00000/sources.idx", "3 record numbers for 2 episodes: there must be exactly one per "
         "episode"),
        ("sizes", "val/shard_00000/sources.idx", "24 bytes; dataset_metadata.json recorded 16: the file is longer "
         "than written")]
    assert cli(ds, "--quick").exit_code == 1


# ---------------------------------------------------------------------- --sources
@pytest.fixture
def own(tmp_path) -> Path:
    """A dataset of its own, with its input file at tmp_path/own.jsonl."""
    return make_dataset(tmp_path, "own")


def test_sources_that_match_say_the_dataset_can_be_reproduced(own):
    src = own.parent / "own.jsonl"
    r = verify(own, sources=True)
    assert r.ok and r.reproducible is True and status(r, "sources") == ("ok", "")
    (c,) = r.sources
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    assert c.as_dict() == {"path": str(src), "resolved": str(src), "status": "matches", "bytes": src.stat().st_size,
                           "sha256": sha, "found_bytes": src.stat().st_size, "found_sha256": sha, "reason": ""}
    res = cli(own, "--sources")
    assert res.exit_code == 0 and "✓ matches" in res.output
    assert "all 1 input file(s) match: the dataset can be reproduced from them" in res.output
    code, rep = cli_json(own, "--sources")
    assert code == 0 and rep["reproducible"] is True and rep["sources"] == [c.as_dict()]


def test_a_changed_source_of_the_same_size(own):
    src = own.parent / "own.jsonl"
    recorded = hashlib.sha256(src.read_bytes()).hexdigest()
    src.write_bytes(src.read_bytes().replace(b"Paris", b"Lyon!"))
    now = hashlib.sha256(src.read_bytes()).hexdigest()
    r = verify(own, sources=True)
    assert r.reproducible is False and r.sources[0].status == "changed"
    (p,) = r.problems
    assert (p.check, p.file, p.where, p.message, p.fix) == (
        "sources", str(src), "", f"input file {src} has sha256 {now[:16]}..., dataset_metadata.json recorded "
        f"{recorded[:16]}...: it changed since prepare read it, so the dataset cannot be reproduced from it",
        "restore the input as it was, or re-create the dataset from the file as it is now")
    res = cli(own, "--sources")
    assert res.exit_code == 1 and "✗ changed" in res.output
    assert "1 of 1 input file(s) missing or changed: the dataset cannot be reproduced from them" in res.output
    code, rep = cli_json(own, "--sources")
    assert code == 1 and rep["reproducible"] is False and rep["sources"][0]["found_sha256"] == now


def test_a_changed_source_of_another_size_is_not_hashed(own, monkeypatch):
    src = own.parent / "own.jsonl"
    n = src.stat().st_size
    with open(src, "ab") as f:
        f.write(b"\n")
    (p,) = verify(own, sources=True).problems
    assert p.message == (f"input file {src} is {n + 1:,} bytes; dataset_metadata.json recorded {n:,}: it changed "
                         "since prepare read it, so the dataset cannot be reproduced from it")
    assert verify(own, sources=True).sources[0].found_sha256 is None


def test_a_missing_source(own):
    src = own.parent / "own.jsonl"
    src.unlink()
    r = verify(own, sources=True)
    assert r.reproducible is False and r.sources[0].status == "missing"
    (p,) = r.problems
    assert (p.message, p.fix) == (
        f"input file {src} does not exist: the dataset cannot be reproduced from its inputs",
        "run verify from the folder prepare ran in (a relative path is resolved against the current folder), or "
        "restore the file")
    src.mkdir()
    assert verify(own, sources=True).problems[0].message.startswith(f"input file {src} is not a file:")
    assert cli(own, "--sources").exit_code == 1


def test_a_relative_source_path_is_resolved_against_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in.jsonl").write_text('{"messages": [{"role": "user", "content": "Hi"}, '
                                '{"role": "assistant", "content": "Hello."}]}\n')
    prepare(["in.jsonl"], tmp_path / "rel", PrepareOptions(val_split=0, workers=1))
    assert meta_of(tmp_path / "rel")["sources"][0]["path"] == "in.jsonl"
    assert verify(tmp_path / "rel", sources=True).reproducible is True
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (p,) = verify(tmp_path / "rel", sources=True).problems
    assert (p.file, p.where, p.message) == ("in.jsonl", f"read as {elsewhere / 'in.jsonl'}",
                                            "input file in.jsonl does not exist: the dataset cannot be reproduced "
                                            "from its inputs")


def test_without_sources_no_input_file_is_read(own, monkeypatch):
    def refuse(rec):
        raise AssertionError(f"read {rec['path']}")
    monkeypatch.setattr(verify_run, "check_source", refuse)
    (own.parent / "own.jsonl").unlink()
    r = verify(own)
    assert r.ok and r.sources is None and r.reproducible is None and "sources" not in [c.name for c in r.checks]
    code, rep = cli_json(own)
    assert code == 0 and rep["sources"] is None and rep["reproducible"] is None


def test_sources_of_a_packed_dataset(own, tmp_path):
    out = tmp_path / "packed"
    pack(own, out, PackOptions(block_size=64))
    r = verify(out, sources=True)
    assert r.ok and r.sources == [] and r.reproducible is None
    assert status(r, "sources") == ("skipped", "no input files recorded")
    assert r.notes[-1] == (f"--sources: a packed dataset records no input files; run `sftdata verify "
                           f"{own.resolve()} --sources` on its source")


def test_an_edited_source_record_is_caught_twice(own):
    """The recorded sha256 edited: the metadata's own sha256 shows the edit, and --sources
    finds the input no longer matching the record."""
    edit_metadata(own, lambda m: m["sources"][0].__setitem__("sha256", "0" * 64), reseal=False)
    r = verify(own, sources=True)
    assert failed(r) == {"metadata_checksum": 1, "sources": 1} and r.reproducible is False


def test_a_source_read_in_ranges_without_its_sha256_is_compared_by_its_block_hash(tmp_path, monkeypatch):
    """A plain JSONL file over WHOLE_SHA256_BYTES read by workers in ranges records its block
    hash only: --sources compares that."""
    import sftdata.sources.partitions as partitions
    from tests.helpers.data import chat, write_jsonl

    monkeypatch.setattr(partitions, "WHOLE_SHA256_BYTES", 100)
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i}", f"answer {i}") for i in range(50)])
    prepare([src], tmp_path / "ds", PrepareOptions(workers=2))
    rec = json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())["sources"][0]
    assert rec["sha256"] is None and rec["block_sha256"]["block_bytes"] == 4 << 20
    r = verify(tmp_path / "ds", sources=True)
    assert r.reproducible is True and (r.sources[0].status, r.sources[0].reason) == ("matches", "")
    src.write_bytes(src.read_bytes().replace(b"answer 7", b"answer 8"))
    r = verify(tmp_path / "ds", sources=True)
    found = hashlib.sha256(hashlib.sha256(src.read_bytes()).digest()).hexdigest()
    assert r.reproducible is False and (r.sources[0].status, r.sources[0].reason) == (
        "changed", f"has block hash {found[:16]}..., dataset_metadata.json recorded "
        f"{rec['block_sha256']['sha256'][:16]}... (block_sha256)")
