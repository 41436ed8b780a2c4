"""``verify`` of a row dataset (pairs, KTO, prompts: sftdata/verify/rows.py): the episodes'
checks where they mean something, each other one skipped by name with why; a row's mask
rule and KTO labels per shard; ``--sources`` naming a changed input; ``--retokenize N``
rendering N sampled rows again from their input records (ids and masks), naming the row and
record that differ. On Ray: tests/engine/test_verify_ray.py."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import orjson
import pytest

from sftdata.pref import PrefOptions
from sftdata.prepare import prepare_pref
from sftdata.prepare.rerender import rerender_records
from sftdata.verify import CHECKS, verify
from tests.helpers.audit import edit_metadata
from tests.helpers.data import write_jsonl
from tests.helpers.pairs import verify_every_row

U = {"role": "user", "content": "What color is the sky?"}
PAIR = {"prompt": [U], "chosen": [{"role": "assistant", "content": "It is blue."}],
        "rejected": [{"role": "assistant", "content": "It is green, surely."}]}
EPISODE_CHECKS = list(CHECKS) + ["sources", "retokenize", "drift"]
# a pairs dataset: the episodes' checks in the same order, and KTO's labels and RL prompts' columns
PAIR_CHECKS = [("metadata", "ok"), ("metadata_checksum", "ok"), ("tokenizer", "ok"), ("files", "ok"), ("sizes", "ok"),
               ("index", "ok"), ("labels", "skipped"), ("columns", "skipped"), ("eos", "skipped"), ("counts", "ok"),
               ("vocab", "ok"), ("mask_values", "ok"), ("ranges", "ok"), ("mask_rule", "ok"), ("media", "skipped"),
               ("stops", "ok"), ("serving", "ok"),
               ("checksums", "ok"), ("sources", "ok"), ("retokenize", "skipped"), ("drift", "ok")]
TIKTOKEN = "the dataset's tokenizer is a tiktoken encoding with sftdata's markers, not a tokenizer.json"


def _pairs(tmp_path, n=5):
    rows = [{**PAIR, "chosen": [{"role": "assistant", "content": f"It is blue, {i} times."}]} for i in range(n)]
    inp = write_jsonl(tmp_path / "pairs.jsonl", rows)
    prepare_pref([inp], tmp_path / "ds", PrefOptions())
    return tmp_path / "ds", inp, rows


def _shard(ds):
    d = ds / "train" / "shard_00000"
    dtype = np.dtype(json.loads((ds / "dataset_metadata.json").read_text())["token_dtype"])
    return (d, np.fromfile(d / "tokens.bin", dtype=dtype), np.fromfile(d / "mask.bin", dtype=np.uint8),
            np.fromfile(d / "episodes.idx", dtype="<u8").reshape(-1, 2))


def test_a_pairs_dataset_runs_the_episodes_checks_by_name(tmp_path):
    ds, _, _ = _pairs(tmp_path)
    r = verify(ds, sources=True, retokenize_episodes=5, rerender=rerender_records)
    assert [(c.name, c.status) for c in r.checks] == PAIR_CHECKS and r.ok
    assert [c.name for c in r.checks if c.name not in ("labels", "columns")] == EPISODE_CHECKS  # in the same order
    notes = {c.name: c.note for c in r.checks if c.status == "skipped"}
    assert notes == {"labels": "a pairs dataset has no labels", "columns": "a pairs dataset has no columns.jsonl",
                     "eos": "a row's prompt ends with the generation prompt, not <|EOS|>", "retokenize": TIKTOKEN,
                     "media": "no media (a text dataset)"}
    assert (r.drift["episodes"], r.drift["differ"], r.reproducible) == (5, 0, True)
    assert r.splits == {"train": {"rows": 5, "tokens": int(_shard(ds)[1].size), "shards": 1}}


def test_a_changed_input_file_fails_sources_naming_the_file(tmp_path):
    ds, inp, rows = _pairs(tmp_path)
    old = inp.stat().st_size
    write_jsonl(inp, rows[:4] + [PAIR])
    r = verify(ds, sources=True)
    assert [(c.name, c.status) for c in r.checks if c.status != "ok"] == [
        ("labels", "skipped"), ("columns", "skipped"), ("eos", "skipped"), ("media", "skipped"), ("sources", "failed")]
    (p,) = r.problems
    assert (p.check, p.file, p.message) == ("sources", str(inp), f"input file {inp} is {inp.stat().st_size:,} bytes; "
                                            f"dataset_metadata.json recorded {old:,}: it changed since prepare read "
                                            "it, so the dataset cannot be reproduced from it")
    assert r.reproducible is False


def test_a_changed_row_fails_retokenize_naming_the_row_and_the_record(tmp_path, monkeypatch):
    """A token of row 2's chosen changed (its mask still the rule's: only a render finds it),
    and row 3's rejected left with an untrained last token (the mask rule finds it too)."""
    import sftdata.verify.rows as rows_check

    monkeypatch.setattr(rows_check, "ROW_BATCH", 2)  # masks checked 2 rows at a time: problems in two batches
    ds, inp, _ = _pairs(tmp_path)
    d, ids, mask, idx = _shard(ds)
    a, n = (int(x) for x in idx[3 * 3 + 2])
    mask[a + n - 2] = 0
    mask.tofile(d / "mask.bin")
    a, _ = (int(x) for x in idx[2 * 3 + 1])
    ids[a] = ids[a] + 1
    ids.tofile(d / "tokens.bin")
    r = verify_every_row(ds)
    got = [(p.check, p.where, p.message) for p in r.problems if p.check in ("mask_rule", "drift")]
    assert got[0] == ("mask_rule", "row 3, record 3, completion 1", "the mask is not the rule's, or trains nothing")
    assert got[1][:2] == ("drift", f"row 2, input record {inp}:line 3")
    assert got[1][2].startswith(f"input record {inp}:line 3 renders otherwise now: its ids or masks differ from "
                                "the stored row: row 2 (train) (1 more sampled row(s) differ); the same versions (")
    assert len(got) == 2 and (r.drift["episodes"], r.drift["differ"]) == (5, 2)
    assert {c.name for c in r.checks if c.status == "failed"} == {"counts", "mask_rule", "checksums", "drift",
                                                                          "stops"}


def test_a_changed_prompt_mask_is_named_by_row(tmp_path):
    ds, _, _ = _pairs(tmp_path, 1)
    d, _, mask, _ = _shard(ds)
    mask[0] = 1
    mask.tofile(d / "mask.bin")
    r = verify(ds)
    assert [(p.check, p.where, p.message) for p in r.problems if p.check == "mask_rule"] == [
        ("mask_rule", "row 0, record 0", "the prompt holds trained tokens")]
    # the trained tokens counted, and the prompt's trained token that is no stop, fail too
    assert [c.name for c in r.checks if c.status == "failed"] == ["counts", "mask_rule", "stops", "checksums"]


def test_verify_counts_the_bytes_of_every_file_it_hashed(tmp_path):
    ds, _, _ = _pairs(tmp_path, 1)
    meta = orjson.loads((ds / "dataset_metadata.json").read_bytes())
    listed = sum(f["bytes"] for split in meta["splits"].values() for sh in split["shards"]
                 for f in sh["files"].values()) + sum(f["bytes"] for f in meta["files"].values())
    r = verify(ds)
    assert r.ok and r.bytes_hashed == listed


def test_a_kto_label_that_is_not_0_or_1_fails_the_labels_check(tmp_path):
    inp = write_jsonl(tmp_path / "kto.jsonl", [{"prompt": [U], "completion": [{"role": "assistant", "content": "Blue."}],
                                                "label": True}] * 2)
    prepare_pref([inp], tmp_path / "ds", PrefOptions())
    labels = tmp_path / "ds" / "train" / "shard_00000" / "labels.bin"
    assert verify(tmp_path / "ds").ok
    labels.write_bytes(b"\x01\x02")
    r = verify(tmp_path / "ds")
    assert [(p.check, p.where, p.message) for p in r.problems if p.check == "labels"] == [
        ("labels", "row 1", "label 2 is not 0 or 1 (1 such row(s) in this shard)")]


def test_a_token_file_that_is_not_whole_tokens_is_reported_never_a_crash(tmp_path):
    ds, _, _ = _pairs(tmp_path, 1)
    tokens = ds / "train" / "shard_00000" / "tokens.bin"
    n = tokens.stat().st_size
    with open(tokens, "ab") as f:
        f.write(b"\x00")
    r = verify(ds)
    assert [(p.check, p.file, p.message) for p in r.problems if p.check == "sizes"] == [
        ("sizes", "train/shard_00000/tokens.bin", f"{n + 1} bytes is not a whole number of uint32 tokens (4 bytes each): "
                                                  "the file is truncated (or the token dtype is wrong)"),
        ("sizes", "train/shard_00000/tokens.bin", f"{n + 1} bytes; dataset_metadata.json recorded {n}: the file is "
                                                  "longer than written")]
    assert not r.ok


@pytest.mark.parametrize("kind", ["kto", "prompts"])
def test_kto_and_prompts_datasets_run_the_same_checks(tmp_path, kind):
    rec = {"prompt": [U], "completion": [{"role": "assistant", "content": "Blue."}], "label": False} if kind == "kto" \
        else {"prompt": [U], "answer": "blue"}
    inp = write_jsonl(tmp_path / "in.jsonl", [rec] * 3)
    prepare_pref([inp], tmp_path / "ds", PrefOptions(), rl=kind == "prompts")
    r = verify(tmp_path / "ds", sources=True, retokenize_episodes=5, rerender=rerender_records)
    own = {"kto": "labels", "prompts": "columns"}[kind]  # the kind's own check runs
    want = [(n, "ok" if n == own else s) for n, s in PAIR_CHECKS]
    assert [(c.name, c.status) for c in r.checks] == want and r.ok
    assert (r.drift["episodes"], r.drift["differ"]) == (3, 0)


def test_retokenize_re_encodes_each_prompt_and_completion_of_a_model_tokenizers_rows(trained, tmp_path):
    """A model's tokenizer.json: each sampled row's prompt followed by each completion (one
    render, split in token space) decoded and encoded again by the tokenizers library gives
    the stored ids: 6 rows, 12 sequences."""
    rows = [{**PAIR, "chosen": [{"role": "assistant", "content": f"It is blue {i} times, surely."}]} for i in range(6)]
    inp = write_jsonl(tmp_path / "pairs.jsonl", rows)
    prepare_pref([inp], tmp_path / "ds", PrefOptions(tokenizer=str(trained), chat_template="chatml"))
    r = verify_every_row(tmp_path / "ds")
    assert r.ok and (r.retokenized["episodes"], r.retokenized["differ"]) == (12, 0)
    assert [c.status for c in r.checks if c.name in ("retokenize", "drift")] == ["ok", "ok"]



@pytest.mark.parametrize(("damage", "where", "message"), [
    (lambda lines: [lines[1], lines[0], lines[2]], "line 1 (row 0, record 0)",
     'is not {"row": 0, "record": 0, "columns": {...}}'),
    (lambda lines: lines[:2], "the file", "holds 2 lines for 3 rows"),
])
def test_an_rl_prompts_columns_file_out_of_step_with_its_rows_fails_the_columns_check(tmp_path, damage, where, message):
    """columns.jsonl holds one line per row naming its row and input record: lines swapped or
    one missing (the file's sha256 resealed, so only this check can see it) fail by name."""
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt": [U], "answer": str(i)} for i in range(3)])
    prepare_pref([inp], tmp_path / "ds", PrefOptions(), rl=True)
    cols = tmp_path / "ds" / "train" / "shard_00000" / "columns.jsonl"
    cols.write_bytes(b"\n".join(damage(cols.read_bytes().splitlines())) + b"\n")
    data = cols.read_bytes()

    def reseal(meta):  # the file's size and sha256 as recorded: the checksums cannot see the edit
        meta["splits"]["train"]["shards"][0]["files"]["columns.jsonl"].update(
            bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    edit_metadata(tmp_path / "ds", reseal)
    r = verify(tmp_path / "ds")
    assert [(p.check, p.where, p.message) for p in r.problems] == [("columns", where, message)]
