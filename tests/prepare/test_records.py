"""Reasoning, per-turn weight and the policies through the whole pipeline: prepare counts
them, verify re-derives every mask, pack and the loader read them; a dataset written
before the added markers existed still loads, verifies and packs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sftdata.chat.markers import CHAT_MARKERS
from sftdata.chat.masking import loss_mask
from sftdata.chat.tokenizer import recorded_tokenizer
from sftdata.cli import app
from sftdata.loader import LoaderConfig, make_loader
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.report.views import episode_view
from sftdata.store import open_dataset
from sftdata.verify import verify
from tests.helpers.data import write_jsonl
from tests.helpers.paths import FIXTURES

RECORDS = [
    {"messages": [{"role": "user", "content": "Is 91 prime?"},
                  {"role": "assistant", "reasoning_content": "91 = 7 x 13.", "content": "No."}]},
    {"messages": [{"role": "user", "content": "Legs of a spider?"}, {"role": "assistant", "content": "Six.", "weight": 0},
                  {"role": "user", "content": "Sure?"},
                  {"role": "assistant", "content": "<think>Count again.</think>Eight."}]},
    {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!", "train": False},
                       {"from": "human", "value": "Shorter"}, {"from": "gpt", "value": "Hi."}]},
    {"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "thinking": "t1", "content": "A1"},
                  {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "<think>\n</think>\nA2"}]},
    {"messages": [{"role": "user", "content": "Secret?"}, {"role": "assistant", "content": None, "refusal": "No."}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "<think>never closed"}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 2}]},
]
NO_TURNS = {"reasoning_kept": 0, "reasoning_dropped": 0, "reasoning_empty": 0, "reasoning_inline": 0,
            "reasoning_ignored_by_template": 0, "untrained_weight_0": 0, "untrained_train_on_last": 0}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("records") / "in.jsonl", RECORDS)


@pytest.mark.parametrize("reasoning, train_on, turns", [
    ("keep", "all", dict(NO_TURNS, reasoning_kept=3, reasoning_empty=1, untrained_weight_0=2)),
    ("last", "all", dict(NO_TURNS, reasoning_kept=2, reasoning_dropped=1, reasoning_empty=1, untrained_weight_0=2)),
    ("drop", "last", dict(NO_TURNS, reasoning_dropped=3, reasoning_empty=1, untrained_weight_0=2,
                          untrained_train_on_last=1)),
    ("inline", "all", dict(NO_TURNS, reasoning_inline=3, reasoning_empty=1, untrained_weight_0=2)),
])
def test_prepare_counts_every_reasoning_block_and_untrained_turn(src, tmp_path, reasoning, train_on, turns):
    s = prepare([src], tmp_path / "ds", PrepareOptions(workers=1, reasoning=reasoning, train_on=train_on))
    assert s.turns == turns and s.as_dict()["turns"] == turns
    assert s.rejected == {"invalid_weight": 1, "unclosed_think": 1}
    assert s.repaired == {"reasoning_from_think_tags": 2, "refusal_as_reply": 1}
    meta = json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())
    assert meta["counts"]["turns"] == turns
    assert (meta["options"]["reasoning"], meta["options"]["train_on"]) == (reasoning, train_on)
    assert verify(tmp_path / "ds").ok


def test_workers_give_the_same_bytes_and_counts(src, tmp_path):
    a = prepare([src], tmp_path / "a", PrepareOptions(workers=1, reasoning="last", train_on="last"))
    b = prepare([src], tmp_path / "b", PrepareOptions(workers=2, reasoning="last", train_on="last"))
    assert a.turns == b.turns
    for f in ("train/shard_00000/tokens.bin", "train/shard_00000/mask.bin", "dataset_metadata.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_verify_rederives_every_mask_and_catches_a_trained_context_turn(src, tmp_path):
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    ds = open_dataset(tmp_path / "ds")
    tok = recorded_tokenizer(ds.root, ds.tokenizer_state)
    sp = ds.split("train")
    ids_all = []
    for g in range(sp.num_episodes):
        ids, mask = sp.episode(g)
        ids_all.append(np.asarray(ids))
        np.testing.assert_array_equal(loss_mask(np.asarray(ids), tok.ids), np.asarray(mask))
    flat = np.concatenate(ids_all)
    assert np.count_nonzero(flat == tok.ids.think) == 3 and np.count_nonzero(flat == tok.ids.assistant_context) == 2
    report = verify(tmp_path / "ds")
    assert report.ok and {c.name: c.status for c in report.checks}["mask_rule"] == "ok"
    # train the weight-0 turn of episode 1 by hand: verify sees the mask is not the rule's
    shard = tmp_path / "ds" / "train" / "shard_00000"
    tokens = np.fromfile(shard / "tokens.bin", dtype="<u4")
    mask = np.fromfile(shard / "mask.bin", dtype=np.uint8)
    ctx = int(np.flatnonzero(tokens == tok.ids.assistant_context)[0])
    mask[ctx:ctx + 3] = 1
    mask.tofile(shard / "mask.bin")
    problems = [p for p in verify(tmp_path / "ds", quick=True).problems if p.check == "mask_rule"]
    assert len(problems) == 1 and problems[0].message == (
        "the mask of episode 1 trains 3 token(s) the mask rule leaves untrained (first: token 8, in a "
        "<|ASSISTANT_CONTEXT|> span)")


@pytest.mark.parametrize("strategy", ["bfd", "stream"])
def test_pack_and_the_loader_keep_context_turns_untrained(src, tmp_path, strategy):
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    report = pack(tmp_path / "ds", tmp_path / "packed", PackOptions(block_size=24, strategy=strategy))
    assert report is not None and verify(tmp_path / "packed").ok
    tok = recorded_tokenizer(tmp_path / "ds", open_dataset(tmp_path / "ds").tokenizer_state)
    loader = make_loader(LoaderConfig(batch_size=2, block_size=24, use_loss_mask=True, epoch_shuffle=False),
                         tmp_path / "packed", backend="numpy")
    shard = tmp_path / "packed" / "train" / "shard_00000"
    toks = np.fromfile(shard / "tokens.bin", dtype="<u4")
    masks = np.fromfile(shard / "mask.bin", dtype=np.uint8)
    ends = np.flatnonzero(toks == tok.ids.end)
    ctx = np.flatnonzero(toks == tok.ids.assistant_context)
    assert ctx.size == 2  # both context turns fit in rows whole: the span through its END is untrained
    for p in ctx:
        assert not masks[p:ends[ends > p][0] + 1].any()
    if strategy == "bfd":  # whole episodes: the reasoning of every trained turn is trained
        assert masks[toks == tok.ids.think].all()
    for _ in range(2):  # one pass
        b = loader.get_batch("train")
        assert b.x.shape == (2, 24) and not np.asarray(b.mask)[np.asarray(b.y) == tok.ids.assistant_context].any()


def test_inspect_names_the_context_span(src, tmp_path):
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    ds = open_dataset(tmp_path / "ds")
    v = episode_view(ds, "train", 1, recorded_tokenizer(ds.root, ds.tokenizer_state), tokens=True)
    ctx = next(t for t in v.tokens if t.text == "<|ASSISTANT_CONTEXT|>")
    assert ctx.span == "assistant" and not ctx.trained and v.rule_differs_at == []
    assert [p.text for p in v.pieces if p.marker][:4] == ["<|USER|>", "<|END|>", "<|ASSISTANT_CONTEXT|>", "<|END|>"]


# -- a dataset written before the added markers existed ------------------------------------------------
@pytest.fixture
def six_marker_dataset(tmp_path):
    """tests/fixtures/six_markers_dataset: written by the previous version from
    six_markers_dataset.jsonl (its weight-0 turn was then trained and counted as
    weight_0_ignored); tokenizer_state.json holds the six markers and EOS."""
    out = tmp_path / "old"
    shutil.copytree(FIXTURES / "six_markers_dataset", out)
    return out


def test_a_six_marker_dataset_loads_verifies_and_packs(six_marker_dataset, tmp_path):
    ds = open_dataset(six_marker_dataset)
    tok = recorded_tokenizer(ds.root, ds.tokenizer_state)
    assert tok.markers == CHAT_MARKERS and tok.vocab_size == 100283
    assert (tok.ids.think, tok.ids.assistant_context) == (None, None)
    report = verify(six_marker_dataset)
    assert report.ok, [str(p) for p in report.problems]
    assert {c.name: c.status for c in report.checks}["mask_rule"] == "ok"
    loader = make_loader(LoaderConfig(batch_size=2, block_size=16, use_loss_mask=True), six_marker_dataset,
                         backend="numpy")
    assert loader.get_batch("train").x.shape == (2, 16)
    pack(six_marker_dataset, tmp_path / "packed", PackOptions(block_size=32))
    assert verify(tmp_path / "packed").ok
    packed_state = json.loads((tmp_path / "packed" / "tokenizer_state.json").read_text())
    assert sorted(packed_state["special_tokens"]) == sorted([*CHAT_MARKERS, "<|EOS|>"])


def test_a_six_marker_dataset_has_the_ids_this_version_writes_for_plain_chats(six_marker_dataset, tmp_path):
    """The added markers moved no id: re-preparing the same plain records gives the same
    tokens (the record with weight 0 aside, now context)."""
    src = FIXTURES / "six_markers_dataset.jsonl"
    lines = src.read_text().splitlines()
    plain = write_jsonl(tmp_path / "plain.jsonl", [json.loads(x) for i, x in enumerate(lines) if i != 2])
    prepare([plain], tmp_path / "new", PrepareOptions(workers=1))
    old, new = open_dataset(six_marker_dataset).split("train"), open_dataset(tmp_path / "new").split("train")
    for g_old, g_new in ((0, 0), (1, 1), (3, 2)):
        assert np.asarray(old.episode(g_old)[0]).tolist() == np.asarray(new.episode(g_new)[0]).tolist()
        assert np.asarray(old.episode(g_old)[1]).tolist() == np.asarray(new.episode(g_new)[1]).tolist()


def test_cli_flags(src, tmp_path):
    from typer.testing import CliRunner

    runner = CliRunner()
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "-j", "1", "--json",
                            "--reasoning", "drop", "--train-on", "last"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["turns"]["untrained_train_on_last"] == 1
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds2"), "-j", "1"])
    assert r.exit_code == 0 and "assistant turns: untrained_weight_0" in r.output
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "x"), "--reasoning", "some"])
    assert r.exit_code == 2 and "--reasoning must be one of keep, last, drop, inline, not 'some'" in r.output
    r = runner.invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / "x"), "--train-on", "first"])
    assert r.exit_code == 2 and "--train-on must be one of all, last, not 'first'" in r.output
    assert not (tmp_path / "x").exists()
