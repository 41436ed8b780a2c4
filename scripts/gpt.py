"""A small GPT for scripts/train.py: token embedding, RoPE driven by ``position_ids``,
causal attention through ``scaled_dot_product_attention``, MLP, tied or untied head.

Independent of sftdata (plain PyTorch) so it can be copied into any project.

Packing is invisible to this model when the caller passes, for a packed row, the
``position_ids`` that restart at 0 in each segment and the block-diagonal causal mask::

    seq_ids:      0 0 0 1 1 2 2 2        (segments of one row; padding is its own segment)
    position_ids: 0 1 2 0 1 0 1 2        (RoPE sees each segment as if it were alone)
    attn_mask:    token i may attend to token j  <=>  seq_ids[i] == seq_ids[j] and j <= i

    i\\j 0 1 2 3 4 5 6 7
    0    x
    1    x x
    2    x x x
    3          x
    4          x x
    5              x
    6              x x
    7              x x x

Every row of that mask holds its diagonal, so no softmax row is all -inf (padding
attends to padding only, and no real token ever sees padding).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE_INDEX = -100  # same value as sftdata.loader.IGNORE_INDEX; this file stays sftdata-free


@dataclass
class GPTConfig:
    vocab_size: int
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    mlp_ratio: int = 4
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = True
    rope_base: float = 10000.0

    def __post_init__(self):
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(f"n_embd ({self.n_embd}) must split into n_head ({self.n_head}) heads of an "
                             f"even size (RoPE rotates pairs); pick n_embd = n_head * an even number")

    def as_dict(self) -> dict:
        return asdict(self)


def block_causal_mask(seq_ids: torch.Tensor) -> torch.Tensor:
    """Boolean (B, 1, T, T) mask, True = may attend: same segment and not in the future.

    ``seq_ids`` (B, T) labels the segments of each row; padding must carry a value of
    its own (any value no real segment uses). This is the fallback used when
    ``sftdata.attention`` is not available; both give the same mask.
    """
    t = seq_ids.shape[-1]
    same = seq_ids.unsqueeze(-1) == seq_ids.unsqueeze(-2)
    causal = torch.ones(t, t, dtype=torch.bool, device=seq_ids.device).tril()
    return (same & causal).unsqueeze(1)


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (B, 1, T, head_dim/2), computed from the
    positions themselves (no table: any position id, even a negative pad value, works)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=position_ids.device,
                                             dtype=torch.float32) / head_dim))
    angles = position_ids.to(torch.float32).unsqueeze(-1) * inv_freq  # (B, T, hd/2)
    return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[..., i], x[..., i + hd/2]) of ``x`` (B, H, T, hd) by its angle."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x, cos, sin, attn_mask=None):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        p = self.dropout if self.training else 0.0
        if attn_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, attn_mask=None):
        x = x + self.attn(self.ln1(x), cos, sin, attn_mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.wte.weight
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2: scale the residual projections by depth
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, position_ids=None, attn_mask=None, targets=None):
        """Logits (B, T, V), and with ``targets`` the mean cross-entropy over targets that
        are not IGNORE_INDEX (0 when there are none, instead of NaN).

        ``position_ids`` (B, T) default to 0..T-1; ``attn_mask`` (boolean, True = may
        attend, or additive float) defaults to plain causal attention.
        """
        b, t = idx.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=idx.device).expand(b, t)
        cos, sin = rope_cos_sin(position_ids, self.cfg.n_embd // self.cfg.n_head, self.cfg.rope_base)
        x = self.drop(self.wte(idx))
        for block in self.blocks:
            x = block(x, cos, sin, attn_mask)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        flat = targets.reshape(-1)
        total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), flat,
                                ignore_index=IGNORE_INDEX, reduction="sum")
        count = (flat != IGNORE_INDEX).sum().clamp(min=1)
        return logits, total / count
