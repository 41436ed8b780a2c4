"""Every reader tolerates any damage to a dataset's files: verify, inspect, pack, export,
report, replay-order and the loader's open turn a malformed field or a damaged binary
file into a named problem (a verify problem line, or one error line naming the file),
never an internal error nor a traceback.

The findings of issue 45 (item 8) each have their test; the fuzz test then applies
seeded random mutations (``tests/helpers/damage.py``) to copies of four small prepared
datasets (sftdata's markers, a model's template, packed, pairs), one mutation at a time, and
runs the loader's open (and first batch) and one reader per mutation (in turn) in-process through
``CliRunner``: 520 mutations in all.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import DatasetError, SftDataError
from sftdata.loader import make_loader
from sftdata.order.config import LoaderConfig
from sftdata.pack.run import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.store import open_dataset
from tests.helpers.damage import mutate
from tests.helpers.data import chat, write_jsonl
from tests.helpers.pref_records import pair_rows
from tests.helpers.templates import TOKENS, train_tokenizer

runner = CliRunner()
LOADER = LoaderConfig(batch_size=4, block_size=32, epoch_drop_last=False)
# 520 mutations in all; a reader loads cl100k_base in a fraction of a second each time, a small
# tokenizer.json at once: most mutations go to the model dataset
MUTATIONS = {"episodes": 60, "model": 240, "packed": 150, "pairs": 70}
# one reader per mutation, in turn ("DS" is the damaged dataset, "OUT" a fresh output path;
# "ITEM": --episode, or --row for a packed dataset)
READERS = (
    ("verify", "DS"),
    ("inspect", "DS"),
    ("inspect", "DS", "ITEM", "1", "--tokens"),
    ("replay-order", "DS", "--json"),
    ("pack", "DS", "-o", "OUT", "-b", "64", "-q"),
    ("export", "DS", "-o", "OUT", "-f", "jsonl", "-q"),
    ("report", "DS", "-o", "OUT.html", "--sample", "1"),
    ("inspect", "DS", "--record", "3", "--json"),
    ("replay-order", "DS", "--step", "1", "--batch-size", "2", "--json"),
    ("verify", "DS", "--quick", "--json"),
)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """Four small datasets: sftdata's markers (cl100k_base), a model's own tokenizer and
    template (a trained tokenizer.json, Gemma's template: its state records a mask rule),
    that one packed, and preference pairs (prepare-pref) with that tokenizer."""
    d = tmp_path_factory.mktemp("damage")
    src = write_jsonl(d / "chats.jsonl", [chat(f"question {i} " * (1 + i % 5), f"answer {i} " * (2 + i % 7))
                                          for i in range(30)])
    prepare([src], d / "episodes", PrepareOptions(workers=1, val_split=0.2))
    specials, bos, eos, extra = TOKENS["gemma"]
    tok = train_tokenizer(d / "gemma", specials, bos, eos, extra, {"pad_token": "<pad>"}, vocab_size=800)
    prepare([src], d / "model", PrepareOptions(workers=1, val_split=0.2, tokenizer=str(tok), chat_template="gemma"))
    pack(d / "model", d / "packed", PackOptions(block_size=64))
    pairs = write_jsonl(d / "pairs.jsonl", pair_rows(20))
    r = runner.invoke(app, ["prepare-pref", str(pairs), "-o", str(d / "pairs"), "--tokenizer", str(tok),
                            "--chat-template", "gemma", "-q"])
    assert r.exit_code == 0, r.output
    return {"episodes": d / "episodes", "model": d / "model", "packed": d / "packed", "pairs": d / "pairs"}


def _invoke(args, ds: Path, out: Path):
    item = "--row" if "packed" in ds.name else "--episode"
    argv = [str(ds) if a == "DS" else str(out) if a == "OUT" else f"{out}.html" if a == "OUT.html" else
            item if a == "ITEM" else a for a in args]
    return runner.invoke(app, argv)


def _clean_outcome(res) -> str | None:
    """None when the command ended cleanly (success, or one named error); else why not."""
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        return f"{type(res.exception).__name__}: {res.exception}"
    if "internal error" in res.output or "Traceback" in res.output:
        return res.output.strip().splitlines()[-1]
    if res.exit_code not in (0, 1, 2):  # success, a damaged dataset, a usage error
        return f"exit {res.exit_code}: {res.output.strip()[-300:]}"
    return None


def _damaged(tmp_path, datasets, kind="episodes") -> Path:
    ds = tmp_path / "ds"
    shutil.copytree(datasets[kind], ds)
    return ds


def _every_reader(ds: Path, tmp_path) -> dict[str, tuple[int, str]]:
    """Each reader's exit code and last line on ``ds``; asserts none ends uncleanly."""
    out = {}
    for k, args in enumerate(READERS[:7]):
        res = _invoke(args, ds, tmp_path / f"out{k}")
        assert _clean_outcome(res) is None, (args, res.output)
        name = "inspect -e" if "ITEM" in args else args[0]
        out[name] = (res.exit_code, (res.output.strip().splitlines() or [""])[-1])
    return out


# ------------------------------------------------------------------ the findings, as written
def test_an_episodes_idx_value_of_2_63_is_a_named_problem_for_every_reader(tmp_path, datasets):
    ds = _damaged(tmp_path, datasets)
    idx = ds / "train/shard_00000/episodes.idx"
    a = np.fromfile(idx, "<u8")
    a[6] = 2**63  # the start of episode 3
    a.tofile(idx)
    seen = _every_reader(ds, tmp_path)
    assert seen["verify"][0] == 1 and seen["verify"][1].startswith("FAILED: ")
    res = runner.invoke(app, ["verify", str(ds), "--json"])
    problems = json.loads(res.output)["problems"]
    assert [(p["check"], p["file"], p["code"], p["episode"]) for p in problems if p["check"] == "index"] == [
        ("index", "train/shard_00000/episodes.idx", "out_of_bounds", 3)]
    for name in ("inspect", "inspect -e", "replay-order", "pack", "export", "report"):
        code, line = seen[name]
        assert code == 1 and "train/shard_00000/episodes.idx (episode 3 of train, byte 48 of episodes.idx): " \
            "episode 3 spans tokens [9,223,372,036,854,775,808, " in line, (name, line)
    with pytest.raises(DatasetError, match=r"episodes.idx \(episode 3 of train.*points past the end"):
        open_dataset(ds)


def _edit(path: Path, fn) -> None:
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


def test_a_special_token_id_that_is_not_an_integer_is_named(tmp_path, datasets):
    ds = _damaged(tmp_path, datasets)
    _edit(ds / "tokenizer_state.json", lambda s: s["special_tokens"].update({"<|TOOL_CALL|>": [None]}))
    seen = _every_reader(ds, tmp_path)
    res = runner.invoke(app, ["verify", str(ds), "--json"])
    assert res.exit_code == 1
    named = [p for p in json.loads(res.output)["problems"] if p["code"] == "field_type"]
    assert [(p["check"], p["file"], p["where"], p["message"]) for p in named] == [
        ("tokenizer", "tokenizer_state.json", "special_tokens.<|TOOL_CALL|>", "special_tokens.<|TOOL_CALL|> is an "
         "array, not a token id (a whole number from 0 to 2**32 - 1): the file was damaged or edited")]
    assert seen["pack"] == (1, "error: " + str(ds) + ": tokenizer_state.json (special_tokens.<|TOOL_CALL|>): "
                            "special_tokens.<|TOOL_CALL|> is an array, not a token id (a whole number from 0 to "
                            "2**32 - 1): the file was damaged or edited. To fix: restore it from a good copy of the "
                            "dataset, or re-create the dataset with `sftdata prepare-chat` / `sftdata prepare-tool`. "
                            f"Run `sftdata verify {ds}` for the full report")


def test_serving_json_stop_strings_true_is_named(tmp_path, datasets):
    ds = _damaged(tmp_path, datasets)
    _edit(ds / "serving.json", lambda s: s.update(stop_strings=True))
    seen = _every_reader(ds, tmp_path)
    res = runner.invoke(app, ["verify", str(ds), "--json"])
    assert res.exit_code == 1
    serving = [p for p in json.loads(res.output)["problems"] if p["check"] == "serving"]
    assert [(p["file"], p["code"], p["message"]) for p in serving] == [
        ("serving.json", "unreadable", f"{ds / 'serving.json'}: stop_strings is a boolean, not a JSON array: the "
                                       "file was damaged or edited")]
    assert seen["inspect"][0] == 0 and seen["export"][0] == 0  # serving.json is not what they read


def test_a_file_size_recorded_as_an_object_is_named(tmp_path, datasets):
    ds = _damaged(tmp_path, datasets)
    _edit(ds / "dataset_metadata.json", lambda m: m["splits"]["train"]["shards"][0]["files"]["tokens.bin"]
          .update(bytes={}))
    seen = _every_reader(ds, tmp_path)
    where = 'splits.train.shards[0].files["tokens.bin"].bytes'
    for name in ("inspect", "replay-order", "pack", "export", "report"):
        assert seen[name][0] == 1 and f"dataset_metadata.json ({where}): {where} is an object, not a whole " \
            "number >= 0: the file was damaged or edited" in seen[name][1], (name, seen[name])


def test_the_loader_open_names_a_damaged_field(tmp_path, datasets):
    ds = _damaged(tmp_path, datasets)
    _edit(ds / "dataset_metadata.json", lambda m: m["splits"].update(val="<|EOS|>"))
    with pytest.raises(DatasetError, match=r"dataset_metadata.json \(splits.val\): splits.val is a string, not "
                                           r"a JSON object"):
        open_dataset(ds)


# ------------------------------------------------------------------ the fuzz test
def _fuzz(datasets, tmp_path, kind: str, count: int, seed0: int) -> None:
    failures = []
    ds, base = tmp_path / kind, datasets[kind]
    for i in range(count):
        if ds.exists():
            shutil.rmtree(ds)
        shutil.copytree(base, ds)
        rng = np.random.default_rng(seed0 + i)
        what = mutate(ds, rng)
        try:  # the loader's open, and its first batch
            open_dataset(ds)
            make_loader(LOADER, ds, backend="numpy").batch_at("train", 0)
        except SftDataError:
            pass
        except Exception as e:  # noqa: BLE001 - the point: anything else is a finding
            failures.append(f"seed {seed0 + i}: {what}: the loader: {type(e).__name__}: {e}")
        args = READERS[i % len(READERS)]
        out = tmp_path / f"out{i}"
        why = _clean_outcome(_invoke(args, ds, out))
        if why is not None:
            failures.append(f"seed {seed0 + i}: {what}: {' '.join(args)}: {why}")
    assert failures == [], "\n".join(failures)


@pytest.mark.parametrize("kind", list(MUTATIONS))
def test_fuzz_every_reader_ends_cleanly_on_any_damage(tmp_path, datasets, kind):
    _fuzz(datasets, tmp_path, kind, MUTATIONS[kind], {"episodes": 0, "model": 10_000, "packed": 100_000, "pairs": 200_000}[kind])


def test_a_model_tokenizers_added_token_that_is_not_an_id_is_named(tmp_path, datasets):
    """Found by the fuzzer (seed 50089 of a longer run): an added token "junk": "x" in a model's state."""
    ds = tmp_path / "model"
    shutil.copytree(datasets["model"], ds)
    _edit(ds / "tokenizer_state.json", lambda s: s["added_tokens"].update(junk="x"))
    seen = _every_reader(ds, tmp_path)
    for name in ("pack", "export", "report", "inspect"):
        assert seen[name][0] == 1 and "tokenizer_state.json (added_tokens.junk): added_tokens.junk is a string, not " \
            "a token id" in seen[name][1], (name, seen[name])
