"""Per reply, automatically: under Qwen3's own template (TRL's ``qwen3.jinja``, read from the
installed wheel) a record with reasoning in an earlier reply is rewritten by the whole
render, so it becomes one episode per reply without an option, each flagged "last reply
only" (``last_reply.bin``), while a plain multi-turn record in the same file stays one
episode. The oracle is transformers' ``apply_chat_template`` of each prefix; verify and
pack re-derive every mask from the ids and the flags.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.store import open_dataset
from sftdata.store.format import LAST_REPLY_FILE, decode_segments
from sftdata.verify import verify
from tests.helpers.data import write_jsonl
from tests.helpers.zoo import trl_model_folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the proof extra)")
trl = pytest.importorskip("trl", reason="trl is not installed: its wheel ships Qwen3's template")

THINK = {"messages": [{"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4.", "reasoning_content": "add them"},
                      {"role": "user", "content": "3+3?"},
                      {"role": "assistant", "content": "6.", "reasoning_content": "add again"}]}
PLAIN = {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
                      {"role": "user", "content": "How are you?"}, {"role": "assistant", "content": "Well, thanks."}]}
RECORDS = [PLAIN, THINK, PLAIN, THINK]  # episodes: 1 + 2 + 1 + 2


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """A model folder with TRL's Qwen3 template and a tokenizer holding its markers."""
    out = trl_model_folder(tmp_path_factory.mktemp("qwen3") / "model", "qwen3", RECORDS)
    if out is None:
        pytest.skip(f"trl {trl.__version__} ships no qwen3.jinja")
    return out, transformers.AutoTokenizer.from_pretrained(str(out))


@pytest.fixture(scope="module")
def prepared(qwen3, tmp_path_factory):
    """The dataset of RECORDS at 1 and at 2 workers, and its --json summary."""
    folder, _ = qwen3
    tmp = tmp_path_factory.mktemp("ds")
    src = write_jsonl(tmp / "mixed.jsonl", RECORDS)
    outs = {}
    for workers in (1, 2):
        r = run("prepare-chat", src, "-o", tmp / f"w{workers}", "--tokenizer", folder, "--workers", workers, "--json")
        assert r.exit_code == 0, r.output
        outs[workers] = json.loads(r.stdout)
    return tmp / "w1", tmp / "w2", outs[1]


def _episodes(ds: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    sp = open_dataset(ds).split("train")
    return [tuple(np.asarray(a) for a in sp.episode(i)) for i in range(sp.num_episodes)]


def test_a_record_the_whole_render_rewrites_becomes_one_episode_per_reply_as_transformers_renders_it(prepared, qwen3):
    ds, _, summary = prepared
    _, hf = qwen3
    assert (summary["per_reply_records"], summary["per_reply_episodes"], summary["per_reply_automatic"]) == (2, 4, 2)
    assert summary["episodes"] == {"train": 6} and summary["rejected"] == {}
    meta = orjson.loads((ds / "dataset_metadata.json").read_bytes())
    assert meta["format_version"] == 3 and meta["splits"]["train"]["last_reply_only"] == 4
    assert meta["counts"]["per_reply_automatic"] == 2
    flags = np.fromfile(ds / "train" / "shard_00000" / LAST_REPLY_FILE, dtype=np.uint8)
    assert flags.tolist() == [0, 1, 1, 0, 1, 1]
    eps = _episodes(ds)
    think = THINK["messages"]
    expected = [(PLAIN["messages"], ["Hello!", "Well, thanks."]), (think[:2], ["add them", "4."]),
                (think, ["add again", "6."])]
    for (ids, mask), (messages, trained) in zip(eps[:3], expected):
        assert ids.tolist() == list(hf.apply_chat_template(messages, tokenize=True, return_dict=False))
        runs = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))).reshape(-1, 2)
        texts = [hf.decode(ids[a:b].tolist()) for a, b in runs]
        assert len(texts) == (2 if messages is PLAIN["messages"] else 1)  # the plain record: every reply trained
        assert all(t.endswith("<|im_end|>") for t in texts)
        joined = "".join(texts)
        assert all(t in joined for t in trained)
    # the second episode holds the first reply as the template shows it in history (no reasoning), untrained
    ids, mask = eps[2]
    assert "add them" not in hf.decode(ids.tolist()) and "4." in hf.decode(ids[mask == 0].tolist())


def test_one_and_two_workers_write_the_same_bytes(prepared):
    a, b, _ = prepared
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name != "dataset_metadata.json")
    assert Path("train/shard_00000") / LAST_REPLY_FILE in files
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file() and p.name != "dataset_metadata.json")
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    ma, mb = (orjson.loads((d / "dataset_metadata.json").read_bytes()) for d in (a, b))
    assert ma["splits"] == mb["splits"] and ma["counts"] == mb["counts"]


def test_verify_rederives_each_mask_with_its_flag_and_fails_when_a_flag_is_flipped(prepared, tmp_path):
    ds, _, _ = prepared
    assert run("verify", ds).exit_code == 0
    bad = tmp_path / "bad"
    shutil.copytree(ds, bad)
    path = bad / "train" / "shard_00000" / LAST_REPLY_FILE
    flags = np.fromfile(path, dtype=np.uint8)
    flags[2] = 0  # the second reply's episode, now read as training every reply
    flags.tofile(path)
    problems = [p for p in verify(bad).problems if p.check == "mask_rule"]
    assert [(p.file, p.episode) for p in problems] == [("train/shard_00000/mask.bin", 2)]
    assert problems[0].message.startswith("the mask of episode 2 ")
    assert run("verify", bad).exit_code == 1


def test_pack_keeps_every_mask_and_carries_the_flags_per_segment(prepared, tmp_path):
    ds, _, _ = prepared
    r = run("pack", ds, "-o", tmp_path / "p", "--block-size", 512)
    assert r.exit_code == 0, r.output
    eps = _episodes(ds)
    packed = open_dataset(tmp_path / "p")
    sp = packed.split("train")
    meta = orjson.loads((tmp_path / "p" / "dataset_metadata.json").read_bytes())
    assert meta["format_version"] == 3 and meta["splits"]["train"]["last_reply_only"] == 4
    seen = []
    for sh in sp.shards:
        seg = decode_segments(sh.segments)
        flags = sh.last_only()
        L = meta["packing"]["row_len"]
        for k in range(len(seg.row)):
            row, off, n, ep = int(seg.row[k]), int(seg.offset[k]), int(seg.length[k]), int(seg.episode[k])
            assert int(seg.episode_start[k]) == 0 and n == eps[ep][0].shape[0]  # whole episodes
            assert np.array_equal(np.asarray(sh.mask[row * L + off:row * L + off + n]), eps[ep][1])
            assert np.array_equal(np.asarray(sh.tokens[row * L + off:row * L + off + n]), eps[ep][0])
            seen.append((ep, bool(flags[k])))
    assert sorted(seen) == [(0, False), (1, True), (2, True), (3, False), (4, True), (5, True)]
    assert run("verify", tmp_path / "p").exit_code == 0
    r = run("inspect", tmp_path / "p", "--row", 0, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["rows"][0]["rule_differs_at"] == []  # the flags per segment
    r = run("pack", ds, "-o", tmp_path / "s", "--block-size", 512, "--strategy", "stream")
    assert r.exit_code == 2 and "trains only the last reply of 4 episode(s) of split train" in r.output


def test_a_dataset_without_flagged_episodes_is_written_and_read_as_before(qwen3, tmp_path):
    """Only plain records: no last_reply.bin, format_version 1, and it verifies (as every
    older dataset, which has no such file, does)."""
    folder, _ = qwen3
    src = write_jsonl(tmp_path / "plain.jsonl", [PLAIN] * 3)
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", folder, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["per_reply_automatic"] == 0
    meta = orjson.loads((tmp_path / "ds" / "dataset_metadata.json").read_bytes())
    assert meta["format_version"] == 1 and "last_reply_only" not in meta["splits"]["train"]
    assert not list((tmp_path / "ds").rglob(LAST_REPLY_FILE))
    assert run("verify", tmp_path / "ds").exit_code == 0
    r = run("pack", tmp_path / "ds", "-o", tmp_path / "p", "--block-size", 512, "--strategy", "stream")
    assert r.exit_code == 0, r.output
    assert orjson.loads((tmp_path / "p" / "dataset_metadata.json").read_bytes())["format_version"] == 1


def test_inspect_shows_the_flag_and_finds_no_difference_from_the_rule(prepared):
    ds, _, _ = prepared
    r = run("inspect", ds, "--episode", 2, "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)["episodes"][0]
    assert shown["last_reply_only"] is True and shown["rule_differs_at"] == []
    r = run("inspect", ds, "--episode", 0, "--json")
    shown = json.loads(r.stdout)["episodes"][0]
    assert shown["last_reply_only"] is False and shown["rule_differs_at"] == []
    r = run("inspect", ds, "--episode", 2)
    assert r.exit_code == 0 and "last reply only (one episode per reply" in r.output


def test_a_flagged_dataset_mixes_with_a_plain_one_of_the_same_tokenizer(prepared, qwen3, tmp_path):
    ds, _, _ = prepared
    folder, _ = qwen3
    src = write_jsonl(tmp_path / "plain.jsonl", [PLAIN] * 3)
    assert run("prepare-chat", src, "-o", tmp_path / "plain", "--tokenizer", folder, "-q").exit_code == 0
    r = run("mix", f"a={ds}:1", f"b={tmp_path / 'plain'}:1", "-o", tmp_path / "mix.json")
    assert r.exit_code == 0, r.output


def test_a_damaged_flags_file_is_a_problem_named_by_verify(prepared, tmp_path):
    ds, _, _ = prepared
    bad = tmp_path / "bad"
    shutil.copytree(ds, bad)
    path = bad / "train" / "shard_00000" / LAST_REPLY_FILE
    path.write_bytes(path.read_bytes()[:4])  # 4 flags for 6 episodes
    sizes = [p.message for p in verify(bad).problems if p.check == "sizes"]
    assert "4 last-reply flags for 6 episodes: there must be exactly one per item" in sizes
