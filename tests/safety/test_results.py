"""A result that cannot train is an error, sizes are checked before allocating, the loader
refuses ids past the vocabulary and mask values other than 0/1, and what the CLI adds
around writing (--wait, clean): each case with its exit status and exact message."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.chat import render as render_mod
from sftdata.chat.markers import MarkerIds
from sftdata.cli import app
from sftdata.errors import ConfigError, DatasetError, NothingToTrainError
from sftdata.loader import make_loader
from sftdata.loader.guards import BATCH_BYTES_PER_CELL
from sftdata.order.config import LoaderConfig
from sftdata.pack import run as pack_mod
from sftdata.pack.run import ROW_BYTES_PER_TOKEN, PackOptions, pack
from sftdata.packing.block_size import TrainedSpans, min_block_size, smallest_row_len, trained_spans
from sftdata.packing.plan import MIN_BLOCK_SIZE
from sftdata.packing.strategies import plan_bfd
from sftdata.prepare import PrepareOptions, prepare
from sftdata.storage.leftovers import find_leftovers
from sftdata.storage.lock import OWNER_FILE, WriterLock, owner_record
from sftdata.store import METADATA_FILE, TOKENIZER_FILE, open_dataset, split_segments
from sftdata.store.format import PARTS_DIR, REJECTS_FILE, SERVING_FILE, STAGING_SPLIT
from sftdata.store.writer import DatasetWriter
from sftdata.util import memory
from tests.helpers.data import chat, write_jsonl
from tests.helpers.packing import M, build, random_episode
from tests.helpers.paths import ROOT
from tests.helpers.processes import SAFETY_S, read_line

runner = CliRunner()
S, U, A, T, E, EOS = M.system, M.user, M.assistant, M.tool, M.end, M.eos
GiB = 1 << 30


def _run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output
    return r


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _meta(ds: Path) -> dict:
    return orjson.loads((ds / METADATA_FILE).read_bytes())


def _edit_meta(ds: Path, fn) -> None:
    meta = _meta(ds)
    fn(meta)
    (ds / METADATA_FILE).write_bytes(orjson.dumps(meta))


@pytest.fixture(scope="module")
def chat_ds(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat")
    src = write_jsonl(d / "chats.jsonl", [chat(f"question {i} " * (1 + i % 5), f"answer {i} " * (2 + i % 7))
                                          for i in range(40)])
    prepare([src], d / "ds", PrepareOptions(workers=1))
    return d / "ds"


@pytest.fixture(scope="module")
def agent_ds(tmp_path_factory):
    """Identical agent-like episodes: a long system prompt, then one short exchange."""
    d = tmp_path_factory.mktemp("agent")
    system = "You are a careful agent. " * 40
    src = write_jsonl(d / "agent.jsonl", [chat("list the files", "ls -la", system=system) for _ in range(12)])
    prepare([src], d / "ds", PrepareOptions(workers=1))
    return d / "ds"


def _all_episodes(ds: Path) -> tuple[np.ndarray, np.ndarray, MarkerIds]:
    """The train episodes laid end to end, their lengths, and the dataset's markers."""
    opened = open_dataset(ds)
    split = opened.split("train")
    toks = np.concatenate([np.asarray(split.episode(i)[0]) for i in range(split.num_episodes)]).astype(np.int64)
    return toks, split.lengths, MarkerIds.from_special_tokens(opened.tokenizer_state["special_tokens"])


def _episode0(ds: Path) -> np.ndarray:
    return np.asarray(open_dataset(ds).split("train").episode(0)[0]).astype(np.int64)


# ============================================================ keep_end (pure, exact)

def test_keep_end_keeps_the_last_row_len_tokens_and_the_rule_decides_the_mask():
    ep = np.array([S, 1, 2, E, U, 3, E, A, 4, E, EOS])  # 11 tokens; A 4 E trained
    plan = plan_bfd(np.array([ep.size]), row_len=7, overlong="keep_end")
    seg = plan.segments
    assert (seg.episode.tolist(), seg.episode_start.tolist(), seg.take.tolist()) == ([0], [4], [7])
    rows = build(plan, [ep])
    assert rows.tokens.tolist() == [[U, 3, E, A, 4, E, EOS]]
    assert rows.mask.tolist() == [[0, 0, 0, 1, 1, 1, 0]]
    assert plan.tokens_lost == 4 and plan.overlong_episodes == 1 and plan.whole_episodes().tolist() == [False]


def test_keep_end_cut_inside_the_user_span_leaves_its_reply_untrained():
    ep = np.array([S, 1, 2, E, U, 3, E, A, 4, E, EOS])
    rows = build(plan_bfd(np.array([ep.size]), row_len=6, overlong="keep_end"), [ep])
    assert rows.tokens.tolist() == [[3, E, A, 4, E, EOS]]
    assert rows.mask.tolist() == [[0, 0, 0, 0, 0, 0]]  # the user opener is cut: no complete context


def test_keep_end_cut_inside_an_assistant_span_leaves_that_span_untrained_and_trains_the_later_one():
    ep = np.array([U, 1, E, A, 2, 3, 4, E, U, 5, E, A, 6, E, EOS])  # 15 tokens, two trained replies
    rows = build(plan_bfd(np.array([ep.size]), row_len=10, overlong="keep_end"), [ep])
    assert rows.tokens.tolist() == [[3, 4, E, U, 5, E, A, 6, E, EOS]]  # A 2 was cut: its opener is gone
    assert rows.mask.tolist() == [[0, 0, 0, 0, 0, 0, 1, 1, 1, 0]]


def test_keep_end_leaves_short_episodes_whole_and_mixes_with_them_in_rows():
    short = np.array([U, 1, E, A, 2, E, EOS])
    long = np.array([S, 9, 9, 9, 9, E, U, 3, E, A, 4, E, EOS])  # 13 tokens
    plan = plan_bfd(np.array([short.size, long.size]), row_len=8, overlong="keep_end", seed=0)
    rows = build(plan, [short, long])
    seg = plan.segments
    by_ep = {int(e): (int(s), int(t)) for e, s, t in zip(seg.episode, seg.episode_start, seg.take)}
    assert by_ep == {0: (0, 7), 1: (5, 8)}
    assert int(rows.mask.sum()) == 3 + 3


# ============================================ the smallest block size (pure, exact)

def test_trained_spans_and_the_block_size_each_overlong_mode_needs():
    ep = np.array([S, 1, E, U, 2, E, A, 3, E, U, 4, E, A, 5, E, EOS])  # the module docstring's example
    sp = trained_spans(ep, np.array([16]), M)
    assert sp.tokens.tolist() == [3, 3]
    assert (sp.need_head.tolist(), sp.need_tail.tolist(), sp.need_whole.tolist()) == ([9, 15], [13, 7], [16, 16])
    assert [min_block_size(sp, o) for o in ("truncate", "keep_end", "drop", "split")] == [14, 12, 15, 14]
    assert [min_block_size(sp, o, percent=50) for o in ("truncate", "keep_end", "drop")] == [8, 6, 15]


def test_smallest_row_len_is_exact_in_integers():
    need, weight = np.array([5, 9, 3, 20]), np.array([50, 40, 9, 1])
    assert smallest_row_len(need, weight, 99) == 9  # 99 of 100 tokens need rows of 9
    assert smallest_row_len(need, weight, 100) == 20
    assert smallest_row_len(need, weight, 59) == 5  # 59 = 9 + 50
    assert smallest_row_len(need, weight, 60) == 9
    assert smallest_row_len(np.array([], np.int64), np.array([], np.int64)) == 0
    assert min_block_size(TrainedSpans.empty(), "truncate") is None


def test_the_block_size_never_goes_below_the_minimum():
    sp = trained_spans(np.array([U, E, A, E, EOS]), np.array([5]), M)
    assert sp.need_head.tolist() == [4] and min_block_size(sp, "truncate") == MIN_BLOCK_SIZE == 3


@pytest.mark.parametrize("seed", range(12))
def test_the_needs_are_exactly_what_bfd_keeps_at_every_row_length(seed):
    rng = np.random.default_rng(seed)
    eps = [random_episode(rng) for _ in range(int(rng.integers(1, 12)))]
    lengths = np.array([e.size for e in eps])
    sp = trained_spans(np.concatenate(eps), lengths, M)
    assert sp.total == sum(int(build(plan_bfd(np.array([e.size]), e.size + 1), [e]).mask.sum()) for e in eps)
    for row_len in sorted(set(rng.integers(4, int(lengths.max()) + 3, 6).tolist())):
        for mode in ("truncate", "keep_end", "drop", "split"):
            kept = int(build(plan_bfd(lengths, row_len, mode, seed=seed), eps).mask.sum())
            want = int(sp.tokens[sp.need(mode) <= row_len].sum())
            assert kept >= want if mode == "split" else kept == want, (mode, row_len)
    for mode in ("truncate", "keep_end", "drop"):
        b = min_block_size(sp, mode)
        kept = int(build(plan_bfd(lengths, b + 1, mode), eps).mask.sum())
        assert kept * 100 >= 99 * sp.total
        if b > MIN_BLOCK_SIZE:
            less = int(build(plan_bfd(lengths, b, mode), eps).mask.sum())
            assert less * 100 < 99 * sp.total


# ======================================================= pack refuses useless results

def test_pack_drop_leaving_no_row_is_refused_and_leaves_nothing(chat_ds, tmp_path):
    out = tmp_path / "p"
    r = _run("pack", chat_ds, "-o", out, "-b", "8", "--overlong", "drop")
    sp = trained_spans(*_all_episodes(chat_ds))
    drop = min_block_size(sp, "drop")
    assert min_block_size(sp, "keep_end") == drop  # one exchange, no system span: keep_end is no better (not named)
    assert r.exit_code == 1
    assert r.output == (f"error: pack would write 0 rows for train: --overlong drop leaves out all 40 episodes, each "
                        f"longer than a row of 9 tokens (--block-size 8); nothing was written to {out}. --block-size "
                        f"{drop} keeps 99% of the trained tokens\n")
    assert _listing(tmp_path) == []  # no output, no staging folder, no lock file


def test_pack_whose_truncated_rows_train_nothing_is_refused_and_keep_end_packs_it(agent_ds, tmp_path):
    ep = _episode0(agent_ds)
    m = _all_episodes(agent_ds)[2]
    n = ep.size
    u = int(np.flatnonzero(ep == m.user)[0])
    end = int(np.flatnonzero(ep == m.end)[-1])  # the reply's <|END|>
    trained = int(open_dataset(agent_ds).metadata["splits"]["train"]["trained_tokens"])
    assert n > 150 and u > 100 and trained == 12 * (end - int(np.flatnonzero(ep == m.assistant)[0]) + 1)
    out = tmp_path / "p"
    r = _run("pack", agent_ds, "-o", out, "-b", "64", "-q")
    assert r.exit_code == 1
    assert r.output == (f"error: pack would write rows that train nothing: with --overlong truncate at --block-size 64 "
                        f"(rows of 65 tokens), 0 of the {trained} trained tokens of train are left: no row holds a "
                        f"complete assistant reply with the user or tool turn before it; nothing was written to "
                        f"{out}. --block-size {end} keeps 99% of the trained tokens (with --overlong keep_end, which "
                        f"keeps each conversation's end: --block-size {n - u - 1})\n")
    assert _listing(tmp_path) == []
    r = _run("pack", agent_ds, "-o", out, "-b", "64", "--overlong", "keep_end", "--json")
    assert r.exit_code == 0, r.output
    rep = orjson.loads(r.stdout)["splits"]["train"]
    assert (rep["trained_in"], rep["trained_packed"], rep["trained_lost"]) == (trained, trained, 0)
    assert rep["tokens_lost"] == 12 * (n - 65) and rep["overlong_episodes"] == 12
    seg = split_segments(open_dataset(out).split("train"))
    assert seg.episode_start.tolist() == [n - 65] * 12 and seg.take.tolist() == [65] * 12
    v = _run("verify", out)
    assert v.exit_code == 0, v.output


def test_pack_losing_more_than_one_percent_warns_in_stderr_json_and_metadata(chat_ds, tmp_path):
    out = tmp_path / "p"
    toks, lengths, m = _all_episodes(chat_ds)
    sp = trained_spans(toks, lengths, m)
    block = 24
    kept = int(sp.tokens[sp.need_head <= block + 1].sum())
    lost = sp.total - kept
    assert lost * 100 > sp.total and kept > 0
    r = _run("pack", chat_ds, "-o", out, "-b", block, "--json")
    assert r.exit_code == 0, r.output
    # one exchange per episode, no system span: keeping the end needs more than keeping the head (not named)
    assert min_block_size(sp, "keep_end") > min_block_size(sp, "truncate")
    warning = (f"train: pack loses {lost:,} of the {sp.total:,} trained tokens ({lost / sp.total:.1%}) at "
               f"--block-size {block} with --overlong truncate; --block-size {min_block_size(sp, 'truncate')} keeps "
               f"99% of the trained tokens")
    assert r.stderr == f"warning: {warning}\n"
    rep = orjson.loads(r.stdout)
    assert rep["warnings"] == [warning]
    t = rep["splits"]["train"]
    assert (t["trained_lost"], t["trained_lost_share"]) == (lost, round(lost / sp.total, 6))
    assert (t["min_block_size_99"], t["min_block_size_99_keep_end"]) == (min_block_size(sp, "truncate"),
                                                                         min_block_size(sp, "keep_end"))
    meta = _meta(out)
    assert meta["warnings"] == [warning] and meta["report"]["train"]["min_block_size_99"] == t["min_block_size_99"]


def test_pack_losing_at_most_one_percent_is_quiet(chat_ds, tmp_path):
    r = _run("pack", chat_ds, "-o", tmp_path / "p", "-b", "4096", "--json")
    assert r.exit_code == 0 and r.stderr == ""
    rep = orjson.loads(r.stdout)
    assert rep["warnings"] == [] and rep["splits"]["train"]["min_block_size_99"] is None
    assert _meta(tmp_path / "p")["warnings"] == []


def test_pack_of_a_source_that_trains_nothing_is_refused(chat_ds, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(chat_ds, src)
    _edit_meta(src, lambda m: m["splits"]["train"].update(trained_tokens=0))
    with pytest.raises(NothingToTrainError) as e:
        pack(src, tmp_path / "p", PackOptions())
    assert str(e.value) == (f"{src}: the mask trains no token of its train split (0 trained tokens), so a pack of it "
                            f"trains nothing; re-create it with `sftdata prepare-chat` / `prepare-tool` from records "
                            f"with assistant replies")
    assert _listing(tmp_path) == ["src"]


def test_an_interrupted_pack_leaves_no_staging_folder_and_no_lock(chat_ds, tmp_path, monkeypatch):
    real = pack_mod.pack_split

    def interrupted(*a, **k):
        real(*a, **k)  # rows written into the staging folder, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(pack_mod, "pack_split", interrupted)
    r = _run("pack", chat_ds, "-o", tmp_path / "p")
    assert (r.exit_code, r.output.splitlines()[-1]) == (130, "error: interrupted; nothing was written to the output")
    assert _listing(tmp_path) == []


# ====================================================== prepare refuses 0 trained tokens

def test_prepare_whose_episodes_train_nothing_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(render_mod, "loss_mask", lambda ids, m: np.zeros(len(ids), np.uint8))
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a"), chat("r", "b"), {"messages": []}])
    out = tmp_path / "ds"
    r = _run("prepare-chat", src, "-o", out, "-j", "1", "-q")
    assert r.exit_code == 1
    assert r.output == (f"error: the 2 train episodes hold 0 trained tokens (the mask trains no assistant reply), so a "
                        f"model would learn nothing from them; nothing was written to {out}; the records rejected "
                        f"are listed in {tmp_path / 'ds.rejects.jsonl'}. Check that the records hold assistant "
                        f"replies after user or tool turns\n")
    assert _listing(tmp_path) == ["ds.rejects.jsonl", "in.jsonl"]


# ========================================================== sizes checked before allocating

@pytest.fixture
def small_machine(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 8 * GiB)


def test_a_block_size_whose_rows_cannot_fit_is_refused_with_both_figures(chat_ds, tmp_path, small_machine):
    r = _run("pack", chat_ds, "-o", tmp_path / "p", "--block-size", "2000000000")
    need = 2_000_000_001 * ROW_BYTES_PER_TOKEN
    assert (r.exit_code, r.output) == (2, f"error: --block-size 2,000,000,000 (building 1 row(s) of 2,000,000,001 "
                                          f"tokens at a time) needs about {memory.human(need)} of memory, but this "
                                          f"machine has 8.0 GiB available: lower --block-size (it is the training "
                                          f"config's block_size: a few thousand tokens is usual)\n")
    assert memory.human(need) == "89.4 GiB"
    assert _listing(tmp_path) == []


def test_the_rows_held_at_once_are_bounded_by_what_the_dataset_can_fill(chat_ds, tmp_path, monkeypatch):
    # 8 M tokens of rows of 2,049 would need 384 MiB; 40 short episodes fill 41 rows at most (3.8 MiB)
    monkeypatch.setattr(memory, "available_bytes", lambda: 100 << 20)
    rep = pack(chat_ds, tmp_path / "p", PackOptions(block_size=2048))
    assert rep.splits["train"].rows == 1


@pytest.mark.parametrize("block", ["1", "2"])
def test_absurdly_small_block_sizes_are_usage_errors(chat_ds, tmp_path, block):
    r = _run("pack", chat_ds, "-o", tmp_path / "p", "-b", block)
    assert (r.exit_code, r.output) == (2, f"error: --block-size must be at least 3 (a row of 4 tokens, <|USER|> "
                                          f"<|END|> <|ASSISTANT|> <|END|>, is the smallest that can train a reply), "
                                          f"got {block}\n")


def test_the_row_estimate_bounds_what_building_rows_takes(tmp_path):
    rng = np.random.default_rng(0)
    words = np.array("alpha beta gamma delta epsilon zeta eta theta".split())
    src = write_jsonl(tmp_path / "in.jsonl", [chat(" ".join(rng.choice(words, 60)), " ".join(rng.choice(words, 60)))
                                              for _ in range(3000)])
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    tokens = open_dataset(tmp_path / "ds").split("train").num_tokens
    tracemalloc.start()
    rep = pack(tmp_path / "ds", tmp_path / "p", PackOptions(block_size=tokens))  # one row, every token in it
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rep.splits["train"].rows == 1
    assert peak <= ROW_BYTES_PER_TOKEN * (tokens + 1)


@pytest.mark.parametrize("which, mode", [("chat", None), ("packed", None), ("chat", "token_stream")])
def test_the_batch_estimate_bounds_what_a_batch_takes(chat_ds, tmp_path, which, mode):
    ds = chat_ds
    if which == "packed":
        pack(chat_ds, tmp_path / "p", PackOptions(block_size=255))
        ds = tmp_path / "p"
    cfg = LoaderConfig(batch_size=512, block_size=255 if mode is None else 32, epoch_drop_last=False,
                       dataset_mode=mode)
    loader = make_loader(cfg, ds, backend="numpy")
    loader.batch_at("train", 0)
    tracemalloc.start()
    loader.batch_at("train", 0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak <= BATCH_BYTES_PER_CELL[loader.mode] * cfg.batch_size * cfg.block_size


def test_a_batch_that_cannot_fit_is_refused_with_both_figures(chat_ds, small_machine):
    cfg = LoaderConfig(batch_size=2**62, block_size=64, epoch_drop_last=False)
    need = 2**62 * 64 * BATCH_BYTES_PER_CELL["sft_episode"]
    with pytest.raises(ConfigError) as e:
        make_loader(cfg, chat_ds, backend="numpy")
    assert str(e.value) == (f"a batch of batch_size 4,611,686,018,427,387,904 x block_size 64 (sft_episode) needs "
                            f"about {memory.human(need)} of memory, but this machine has 8.0 GiB available: lower "
                            f"batch_size or block_size in the config (gradient accumulation gives a larger "
                            f"effective batch)")


# ============================================== the loader refuses what cannot train

def _copy(src: Path, tmp_path: Path, name: str = "ds") -> Path:
    shutil.copytree(src, tmp_path / name)
    return tmp_path / name


def test_the_loader_refuses_a_train_split_that_trains_nothing(chat_ds, tmp_path):
    ds = _copy(chat_ds, tmp_path)
    mask = ds / "train" / "shard_00000" / "mask.bin"
    mask.write_bytes(bytes(mask.stat().st_size))  # every mask value 0, the metadata saying so

    def zero(meta):
        meta["splits"]["train"]["trained_tokens"] = 0
        meta["splits"]["train"]["shards"][0].update(trained_tokens=0, mask_value_range=[0, 0])
    _edit_meta(ds, zero)
    cfg = LoaderConfig(batch_size=2, block_size=64, use_loss_mask=True)
    with pytest.raises(NothingToTrainError) as e:
        make_loader(cfg, ds, backend="numpy")
    assert str(e.value) == (f"{ds}: the mask of its train split trains 0 of its episodes' tokens, so training with "
                            f"use_loss_mask=true would learn nothing (a loss of 0 on every step); re-create it from "
                            f"records with assistant replies, or set use_loss_mask=false to train on every token")
    assert make_loader(cfg.replace(use_loss_mask=False), ds, backend="numpy").num_items("train") == 40


def test_the_loader_refuses_a_train_split_without_an_episode_or_a_row(chat_ds, tmp_path):
    state = open_dataset(chat_ds).tokenizer_state
    meta = _meta(chat_ds)
    for kind in ("episodes", "packed"):
        out = tmp_path / kind
        with DatasetWriter(out) as w:
            if kind == "packed":
                split = w.packed_split("train", np.dtype("<u4"), 65).close()
                extra = {"packing": {"block_size": 64, "row_len": 65, "strategy": "bfd", "overlong": "truncate",
                                     "pad_token_id": state["eos_id"], "seed": 0}}
            else:
                split = w.split("train", np.dtype("<u4")).close()
                extra = {}
            w.write_json("tokenizer_state.json", state)
            w.commit({"kind": kind, "token_dtype": "uint32", "tokenizer": meta["tokenizer"],
                      "splits": {"train": split}, **extra})
        with pytest.raises(NothingToTrainError) as e:
            make_loader(LoaderConfig(batch_size=2, block_size=64), out, backend="numpy")
        items, make = ("rows", "`sftdata pack`") if kind == "packed" else \
            ("episodes", "`sftdata prepare-chat` / `prepare-tool`")
        assert str(e.value) == (f"{out}: its train split holds 0 {items}, so there is nothing to train on; "
                                f"re-create it with {make}")


def test_the_loader_refuses_ids_past_the_vocabulary_naming_the_shard(chat_ds, tmp_path):
    ds = _copy(chat_ds, tmp_path)
    vocab = open_dataset(ds).tokenizer_state["vocab_size"]
    _edit_meta(ds, lambda m: m["splits"]["train"]["shards"][0].update(token_id_range=[0, vocab + 5]))
    with pytest.raises(DatasetError) as e:
        make_loader(LoaderConfig(batch_size=2, block_size=64), ds, backend="numpy")
    assert str(e.value) == (f"{ds / 'train' / 'shard_00000'}: its token ids reach {vocab + 5:,}, outside the "
                            f"vocabulary of {vocab:,} ids (tokenizer_state.json), which the model's embedding cannot "
                            f"look up. The shard was damaged or written with another tokenizer: re-create the dataset "
                            f"(`sftdata verify {ds}` shows where)")
    with pytest.raises(DatasetError, match="its token ids reach"):  # token windows read the same record
        make_loader(LoaderConfig(batch_size=2, block_size=64, dataset_mode="token_stream"), ds, backend="numpy")


def test_the_loader_refuses_mask_values_other_than_0_and_1_naming_the_shard(chat_ds, tmp_path):
    ds = _copy(chat_ds, tmp_path)
    mask = ds / "train" / "shard_00000" / "mask.bin"
    data = bytearray(mask.read_bytes())
    data[5] = 2  # what a writer that stored counts instead of flags would leave
    mask.write_bytes(bytes(data))
    _edit_meta(ds, lambda m: m["splits"]["train"]["shards"][0].update(mask_value_range=[0, 2]))
    with pytest.raises(DatasetError) as e:
        make_loader(LoaderConfig(batch_size=2, block_size=64), ds, backend="numpy")
    assert str(e.value) == (f"{ds / 'train' / 'shard_00000'}: its mask holds values 0..2, but a mask value is 0 (not "
                            f"trained) or 1 (trained). The shard was damaged or written by another tool: re-create the "
                            f"dataset (`sftdata verify {ds}` shows where)")


def test_a_malformed_range_record_is_refused(chat_ds, tmp_path):
    ds = _copy(chat_ds, tmp_path)
    _edit_meta(ds, lambda m: m["splits"]["train"]["shards"][0].update(token_id_range="all"))
    with pytest.raises(DatasetError) as e:
        make_loader(LoaderConfig(batch_size=2, block_size=64), ds, backend="numpy")
    assert str(e.value) == (f"{ds / 'train' / 'shard_00000'}: dataset_metadata.json records its token_id_range as "
                            f"'all', not [smallest, largest]; the metadata was edited or damaged: restore it, or "
                            f"re-create the dataset")


def test_a_dataset_written_before_the_ranges_were_recorded_opens_as_before(chat_ds, tmp_path):
    ds = _copy(chat_ds, tmp_path)

    def drop(meta):
        for sh in meta["splits"]["train"]["shards"]:
            sh.pop("token_id_range"), sh.pop("mask_value_range")
    _edit_meta(ds, drop)
    assert "token_id_range" not in _meta(ds)["splits"]["train"]["shards"][0]
    loader = make_loader(LoaderConfig(batch_size=2, block_size=64), ds, backend="numpy")
    assert loader.vocab_size == open_dataset(ds).tokenizer_state["vocab_size"] and loader.get_batch().x.shape == (2, 64)


# ======================================================================== --wait

@pytest.mark.parametrize("command", ["prepare-chat", "prepare-tool", "pack"])
def test_wait_waits_for_another_writer_of_the_same_output_and_without_it_the_run_stops(chat_ds, tmp_path, command):
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a"), chat("r", "b")])
    out = tmp_path / "out"
    args = ["pack", chat_ds, "-o", out, "-q"] if command == "pack" else [command, src, "-o", out, "-j", "1", "-q"]
    with WriterLock(out):
        r = _run(*args)
        assert r.exit_code == 1
        assert r.output.startswith(f"error: another sftdata (pid {os.getpid()}, started ")
        assert r.output.endswith(f") is writing {out}; wait for it to finish, pass --wait to wait, or choose another "
                                 f"--output-dir\n")
    assert not out.exists()
    held = WriterLock(out).__enter__()
    released_by: list[str] = []
    once = threading.Lock()

    def release(why: str):
        with once:
            if not released_by:
                released_by.append(why)
                held.__exit__(None, None, None)

    class ReleaseWhenWaiting(logging.Handler):  # the other writer finishes once this run says it waits for it
        def emit(self, record):
            if "waiting for it to finish" in record.getMessage():
                threading.Thread(target=release, args=("this run waited",)).start()

    handler = ReleaseWhenWaiting()
    logging.getLogger("sftdata").addHandler(handler)
    safety = threading.Timer(SAFETY_S, release, args=("the safety net",))  # never a hung test: it fails below
    safety.start()
    try:
        r = _run(*args, "--wait")
    finally:
        logging.getLogger("sftdata").removeHandler(handler)
        safety.cancel()
        release("the end of the test")
    assert released_by == ["this run waited"], r.output
    assert r.exit_code == 0, r.output
    assert open_dataset(out).splits["train"].num_items > 0
    # -q prints no warning (issue 44): the wait is logged (the handler above saw it), not printed
    assert r.stderr == ""


# ======================================================================== clean

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _staging(folder: Path, target: str, pid: int, **owner) -> Path:
    path = folder / f".{target}.tmp-{pid}-0123abcd"
    (path / "train").mkdir(parents=True)
    (path / "train" / "tokens.bin").write_bytes(bytes(1000))
    (path / OWNER_FILE).write_bytes(orjson.dumps(owner_record() | {"pid": pid, "start": "0"} | owner))
    return path


def test_a_folder_named_like_staging_without_an_owner_record_is_the_users(tmp_path):
    """Ownership is by record, never by name: a folder named as sftdata names staging, with a
    dead pid in its name and nothing but the names a run writes inside, is still the user's
    when it holds no owner record: clean neither lists nor removes it."""
    dead = _dead_pid()
    theirs = tmp_path / f".ds.tmp-{dead}-0123abcd"
    for name in (STAGING_SPLIT, PARTS_DIR, "train", "val"):
        (theirs / name).mkdir(parents=True)
    for name in (REJECTS_FILE, TOKENIZER_FILE, SERVING_FILE):
        (theirs / name).write_text("{}")
    old = time.time() - 3600
    os.utime(theirs, (old, old))
    assert find_leftovers(tmp_path) == []
    r = _run("clean", tmp_path, "--yes")
    assert (r.exit_code, r.output) == (0, f"nothing left behind by sftdata below {tmp_path}\n")
    assert sorted(p.name for p in theirs.iterdir()) == sorted([STAGING_SPLIT, PARTS_DIR, "train", "val", REJECTS_FILE,
                                                               TOKENIZER_FILE, SERVING_FILE])


def test_clean_lists_by_default_and_removes_only_stale_leftovers_with_yes(tmp_path):
    root = tmp_path / "data"
    (root / "deep").mkdir(parents=True)
    dead = _dead_pid()
    stale = _staging(root / "deep", "ds", dead)
    stale_lock = root / ".ds.sftdata-lock"
    stale_lock.write_bytes(orjson.dumps(owner_record() | {"pid": dead}))
    live = root / f".run.tmp-{os.getpid()}-0123abcd"  # this process: a run in progress
    live.mkdir()
    (live / OWNER_FILE).write_bytes(orjson.dumps(owner_record()))
    far = _staging(root, "far", dead, host="another-machine")
    mine = root / f".notes.tmp-{dead}-x"  # named like staging, but a user's folder: no owner record
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    os.utime(mine, (time.time() - 3600, time.time() - 3600))
    (root / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    _staging(tmp_path / "elsewhere", "x", dead)  # below a symbolic link: never reached

    r = _run("clean", root, "--json")
    assert r.exit_code == 0
    got = orjson.loads(r.stdout)
    states = {Path(x["path"]).name: (x["kind"], x["state"], x["removed"]) for x in got["leftovers"]}
    assert states == {".ds.sftdata-lock": ("lock", "stale", False), stale.name: ("staging", "stale", False),
                      live.name: ("staging", "live", False), far.name: ("staging", "unknown", False)}
    assert (got["stale"], got["live"], got["unknown"], got["removed"], got["freed_bytes"]) == (2, 1, 1, False, 0)
    assert stale.exists() and stale_lock.exists()  # listing removes nothing

    size = memory.human(stale_lock.stat().st_size + sum(p.stat().st_size for p in stale.rglob("*") if p.is_file()))
    r = _run("clean", root, "--yes")
    assert r.exit_code == 0
    assert r.stderr.endswith(f"removed 2 stale leftover(s), {size} freed; kept 1 in use, 1 unknown\n")
    assert not stale.exists() and not stale_lock.exists()
    assert live.exists() and far.exists() and (mine / "thesis.txt").read_text() == "years of work"
    assert (tmp_path / "elsewhere" / f".x.tmp-{dead}-0123abcd").exists()


def test_clean_says_when_there_is_nothing_and_what_to_run_when_there_is(tmp_path):
    r = _run("clean", tmp_path)
    assert (r.exit_code, r.output) == (0, f"nothing left behind by sftdata below {tmp_path}\n")
    stale = _staging(tmp_path, "ds", _dead_pid())
    size = memory.human(sum(p.stat().st_size for p in stale.rglob("*") if p.is_file()))
    r = _run("clean", tmp_path)
    assert r.output.endswith(f"1 stale leftover(s), {size}; remove them with `sftdata clean {tmp_path} --yes`\n")
    r = _run("clean", tmp_path / "nope")
    assert (r.exit_code, r.output) == (2, f"error: {tmp_path / 'nope'} is not a folder; give the folder to search for "
                                          f"what sftdata left behind\n")


def test_clean_never_removes_a_lock_that_is_held(tmp_path):
    with WriterLock(tmp_path / "ds"):
        r = _run("clean", tmp_path, "--yes", "--json")
        x = orjson.loads(r.stdout)["leftovers"]
        assert [(Path(v["path"]).name, v["state"], v["removed"]) for v in x] == [(".ds.sftdata-lock", "live", False)]
        assert (tmp_path / ".ds.sftdata-lock").exists()


def test_a_killed_writer_leaves_a_lock_and_staging_that_clean_removes(tmp_path):
    code = (f"import sys\nfrom sftdata.store.writer import DatasetWriter\n"
            f"w = DatasetWriter({str(tmp_path / 'ds')!r}).__enter__()\nprint('in', flush=True)\nsys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:  # the writer stays in until it is killed (its standard input never ends)
        assert read_line(p.stdout, "the writer to take its lock and staging folder") == "in\n"
        r = _run("clean", tmp_path, "--yes", "--json")
        assert {v["state"] for v in orjson.loads(r.stdout)["leftovers"]} == {"live"}
    finally:
        p.kill()
        p.wait()
        p.stdin.close()
    assert len(_listing(tmp_path)) == 2  # .ds.sftdata-lock and .ds.tmp-PID-...
    r = _run("clean", tmp_path, "--yes", "--json")
    assert [(v["kind"], v["removed"]) for v in orjson.loads(r.stdout)["leftovers"]] == [("lock", True),
                                                                                       ("staging", True)]
    assert _listing(tmp_path) == []


def _two_datasets(tmp_path: Path) -> tuple[Path, Path]:
    """A dataset at data/ds and the one it replaced at data/.ds.tmp-PID-1a2b3c4d, with its
    owner record, as a run killed while --overwrite removed the replaced one leaves it."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat("hi", "hello there"), chat("2+2?", "4")])
    ds = tmp_path / "data" / "ds"
    prepare([src], ds, PrepareOptions(workers=1))
    dead = _dead_pid()
    old = ds.parent / f".ds.tmp-{dead}-1a2b3c4d"
    shutil.copytree(ds, old)
    record = owner_record(target="ds", kind="replaced") | {"pid": dead, "start": "0"}
    (old / OWNER_FILE).write_bytes(orjson.dumps(record))
    return ds, old


def test_clean_removes_a_replaced_dataset_once_its_replacement_stands(tmp_path):
    ds, old = _two_datasets(tmp_path)
    r = _run("clean", ds.parent, "--json")
    x = orjson.loads(r.stdout)["leftovers"]
    assert [(v["kind"], Path(v["path"]).name, Path(v["target"]).name, v["state"]) for v in x] == [
        ("replaced", old.name, "ds", "stale")]
    r = _run("clean", ds.parent, "--yes")
    assert r.exit_code == 0 and "removed 1 stale leftover(s)" in r.stderr
    assert not old.exists() and open_dataset(ds).split("train").num_episodes == 2


def test_clean_keeps_what_a_replaced_dataset_holds_that_is_not_its_own(tmp_path):
    ds, old = _two_datasets(tmp_path)
    (old / "NOTES.txt").write_text("mine")
    r = _run("clean", ds.parent, "--yes")
    assert "1 came back into use or could not be removed, and were kept" in r.stderr
    assert sorted(p.name for p in old.iterdir()) == [OWNER_FILE, "NOTES.txt"]  # its own files went; the note stays
    r = _run("clean", ds.parent, "--json")  # what is left is not sftdata's: shown, never removed
    assert [(v["kind"], v["state"]) for v in orjson.loads(r.stdout)["leftovers"]] == [("replaced", "unknown")]


def test_clean_never_removes_a_replaced_dataset_whose_replacement_never_arrived(tmp_path):
    ds, old = _two_datasets(tmp_path)
    shutil.rmtree(ds)
    r = _run("clean", ds.parent, "--yes")
    assert r.exit_code == 0
    assert r.stderr.splitlines()[-1] == (
        f"{old} holds the dataset that --overwrite was replacing when its run died, and {ds} is not a complete "
        f"dataset: check it, then move it back with `mv {old} {ds} && rm {ds / OWNER_FILE}`")
    assert (old / METADATA_FILE).is_file()


def test_clean_leaves_a_replaced_dataset_alone_while_its_writer_runs(tmp_path):
    ds, old = _two_datasets(tmp_path)
    (old / OWNER_FILE).write_bytes(orjson.dumps(owner_record(target="ds", kind="replaced")))  # this process
    with WriterLock(ds):
        r = _run("clean", ds.parent, "--yes", "--json")
    got = {Path(v["path"]).name: (v["state"], v["removed"]) for v in orjson.loads(r.stdout)["leftovers"]}
    assert got[old.name] == ("live", False) and old.exists()
