"""verify --retokenize N renders the input records of N sampled episodes again with the
libraries installed now: a planted library drift is caught and named (the first record,
file:line, and the versions then and now)."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.chat.tokenizer import load_tokenizer
from sftdata.cli import app
from sftdata.prepare import PrepareOptions, prepare
from sftdata.prepare.rerender import rerender_records
from sftdata.store import open_dataset
from sftdata.tokenize import joined, ranks
from sftdata.tokenize.ranks import arrays_to_ranks, ranks_to_arrays
from sftdata.util.cache import CACHE_ENV, decode_entry, encode_entry
from sftdata.verify import drift, verify
from tests.helpers.data import chat, write_jsonl

runner = CliRunner()
NOW = drift.library_versions()


@pytest.fixture
def made(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"What is {i} plus {i}?", f"It is {2 * i}, of course.")
                                              for i in range(10)])
    prepare([src], tmp_path / "ds", PrepareOptions(val_split=0.2))
    return src, tmp_path / "ds"


def test_an_unchanged_library_renders_every_sampled_record_alike(made):
    _, ds = made
    r = verify(ds, retokenize_episodes=6, rerender=rerender_records)
    assert r.ok and {c.name: c.status for c in r.checks}["drift"] == "ok"
    assert (r.drift["episodes"], r.drift["differ"], r.drift["unread"]) == (6, 0, 0)
    assert r.drift["then"] == r.drift["now"]


def _plant_drift(monkeypatch):
    """The tokenizer library now encodes " course" (in every reply) as the id after its own."""
    course = load_tokenizer().encode(" course")
    assert len(course) == 1
    real = joined.JoinedEncoder.encode

    def encode(self, text, placed):
        ids = real(self, text, placed)
        return None if ids is None else np.where(ids == course[0], course[0] + 1, ids).astype(ids.dtype)

    monkeypatch.setattr(joined.JoinedEncoder, "encode", encode)
    monkeypatch.setattr(drift, "library_versions", lambda: {**NOW, "tiktoken": "99.0"})
    return course[0]


def test_verify_retokenize_catches_a_planted_library_drift(made, monkeypatch):
    src, ds = made
    then = orjson.loads((ds / "dataset_metadata.json").read_bytes())["build"]["libraries"]
    course = _plant_drift(monkeypatch)
    r = verify(ds, retokenize_episodes=10, rerender=rerender_records)
    assert not r.ok and [p.check for p in r.problems] == ["drift"]
    assert (r.drift["episodes"], r.drift["differ"], r.drift["then"]) == (10, 10, then)
    p = r.problems[0]  # the first record in input order: record 0, line 1
    sources = np.fromfile(ds / "train" / "shard_00000" / "sources.idx", dtype="<u8").tolist()
    split, gid = ("train", sources.index(0)) if 0 in sources else ("val", 0)
    shard = ds / split / "shard_00000"
    start, length = (int(v) for v in np.fromfile(shard / "episodes.idx", dtype="<u8").reshape(-1, 2)[gid])
    ep = np.fromfile(shard / "tokens.bin", dtype="<u4")[start:start + length].tolist()
    j = ep.index(course)
    assert p.file == f"{split}/shard_00000/tokens.bin" and p.where == f"episode {gid}, input record {src}:line 1"
    assert p.message == (
        f"input record {src}:line 1 renders otherwise now: episode {gid} ({split}) stores {length:,} tokens, the render "
        f"now {length:,}; from token {j} stored {ep[j:j + 4]}, now {[course + 1, *ep[j + 1:j + 4]]} (9 more sampled "
        f"episode(s) differ); made with -> now: tiktoken {then['tiktoken']} -> 99.0")


def test_the_cli_names_the_drift_and_exits_1(made, monkeypatch):
    src, ds = made
    _plant_drift(monkeypatch)
    res = runner.invoke(app, ["verify", str(ds), "--retokenize", "3", "--json"])
    assert res.exit_code == 1
    out = json.loads(res.stdout)
    assert [p["check"] for p in out["problems"]] == ["drift"] and out["drift"]["differ"] == 3
    assert out["drift"]["now"]["tiktoken"] == "99.0"
    assert out["problems"][0]["message"].startswith(f"input record {src}:line ")


def test_a_changed_input_is_not_rendered_again_and_says_why(made):
    src, ds = made
    src.write_text(src.read_text().replace("plus", "and"))
    r = verify(ds, retokenize_episodes=4, rerender=rerender_records)
    assert r.ok and r.drift["unread"] == 4 and r.drift["episodes"] == 0
    assert {c.name: c.note for c in r.checks}["drift"].startswith(
        "no sampled record could be read again: record ")
    assert f"its input {src} changed since prepare read it (sha256 " in {c.name: c.note for c in r.checks}["drift"]


def test_without_the_renderer_the_check_is_skipped_and_says_how(made):
    _, ds = made
    r = verify(ds, retokenize_episodes=2)
    assert {c.name: (c.status, c.note) for c in r.checks}["drift"] == ("skipped", drift.NO_RERENDER)


def test_a_dataset_made_through_a_poisoned_ranks_cache_is_caught_and_no_longer_made(tmp_path, monkeypatch):
    """A cached ranks table with two ranks swapped (a whole entry, sealed again, its recorded
    ranks sha256 kept) made a dataset that reads "What is the Paris of France?" under an
    sftdata that trusted its cache (here: the entry's check switched off). verify
    --retokenize reads no cache: with the poisoned entry still there, it renders the
    records again from the bundled ranks and names every sampled episode. With the check
    on, prepare rebuilds the table from the bundled file: the dataset is the one made with
    no cache at all."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    right = load_tokenizer()
    (entry,) = cache.iterdir()
    meta, arrays = decode_entry(entry.read_bytes())
    table = arrays_to_ranks(arrays)
    table[b" capital"], table[b" Paris"] = table[b" Paris"], table[b" capital"]
    poisoned = encode_entry(meta, ranks_to_arrays(table))
    entry.write_bytes(poisoned)
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"What is the capital of France? ({i})", "It is Paris.")
                                              for i in range(6)])
    with monkeypatch.context() as trusting:
        trusting.setattr(ranks, "_is_file", lambda *_: True)
        prepare([src], tmp_path / "bad", PrepareOptions())
        bad = open_dataset(tmp_path / "bad").split("train")
        assert right.decode(bad.episode(0)[0].tolist()).startswith("<|USER|>What is the Paris of France? (")
        r = verify(tmp_path / "bad", retokenize_episodes=4, sources=True, rerender=rerender_records)
    assert entry.read_bytes() == poisoned  # verify neither read nor mended it
    assert [p.check for p in r.problems] == ["drift"] and (r.drift["episodes"], r.drift["differ"]) == (4, 4)
    assert r.reproducible is True  # the inputs are the ones read: the tokens are what is wrong
    prepare([src], tmp_path / "good", PrepareOptions())  # the entry checked against the bundled file: rebuilt
    monkeypatch.setenv(CACHE_ENV, "off")
    prepare([src], tmp_path / "uncached", PrepareOptions())
    assert _tree(tmp_path / "good") == _tree(tmp_path / "uncached")
    assert verify(tmp_path / "good", retokenize_episodes=4, sources=True, rerender=rerender_records).ok


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
