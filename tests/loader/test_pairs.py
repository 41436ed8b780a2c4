"""The loader of preference pairs, KTO rows and RL prompts (``make_pair_loader``): which
tokens each side of a pair holds, the order (seed, epochs, ranks, resume, token budgets),
padding-free rows, and the errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sftdata.errors import ConfigError, DatasetError
from sftdata.loader import LoaderConfig, PairBatch, make_loader, make_pair_loader
from sftdata.pref import PrefOptions
from sftdata.prepare import prepare_pref
from sftdata.replay.mixture import replay_mixture
from sftdata.store.mixture import make_mixture
from tests.helpers.data import write_jsonl
from tests.helpers.loader import make_dataset
from tests.helpers.pairs import PAD, PAIR_LENGTHS, sequence, write_rows


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """9 pairs, 3 per shard (so pair ids cross shards), and a val split of 2."""
    return write_rows(tmp_path_factory.mktemp("p") / "pairs", "pairs", PAIR_LENGTHS, rows_per_shard=3,
                      val_lengths=[(2, 2, 2), (3, 1, 1)])


def cfg(**kw) -> LoaderConfig:
    return LoaderConfig(**{"batch_size": 2, "block_size": 12, "epoch_seed": 5, **kw})


def expected_row(row: int, side: int, width: int, lengths=PAIR_LENGTHS):
    """x, y, mask of one side of one pair in a row ``width`` targets wide."""
    toks, mask = sequence(row, side, lengths[row])
    full = np.full(width + 1, PAD, np.int64)
    full[:toks.size] = toks
    m = np.zeros(width + 1, np.float32)
    m[:toks.size] = mask
    return full[:-1], full[1:], m[1:]


def assert_packed(p, seqs) -> None:
    """``p`` (a padding-free batch) holds exactly the sequences ``seqs`` ((ids, mask) each)
    back to back: y each one's next token, padding after its last, positions restarting."""
    lens = [t.size for t, _ in seqs]
    assert p.cu_seqlens.tolist() == np.concatenate([[0], np.cumsum(lens)]).tolist()
    assert p.max_seqlen == max(lens)
    assert p.x[0].tolist() == np.concatenate([t for t, _ in seqs]).tolist()
    assert p.y[0].tolist() == np.concatenate([np.append(t[1:], PAD) for t, _ in seqs]).tolist()
    assert p.mask[0].tolist() == np.concatenate([np.append(m[1:], 0) for _, m in seqs]).tolist()
    assert p.position_ids[0].tolist() == np.concatenate([np.arange(n) for n in lens]).tolist()
    assert p.seq_ids[0].tolist() == np.repeat(np.arange(len(lens)), lens).tolist()


def test_each_side_is_the_prompt_then_its_completion_with_the_completions_mask(pairs):
    loader = make_pair_loader(cfg(), pairs, backend="numpy")
    b = loader.get_batch("train")
    assert isinstance(b, PairBatch) and b.kind == "pairs"
    order = np.random.RandomState(5).permutation(9)
    assert b.ids.tolist() == order[:2].tolist()
    for i, row in enumerate(b.ids.tolist()):
        for side, got in ((0, b.chosen), (1, b.rejected)):
            x, y, m = expected_row(row, side, 12)
            assert got.x[i].tolist() == x.tolist()
            assert got.y[i].tolist() == y.tolist()
            assert got.mask[i].tolist() == m.tolist()
    assert b.records.tolist() == [10 + 2 * r for r in order[:2]]
    assert b.prompt_lengths.tolist() == [PAIR_LENGTHS[r][0] for r in order[:2]]
    assert b.trained_tokens == int(b.chosen.mask.sum() + b.rejected.mask.sum())


def test_a_pair_of_a_later_shard_is_read_from_its_own_shard(pairs):
    """Pair 7 is the second pair of shard 2: prompt 7001 7002, chosen 7300..7302, rejected 7600..7602."""
    loader = make_pair_loader(cfg(epoch_shuffle=False, batch_size=1), pairs, backend="numpy")
    b = loader.batch_at("train", 7)
    assert b.ids.tolist() == [7]
    assert b.chosen.x[0, :6].tolist() == [7001, 7002, 7300, 7301, 7302, PAD]
    assert b.rejected.x[0, :6].tolist() == [7001, 7002, 7600, 7601, 7602, PAD]
    assert b.chosen.mask[0, :5].tolist() == [0, 1, 1, 0, 0]


def test_the_order_is_the_episode_order_over_pair_ids_and_every_pair_comes_once_an_epoch(pairs):
    loader = make_pair_loader(cfg(batch_size=3), pairs, backend="numpy")
    seen = [loader.get_batch("train").ids.tolist() for _ in range(3)]
    assert sum(seen, []) == np.random.RandomState(5).permutation(9).tolist()
    assert loader.get_batch("train").ids.tolist() == np.random.RandomState(6).permutation(9)[:3].tolist()


def test_ranks_split_each_global_batch_and_together_see_the_single_process_batch(pairs):
    one = make_pair_loader(cfg(batch_size=4), pairs, backend="numpy")
    ranks = [make_pair_loader(cfg(batch_size=2), pairs, backend="numpy", rank=r, world_size=2) for r in range(2)]
    for _step in range(3):
        whole = one.get_batch("train")
        parts = [r.get_batch("train") for r in ranks]
        assert np.concatenate([p.ids for p in parts]).tolist() == whole.ids.tolist()
        assert np.concatenate([p.rejected.x for p in parts]).tolist() == whole.rejected.x.tolist()


def test_a_resumed_loader_continues_with_the_same_pairs(pairs):
    a = make_pair_loader(cfg(), pairs, backend="numpy")
    for _ in range(3):
        a.get_batch("train")
    state = a.state_dict()
    assert state["order"]["dataset_mode"] == "pairs" and state["order"]["num_pairs"] == {"train": 9, "val": 2}
    b = make_pair_loader(cfg(), pairs, backend="numpy")
    b.load_state_dict(state)
    for _ in range(4):
        assert b.get_batch("train").ids.tolist() == a.get_batch("train").ids.tolist()


def test_a_resume_with_other_order_settings_is_refused(pairs):
    a = make_pair_loader(cfg(), pairs, backend="numpy")
    a.get_batch("train")
    b = make_pair_loader(cfg(epoch_seed=6), pairs, backend="numpy")
    with pytest.raises(ConfigError, match=r"^cannot resume: .*epoch_seed: saved 5, now 6"):
        b.load_state_dict(a.state_dict())


def test_a_token_budget_counts_both_sides_of_every_pair(pairs):
    """A pair costs 2 rows of its longer side's width: the budget bounds rows x width over both sides."""
    loader = make_pair_loader(cfg(batch_tokens=40, block_size=12), pairs, backend="numpy")
    o = loader.order("train")
    lens = [max(p + c, p + r) - 1 for p, c, r in PAIR_LENGTHS]  # targets of the longer side
    seen = []
    for _step in range(o.batches_in_epoch(0)):
        b = loader.get_batch("train")
        width = max(lens[i] for i in b.ids.tolist())
        assert b.chosen.x.shape == b.rejected.x.shape == (b.ids.size, width)
        assert 2 * b.ids.size * (width + 1) <= 40 or b.ids.size == 1
        seen += b.ids.tolist()
    perm = np.random.RandomState(5).permutation(9).tolist()
    assert seen == perm[:len(seen)]


def test_a_budget_smaller_than_one_pair_is_refused(pairs):
    with pytest.raises(ConfigError, match=r"^batch_tokens 20 is smaller than one pair \(2 rows of block_size 12\); "
                                          r"set batch_tokens >= 24$"):
        make_pair_loader(cfg(batch_tokens=20), pairs, backend="numpy")


def test_padding_free_rows_hold_each_pair_side_by_side_with_cu_seqlens(pairs):
    loader = make_pair_loader(cfg(epoch_shuffle=False), pairs, backend="numpy", padding_free=True)
    b = loader.get_batch("train")
    assert b.chosen is None and b.rejected is None
    p = b.packed
    seqs = [sequence(0, 0, PAIR_LENGTHS[0]), sequence(0, 1, PAIR_LENGTHS[0]),
            sequence(1, 0, PAIR_LENGTHS[1]), sequence(1, 1, PAIR_LENGTHS[1])]
    assert p.x.shape == (1, sum(t.size for t, _ in seqs))
    assert_packed(p, seqs)
    assert b.trained_tokens == loader.trained_tokens_at("train", 0) == int(p.mask.sum())


def test_trained_tokens_are_known_before_the_batch_is_built(pairs):
    loader = make_pair_loader(cfg(), pairs, backend="numpy")
    for step in range(4):
        assert loader.trained_tokens_at("train", step) == loader.get_batch("train").trained_tokens


def test_a_pair_longer_than_a_row_is_refused_never_cut(pairs):
    with pytest.raises(ConfigError, match=re.escape(
            f"{pairs}: 2 pairs of split 'train' have a sequence longer than block_size + 1 = 8 tokens (the first: "
            f"row 4, input record 18, 11 tokens); the loader never cuts a pair. Set block_size >= 10, or prepare "
            f"with `sftdata prepare-pref --max-length 8`")):
        make_pair_loader(cfg(block_size=7), pairs, backend="numpy")


def test_the_sft_loader_refuses_a_pairs_dataset_naming_the_pair_loader(pairs):
    with pytest.raises(DatasetError, match=re.escape(
            f"{pairs} is a pairs dataset (preference pairs (prompt, chosen, rejected)), not SFT episodes: the SFT "
            f"loader (make_loader) reads episodes or packed rows; read it with sftdata.loader.make_pair_loader")):
        make_loader(cfg(), pairs, backend="numpy")


def test_the_pair_loader_refuses_an_sft_dataset(tmp_path):
    ds = make_dataset(tmp_path / "sft", [3, 4, 5])
    with pytest.raises(DatasetError, match=r"is a episodes dataset: make_pair_loader reads pairs or kto or prompts"):
        make_pair_loader(cfg(), ds, backend="numpy")


def test_kto_rows_carry_their_label(tmp_path):
    ds = write_rows(tmp_path / "kto", "kto", [(2, 3), (3, 2), (1, 4), (2, 2)], labels=[1, 0, 0, 1])
    loader = make_pair_loader(cfg(epoch_shuffle=False, batch_size=4), ds, backend="numpy")
    b = loader.get_batch("train")
    assert b.kind == "kto" and b.rejected is None and b.completion is b.chosen
    assert b.labels.tolist() == [1, 0, 0, 1]
    assert b.chosen.x[1, :6].tolist() == [1001, 1002, 1003, 1300, 1301, PAD]
    assert b.chosen.mask[1, :5].tolist() == [0, 0, 1, 0, 0]


def test_rl_prompts_carry_their_columns_byte_exact(tmp_path):
    cols = [{"answer": '"42"', "meta": '{"level": 3}'}, {"answer": "[1, 2.50]"}, {"answer": "null"}]
    ds = write_rows(tmp_path / "rl", "prompts", [(2,), (3,), (4,)], columns=cols, records=[5, 9, 11])
    loader = make_pair_loader(cfg(epoch_shuffle=False, batch_size=3), ds, backend="numpy")
    b = loader.get_batch("train")
    assert b.kind == "prompts" and b.columns == cols
    assert b.records.tolist() == [5, 9, 11]
    assert b.prompt_lengths.tolist() == [2, 3, 4]
    assert b.chosen.x[2, :5].tolist() == [2001, 2002, 2003, 2004, PAD]
    assert b.trained_tokens == 0


def test_the_torch_backend_gives_tensors_for_every_array(tmp_path):
    torch = pytest.importorskip("torch")
    ds = write_rows(tmp_path / "p", "pairs", PAIR_LENGTHS[:4])
    b = make_pair_loader(cfg(), ds, backend="torch").get_batch("train")
    assert all(isinstance(t, torch.Tensor) for t in (b.ids, b.records, b.prompt_lengths, b.chosen.x, b.rejected.mask))


def test_prepared_pairs_start_both_sides_with_the_same_prompt_tokens(tmp_path):
    """``prepare-pref`` output (sftdata's markers): every batch row of both sides starts with
    the prompt's ids, ``<|ASSISTANT|>`` last, and the mask starts after it."""
    recs = [{"prompt": [{"role": "user", "content": f"Question {i}?"}],
             "chosen": [{"role": "assistant", "content": "Yes. " * (i + 1)}],
             "rejected": [{"role": "assistant", "content": "No."}]} for i in range(5)]
    prepare_pref([write_jsonl(tmp_path / "in.jsonl", recs)], tmp_path / "ds", PrefOptions())
    loader = make_pair_loader(cfg(batch_size=5, block_size=64), tmp_path / "ds", backend="numpy")
    b = loader.get_batch("train")
    assistant = loader.source.tokenizer_state["special_tokens"]["<|ASSISTANT|>"]
    for i, p in enumerate(b.prompt_lengths.tolist()):
        assert b.chosen.x[i, :p].tolist() == b.rejected.x[i, :p].tolist()
        assert b.chosen.x[i, p - 1] == assistant
        assert not b.chosen.mask[i, :p - 1].any() and b.chosen.mask[i, p - 1] == 1  # y at p-1: the first reply token
    assert sorted(b.records.tolist()) == [0, 1, 2, 3, 4]


def test_a_mixture_of_pair_datasets_gives_each_step_the_pairs_replay_order_names(pairs, tmp_path):
    other = write_rows(tmp_path / "b", "pairs", [(2, 2, 2), (3, 3, 3), (1, 2, 1)], records=[100, 101, 102])
    make_mixture([("a", str(pairs), 0.5), ("b", str(other), 0.5)], tmp_path / "mix.json", seed=11)
    loader = make_pair_loader(cfg(batch_size=3), tmp_path / "mix.json", backend="numpy")
    assert loader.cfg.epoch_seed == 11  # the mixture's seed
    for step in range(4):
        b = loader.get_batch("train")
        r = replay_mixture(tmp_path / "mix.json", cfg(batch_size=3), step=step)
        assert r.items == "pairs"
        assert (r.columns["dataset"].tolist(), r.columns["pair"].tolist(), r.columns["record"].tolist()) == (
            b.members.tolist(), b.ids.tolist(), b.records.tolist())
        for i, (m, p) in enumerate(zip(b.members.tolist(), b.ids.tolist())):
            lengths = PAIR_LENGTHS if m == 0 else [(2, 2, 2), (3, 3, 3), (1, 2, 1)]
            toks, _ = sequence(p, 1, lengths[p])
            assert b.rejected.x[i, :toks.size - 1].tolist() == toks[:-1].tolist()


def test_a_padding_free_mixture_holds_each_slots_pair_side_by_side_in_the_orders_slots(pairs, tmp_path):
    """The one row of a padding-free mixture batch is what a padding-free batch of one
    dataset would hold for the same pairs in the same order: each slot's chosen then
    rejected, from the member the order names, with cu_seqlens, positions and seq ids."""
    b_lengths = [(2, 2, 2), (3, 3, 3), (1, 2, 1)]
    other = write_rows(tmp_path / "b", "pairs", b_lengths, records=[100, 101, 102])
    make_mixture([("a", str(pairs), 0.5), ("b", str(other), 0.5)], tmp_path / "mix.json", seed=11)
    loader = make_pair_loader(cfg(batch_size=3), tmp_path / "mix.json", backend="numpy", padding_free=True)
    padded = make_pair_loader(cfg(batch_size=3), tmp_path / "mix.json", backend="numpy")
    both = 0
    for _ in range(6):
        b, ref = loader.get_batch("train"), padded.get_batch("train")
        assert (b.members.tolist(), b.ids.tolist()) == (ref.members.tolist(), ref.ids.tolist())
        assert b.chosen is None and b.rejected is None
        seqs = [sequence(p, side, (PAIR_LENGTHS if m == 0 else b_lengths)[p])
                for m, p in zip(b.members.tolist(), b.ids.tolist()) for side in (0, 1)]
        assert_packed(b.packed, seqs)
        assert b.trained_tokens == ref.trained_tokens == int(b.packed.mask.sum())
        both += len(set(b.members.tolist())) == 2
    assert both > 0  # some steps mix the two members
