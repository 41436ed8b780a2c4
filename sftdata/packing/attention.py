"""Attention isolation for packed rows: numpy, or torch when given torch tensors.

A token attends to the tokens of its own segment at or before it; a padding token
(``seq_id == PAD_SEQ_ID``) attends only to itself, so no softmax row is all ``-inf``::

    seq_ids:   0 0 1 1 1 -1           additive mask (0 = attend, . = -inf)
                                        0 .  .  .  .  .
                                        0 0  .  .  .  .
                                        .  . 0  .  .  .
                                        .  . 0 0  .  .
                                        .  . 0 0 0  .
                                        .  .  .  .  . 0

``cu_seqlens`` / ``max_seqlen`` describe the same split for varlen kernels
(flash-attention style) over the flattened ``(B * T)`` tokens: every segment is a
sequence and every padding token a sequence of length 1.

Torch is imported only when a torch tensor is passed in.
"""

from __future__ import annotations

import numpy as np

from .layout import PAD_SEQ_ID


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def block_causal_mask(seq_ids, dtype=None):
    """Additive mask of shape ``(B, 1, T, T)``: 0 where attending is allowed, -inf elsewhere.

    ``seq_ids`` is ``(B, T)`` (or ``(T,)``, treated as one row). Numpy in, numpy out
    (float32 unless ``dtype``); a torch tensor gives a torch tensor on its device
    (``dtype`` default ``torch.float32``).
    """
    if _is_torch(seq_ids):
        import torch

        s = seq_ids if seq_ids.dim() == 2 else seq_ids.unsqueeze(0)
        T = s.shape[-1]
        causal = torch.ones(T, T, dtype=torch.bool, device=s.device).tril()
        same = (s.unsqueeze(-1) == s.unsqueeze(-2)) & (s.unsqueeze(-2) != PAD_SEQ_ID)
        eye = torch.eye(T, dtype=torch.bool, device=s.device)
        allowed = (same & causal) | eye
        out = torch.zeros(allowed.shape, dtype=dtype or torch.float32, device=s.device)
        return out.masked_fill(~allowed, float("-inf")).unsqueeze(1)
    s = np.asarray(seq_ids)
    if s.ndim == 1:
        s = s[None, :]
    if s.ndim != 2:
        raise ValueError(f"seq_ids must be (B, T) or (T,), got shape {s.shape}")
    T = s.shape[-1]
    causal = np.tri(T, dtype=bool)
    same = (s[:, :, None] == s[:, None, :]) & (s[:, None, :] != PAD_SEQ_ID)
    allowed = (same & causal) | np.eye(T, dtype=bool)
    out = np.where(allowed, 0.0, -np.inf).astype(dtype or np.float32)
    return out[:, None, :, :]


def cu_seqlens(seq_ids):
    """``(cu_seqlens, max_seqlen)`` over the flattened ``(B * T)`` tokens.

    ``cu_seqlens`` (int32, starts with 0, ends with ``B * T``) marks where each sequence
    starts: at every row start, every change of seq_id and every padding token.

    >>> cu_seqlens(np.array([[0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 0, 0]]))
    (array([ 0,  2,  5,  6, 12], dtype=int32), 6)
    """
    if _is_torch(seq_ids):
        import torch

        cu, mx = cu_seqlens(seq_ids.detach().cpu().numpy())
        return torch.from_numpy(cu).to(seq_ids.device), mx
    s = np.asarray(seq_ids)
    if s.ndim == 1:
        s = s[None, :]
    B, T = s.shape
    start = np.ones((B, T), dtype=bool)
    start[:, 1:] = (s[:, 1:] != s[:, :-1]) | (s[:, 1:] == PAD_SEQ_ID)
    cu = np.concatenate([np.flatnonzero(start.ravel()), [B * T]]).astype(np.int32)
    max_seqlen = int(np.diff(cu).max()) if cu.size > 1 else 0
    return cu, max_seqlen
