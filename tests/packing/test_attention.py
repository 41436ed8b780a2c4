"""Attention isolation: the block-diagonal causal mask, cu_seqlens, and the proof that
packing changes nothing but speed (a reference attention layer gives every packed
segment the outputs of its episode run alone)."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.packing import row_layout
from sftdata.packing.attention import block_causal_mask, cu_seqlens
from sftdata.packing.strategies import plan_bfd, plan_stream
from tests.helpers.packing import M, build, random_episode

NEG = -np.inf


def test_mask_values_for_two_segments_and_padding():
    m = block_causal_mask(np.array([0, 0, 1, 1, 1, -1]))
    assert m.shape == (1, 1, 6, 6) and m.dtype == np.float32
    allowed = (m[0, 0] == 0).astype(int)
    assert allowed.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert set(np.unique(m).tolist()) == {0.0, NEG}


def test_padding_attends_only_to_itself_and_is_never_attended():
    seq = np.array([[0, 0, 0, -1, -1, -1], [0, 1, -1, -1, -1, -1]])
    m = block_causal_mask(seq)[:, 0]
    pad = seq == -1
    for b in range(2):
        for i in np.flatnonzero(pad[b]):
            assert np.flatnonzero(m[b, i] == 0).tolist() == [i]
        for i in np.flatnonzero(~pad[b]):
            assert (m[b, i, pad[b]] == NEG).all()
    assert (np.isfinite(m).any(axis=-1)).all()  # no softmax row is all -inf


def test_mask_rejects_a_3d_array():
    with pytest.raises(ValueError, match=r"seq_ids must be \(B, T\) or \(T,\)"):
        block_causal_mask(np.zeros((1, 2, 3), np.int64))


def test_cu_seqlens_docstring_example_and_padding_tokens_are_their_own_sequence():
    cu, mx = cu_seqlens(np.array([[0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 0, 0]]))
    assert cu.tolist() == [0, 2, 5, 6, 12] and cu.dtype == np.int32 and mx == 6
    cu, mx = cu_seqlens(np.array([[0, 1, 1, -1, -1]]))
    assert cu.tolist() == [0, 1, 3, 4, 5] and mx == 2
    # row boundaries split equal seq_ids of neighbouring rows
    cu, _ = cu_seqlens(np.array([[0, 0], [0, 0]]))
    assert cu.tolist() == [0, 2, 4]


# ------------------------------------------------------------ the equivalence proof
class RefAttention:
    """One attention layer: token + absolute position embeddings, RoPE on q/k driven by
    position_ids, additive mask. float64 numpy."""

    def __init__(self, seed=0, d=16, heads=2, vocab=101, max_pos=512):
        rng = np.random.default_rng(seed)
        self.d, self.h = d, heads
        self.emb = rng.normal(size=(vocab, d))
        self.pos_emb = rng.normal(size=(max_pos, d)) * 0.5
        self.wq, self.wk, self.wv, self.wo = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(4))
        self.vocab = vocab

    @staticmethod
    def rope(x, pos):  # x (T, H, Dh)
        half = x.shape[-1] // 2
        ang = pos[:, None] * 10000.0 ** (-np.arange(half) / half)[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    def __call__(self, tokens, pos, mask):
        T, dh = tokens.shape[0], self.d // self.h
        x = self.emb[tokens % self.vocab] + self.pos_emb[pos]
        q = self.rope((x @ self.wq).reshape(T, self.h, dh), pos)
        k = self.rope((x @ self.wk).reshape(T, self.h, dh), pos)
        v = (x @ self.wv).reshape(T, self.h, dh)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(dh) + mask[None]
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        return np.einsum("hts,shd->thd", p, v).reshape(T, self.d) @ self.wo


def alone(layer, toks):
    n = toks.shape[0]
    causal = np.where(np.tri(n, dtype=bool), 0.0, -np.inf)
    return layer(toks, np.arange(n), causal)


@pytest.mark.parametrize("strategy", ["bfd", "stream"])
def test_every_packed_segment_equals_its_episode_run_alone(strategy):
    rng = np.random.default_rng(11)
    eps = [random_episode(rng) for _ in range(40)]
    lengths = np.array([e.size for e in eps])
    row_len = 64 if strategy == "stream" else int(lengths.max()) + 3
    if strategy == "bfd":
        plan = plan_bfd(lengths, row_len, seed=5)
    else:
        plan = plan_stream(lengths, lambda i: eps[i], M, row_len)
    rows = build(plan, eps)
    seg = plan.segments
    seq, pos = row_layout(seg.row, seg.offset, seg.length, plan.num_rows, row_len)
    masks = block_causal_mask(seq, dtype=np.float64)
    layer = RefAttention()
    checked = 0
    for r in range(plan.num_rows):
        out = layer(rows.tokens[r], pos[r], masks[r, 0])
        assert np.isfinite(out).all()  # padding rows included: no all -inf softmax row
        for j in np.flatnonzero(seg.row == r):
            o, n = int(seg.offset[j]), int(seg.length[j])
            seg_tokens = rows.tokens[r, o:o + n]
            if strategy == "bfd":  # whole episodes: the segment IS the episode
                np.testing.assert_array_equal(seg_tokens, eps[seg.episode[j]])
            np.testing.assert_allclose(out[o:o + n], alone(layer, seg_tokens), atol=1e-5, rtol=0)
            checked += 1
    assert checked == plan.num_segments and plan.num_rows < len(eps)


def test_equivalence_fails_without_isolation_or_position_reset():
    """The proof can fail: a plain causal mask, or positions not reset, change outputs."""
    rng = np.random.default_rng(1)
    eps = [random_episode(rng) for _ in range(6)]
    plan = plan_bfd(np.array([e.size for e in eps]), 120, seed=0)
    rows = build(plan, eps)
    seg = plan.segments
    seq, pos = row_layout(seg.row, seg.offset, seg.length, plan.num_rows, 120)
    r = int(np.argmax(np.bincount(seg.row)))
    j = np.flatnonzero(seg.row == r)[1]  # the second segment of a row
    o, n = int(seg.offset[j]), int(seg.length[j])
    layer = RefAttention()
    want = alone(layer, rows.tokens[r, o:o + n])
    causal = np.where(np.tri(120, dtype=bool), 0.0, -np.inf)
    leaky = layer(rows.tokens[r], pos[r], causal)[o:o + n]
    no_reset = layer(rows.tokens[r], np.arange(120), block_causal_mask(seq[r], np.float64)[0, 0])[o:o + n]
    assert np.abs(leaky - want).max() > 1e-3
    assert np.abs(no_reset - want).max() > 1e-3


# -------------------------------------------------------------------------- torch
def test_torch_mask_and_cu_seqlens_match_numpy():
    torch = pytest.importorskip("torch")
    seq = np.array([[0, 0, 1, 1, 2, -1, -1], [0, 0, 0, 0, 0, 1, 1]])
    tm = block_causal_mask(torch.from_numpy(seq))
    assert isinstance(tm, torch.Tensor) and tm.dtype == torch.float32 and tuple(tm.shape) == (2, 1, 7, 7)
    np.testing.assert_array_equal(tm.numpy(), block_causal_mask(seq))
    assert block_causal_mask(torch.from_numpy(seq), dtype=torch.float64).dtype == torch.float64
    cu, mx = cu_seqlens(torch.from_numpy(seq))
    assert isinstance(cu, torch.Tensor) and cu.dtype == torch.int32
    assert cu.tolist() == cu_seqlens(seq)[0].tolist() and mx == 5


def test_torch_sdpa_with_the_mask_isolates_segments():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    seq = torch.tensor([[0, 0, 0, 1, 1, -1]])
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=block_causal_mask(seq, torch.float64))
    assert torch.isfinite(out).all()
    seg = torch.nn.functional.scaled_dot_product_attention(q[:, :, 3:5], k[:, :, 3:5], v[:, :, 3:5], is_causal=True)
    torch.testing.assert_close(out[:, :, 3:5], seg, atol=1e-10, rtol=0)
