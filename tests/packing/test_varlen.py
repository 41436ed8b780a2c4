"""Kernel-ready packed rows: cu_seqlens (unpadded and padded), max_seqlen and
pad_to_multiple_of (sftdata.packing.varlen, the packed loader), and a torch-only proof that
attention computed per cu_seqlens sequence equals the block-diagonal masked attention."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from sftdata.errors import ConfigError
from sftdata.loader import make_loader
from sftdata.order.config import LoaderConfig
from sftdata.pack import PackOptions, pack
from sftdata.packing import PAD_SEQ_ID, varlen_layout, varlen_width
from sftdata.packing.attention import block_causal_mask
from sftdata.prepare import PrepareOptions, prepare


def test_the_documented_layout():
    assert varlen_width(8, 4, 2) == 16 and varlen_width(8, 1, 5) == 8
    lay = varlen_layout(np.array([0, 0, 1]), np.array([0, 3, 0]), np.array([3, 2, 6]), 2, 8, 4, 16)
    assert lay.cu_seqlens.tolist() == [0, 3, 5, 11] and lay.cu_seqlens.dtype == np.int32
    assert lay.cu_seqlens_padded.tolist() == [0, 4, 16, 32] and lay.max_seqlen == 16
    assert lay.src.tolist() == [0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13]
    assert lay.dst.tolist() == [0, 1, 2, 4, 5, 16, 17, 18, 19, 20, 21]


def test_unpadded_layout_a_cut_last_segment_and_an_empty_row():
    # row 0: segments of 5 and 4 tokens in a row of L = 9 (x has 8: the last one is cut to 3);
    # row 1 holds nothing (a padding row); row 2: a one-token segment at the last position is only a target
    lay = varlen_layout(np.array([0, 0, 2, 2]), np.array([0, 5, 0, 8]), np.array([5, 4, 8, 1]), 3, 8)
    assert lay.width == 8 and lay.cu_seqlens.tolist() == [0, 5, 8, 8, 16]
    assert lay.cu_seqlens_padded.tolist() == [0, 5, 8, 16, 24] and lay.max_seqlen == 8
    with pytest.raises(ValueError, match="the padded segments need 24 positions, the width is 16"):
        varlen_layout(np.array([0, 0, 0]), np.array([0, 3, 6]), np.array([3, 3, 3]), 1, 16, 8, 16)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("varlen")
    (d / "bytes.tiktoken").write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    rs = np.random.RandomState(1)
    recs = [{"messages": [{"role": "user", "content": "q" * int(rs.randint(1, 20))},
                          {"role": "assistant", "content": "a" * int(rs.randint(1, 30))}]} for _ in range(50)]
    (d / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    prepare([d / "c.jsonl"], d / "ds", PrepareOptions(tokenizer=str(d / "bytes.tiktoken")))
    pack(d / "ds", d / "p", PackOptions(block_size=96))
    return d / "p"


def _runs(seq_row):
    """Lengths of the segment runs (seq_id >= 0) of one row, in order."""
    out, prev, n = [], None, 0
    for s in seq_row.tolist():
        if s != prev and n:
            out.append(n)
            n = 0
        if s != PAD_SEQ_ID:
            n += 1
        prev = s
    return out + ([n] if n else [])


def test_packed_batches_carry_cu_seqlens(packed):
    lo = make_loader(LoaderConfig(batch_size=4, block_size=96, use_loss_mask=True), packed, backend="numpy")
    b = lo.get_batch("train")
    lengths = [n for row in b.seq_ids for n in _runs(row)]
    assert np.diff(b.cu_seqlens).tolist() == lengths and b.cu_seqlens[-1] == int((b.seq_ids >= 0).sum())
    assert b.cu_seqlens_padded[-1] == 4 * 96 and b.max_seqlen >= max(lengths)
    starts = b.cu_seqlens_padded[:-1]
    flat = b.seq_ids.reshape(-1)
    assert all(flat[s] >= 0 and (s % 96 == 0 or flat[s - 1] != flat[s]) for s in starts.tolist())
    assert len(tuple(b)) == 5  # the tuple form is unchanged


def test_pad_to_multiple_of_moves_each_sequence_to_a_multiple(packed):
    base = LoaderConfig(batch_size=4, block_size=96, use_loss_mask=True)
    plain = make_loader(base, packed, backend="numpy").get_batch("train")
    lo = make_loader(base.replace(pad_to_multiple_of=8), packed, backend="numpy")
    b = lo.get_batch("train")
    W = b.x.shape[1]
    assert W % 8 == 0 and W >= 96 and b.y.shape == b.mask.shape == b.seq_ids.shape == b.position_ids.shape
    assert np.all(np.diff(b.cu_seqlens_padded) % 8 == 0) and b.cu_seqlens_padded[-1] == 4 * W
    assert b.cu_seqlens.tolist() == plain.cu_seqlens.tolist()  # the same real tokens
    assert b.trained_tokens == plain.trained_tokens == int(b.mask.sum())
    for s, n in zip(b.cu_seqlens_padded[:-1].tolist(), np.diff(b.cu_seqlens).tolist()):
        r, c = divmod(s, W)
        assert b.position_ids[r, c:c + n].tolist() == list(range(n))
        assert np.all(b.seq_ids[r, c:c + n] >= 0)
    real = plain.seq_ids >= 0
    assert np.array_equal(b.x[b.seq_ids >= 0], plain.x[real]) and np.array_equal(b.y[b.seq_ids >= 0], plain.y[real])
    assert np.all(b.x[b.seq_ids < 0] == lo.pad_id) and not b.mask[b.seq_ids < 0].any()
    with pytest.raises(ConfigError, match="pad_to_multiple_of must be null or an integer >= 1, got 0"):
        base.replace(pad_to_multiple_of=0)


@pytest.mark.parametrize("multiple", [1, 8])
def test_attention_per_cu_seqlens_sequence_equals_the_masked_full_attention(packed, multiple):
    torch = pytest.importorskip("torch")
    lo = make_loader(LoaderConfig(batch_size=3, block_size=96, use_loss_mask=True, pad_to_multiple_of=multiple),
                     packed, backend="torch")
    b = lo.get_batch("train")
    B, W = b.x.shape
    H, D = 2, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, W, D, generator=g, dtype=torch.float64) for _ in range(3))
    full = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=block_causal_mask(b.seq_ids, dtype=torch.float64))  # (B, H, W, D)
    # the varlen way (what flash_attn_varlen_func computes): the batch flattened, one causal
    # attention per sequence, each over its real tokens at its padded offset
    qf, kf, vf = (t.permute(0, 2, 1, 3).reshape(B * W, H, D) for t in (q, k, v))
    out = torch.zeros(B * W, H, D, dtype=torch.float64)
    real = np.diff(b.cu_seqlens.numpy())
    for start, n in zip(b.cu_seqlens_padded[:-1].tolist(), real.tolist()):
        if n:
            sl = slice(start, start + n)
            o = torch.nn.functional.scaled_dot_product_attention(
                qf[sl].transpose(0, 1), kf[sl].transpose(0, 1), vf[sl].transpose(0, 1), is_causal=True)
            out[sl] = o.transpose(0, 1)
    mask = (b.seq_ids >= 0).reshape(-1)
    ref = full.permute(0, 2, 1, 3).reshape(B * W, H, D)
    assert int(mask.sum()) == int(b.cu_seqlens[-1])
    assert torch.allclose(out[mask], ref[mask], atol=1e-12, rtol=0)
    # the unpadded form: the real tokens gathered, sequences cut at cu_seqlens
    qu, ku, vu = qf[mask], kf[mask], vf[mask]
    cu = b.cu_seqlens.tolist()
    for a, z in zip(cu[:-1], cu[1:]):
        if z > a:
            o = torch.nn.functional.scaled_dot_product_attention(
                qu[a:z].transpose(0, 1), ku[a:z].transpose(0, 1), vu[a:z].transpose(0, 1), is_causal=True)
            assert torch.allclose(o.transpose(0, 1), ref[mask][a:z], atol=1e-12, rtol=0)
    assert b.max_seqlen >= int(real.max())
