"""Collators: a list of ``SFTDataset`` items -> the batch dict a ``transformers`` model takes.

Padded (default)::

    episodes       input_ids (B, T) padded with pad_id, labels (B, T) padded with -100,
                   attention_mask (B, T) 1 = token, 0 = padding          (T = longest item)
    packed rows    input_ids, labels, position_ids (B, row_len), use_cache=False; NO attention_mask

A packed batch has no ``attention_mask`` on purpose: ``transformers`` finds the
segments of a row from ``position_ids`` (a new sequence wherever the position does not
go up by one) only when no 2D attention mask and no cache is given; with either, the
eager and sdpa paths let every segment see the segments before it. ``use_cache=False``
is in the batch for that reason (``Trainer`` sets it too; a plain ``model(**batch)`` would
otherwise make a cache, as ``config.use_cache`` is true by default).

Padding-free (``padding_free=True``): every sequence of the batch (each episode, or each
segment of each row; row padding dropped) laid end to end in one row::

    input_ids     (1, N)   the sequences concatenated
    labels        (1, N)   their labels, -100 on every sequence's first token
    position_ids  (1, N)   0, 1, 2, ... restarting at every sequence
    cu_seq_lens_q, cu_seq_lens_k   int32 (S + 1,): 0 and the running ends of the S sequences
    max_length_q, max_length_k     int: the longest sequence
    use_cache     False (as for packed rows)

the keyword arguments of ``transformers``' flash-attention varlen path; without flash
attention (CPU: sdpa or eager) the ``position_ids`` alone isolate the sequences. A
sequence of fewer than 2 tokens holds no target and is left out.

``Collator.numpy(items)`` gives the same dict as numpy arrays (torch is needed only to
call the collator itself).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, UsageError
from ..loader import IGNORE_INDEX

TORCH_MISSING = "sftdata.torch needs PyTorch for its collators: pip install 'sftdata[torch]'"


def require_torch():
    """The ``torch`` module, or a one-line ``ConfigError`` saying how to install it."""
    if importlib.util.find_spec("torch") is None:
        raise ConfigError(TORCH_MISSING)
    import torch  # optional dependency: only where tensors are made

    return torch


def collate(*, padding_free: bool = False, pad_id: int = 0, pad_to_multiple_of: int | None = None) -> Collator:
    """The collator for ``DataLoader(collate_fn=...)`` or ``Trainer(data_collator=...)``.

    ``pad_id``: the id episodes are padded with (any id in the vocabulary: padding is
    never attended and never a target). ``pad_to_multiple_of``: round a padded batch's
    length up (episodes). Needs torch (checked here, so a missing install fails at once)."""
    require_torch()
    return Collator(padding_free=padding_free, pad_id=pad_id, pad_to_multiple_of=pad_to_multiple_of)


@dataclass(frozen=True)
class Collator:
    """Picklable (DataLoader workers build batches with it). See the module docstring."""

    padding_free: bool = False
    pad_id: int = 0
    pad_to_multiple_of: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, (int, np.integer)) or self.pad_id < 0:
            raise ConfigError(f"pad_id must be a token id (an integer >= 0), got {self.pad_id!r}")
        m = self.pad_to_multiple_of
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ConfigError(f"pad_to_multiple_of must be None or an integer >= 1, got {m!r}")

    def __call__(self, items: list[dict]) -> dict:
        torch = require_torch()
        return {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in self.numpy(items).items()}

    def numpy(self, items: list[dict]) -> dict:
        items = list(items)
        if not items:
            raise UsageError("cannot collate an empty list of items")
        packed = [is_packed(it) for it in items]
        if any(packed) != all(packed):
            raise UsageError("a batch mixes packed rows and episodes; collate items of one SFTDataset")
        ids = [np.asarray(it["input_ids"], dtype=np.int64) for it in items]
        labels = [np.asarray(it["labels"], dtype=np.int64) if "labels" in it else ids[k]
                  for k, it in enumerate(items)]
        for k, (a, b) in enumerate(zip(ids, labels)):
            if a.ndim != 1 or a.shape != b.shape:
                raise UsageError(f"item {k}: input_ids {a.shape} and labels {b.shape} must be one row of one length")
        if not all(packed):
            return flatten(ids, labels, [None] * len(ids)) if self.padding_free else self._pad(ids, labels)
        pos = [positions_of(it) for it in items]
        return flatten(ids, labels, pos) if self.padding_free else self._stack_rows(ids, labels, pos)

    def _pad(self, ids: list[np.ndarray], labels: list[np.ndarray]) -> dict:
        lengths = np.array([a.shape[0] for a in ids], dtype=np.int64)
        T = _round_up(int(lengths.max()), self.pad_to_multiple_of)
        b = len(ids)
        out_ids = np.full((b, T), self.pad_id, dtype=np.int64)
        out_labels = np.full((b, T), IGNORE_INDEX, dtype=np.int64)
        for k in range(b):  # one slice per item, not per token
            out_ids[k, :lengths[k]] = ids[k]
            out_labels[k, :lengths[k]] = labels[k]
        attention = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
        return {"input_ids": out_ids, "labels": out_labels, "attention_mask": attention}

    def _stack_rows(self, ids: list[np.ndarray], labels: list[np.ndarray], pos: list[np.ndarray]) -> dict:
        lengths = {a.shape[0] for a in ids}
        if len(lengths) != 1:
            raise UsageError(f"packed rows of different lengths in one batch: {sorted(lengths)}")
        L = lengths.pop()
        T = _round_up(L, self.pad_to_multiple_of)
        out = {"input_ids": np.stack(ids), "labels": np.stack(labels), "position_ids": np.stack(pos), "use_cache": False}
        if T > L:  # extra padding: pad tokens, each its own sequence at position 0
            pad = T - L
            out["input_ids"] = np.pad(out["input_ids"], ((0, 0), (0, pad)), constant_values=self.pad_id)
            out["labels"] = np.pad(out["labels"], ((0, 0), (0, pad)), constant_values=IGNORE_INDEX)
            out["position_ids"] = np.pad(out["position_ids"], ((0, 0), (0, pad)), constant_values=0)
        return out


def is_packed(item: dict) -> bool:
    return "position_ids" in item or "seq_lengths" in item


def positions_of(item: dict) -> np.ndarray:
    """A packed item's ``position_ids``, or rebuilt from its ``seq_lengths`` (a trainer
    that keeps only the model's inputs may drop one of the two: TRL keeps ``seq_lengths``,
    ``transformers.Trainer`` keeps ``position_ids``)."""
    if "position_ids" in item:
        return np.asarray(item["position_ids"], dtype=np.int64)
    n = np.asarray(item["input_ids"]).shape[0]
    lengths = np.asarray(item["seq_lengths"], dtype=np.int64)
    real = int(lengths.sum())
    if real > n:
        raise UsageError(f"seq_lengths add up to {real} tokens, more than the row's {n}")
    pos = np.zeros(n, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    pos[:real] = np.arange(real) - np.repeat(starts, lengths)
    return pos


def sequence_bounds(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the sequences of one row: a sequence starts wherever the
    position does not go up by one from the previous token (as ``transformers`` finds
    packed sequences)."""
    n = pos.shape[0]
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    new = np.ones(n, dtype=bool)
    new[1:] = np.diff(pos) != 1
    starts = np.flatnonzero(new)
    return starts, np.diff(np.append(starts, n))


def flat_sequences(ids: list[np.ndarray], pos: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the sequences a padding-free batch keeps (those of 2 or more
    tokens), starts counted in the items' ids laid end to end; ``pos`` None for an episode."""
    starts, lengths = [], []
    offset = 0
    for k, a in enumerate(ids):
        if pos[k] is None:
            s, n = np.zeros(1, np.int64), np.array([a.shape[0]], np.int64)
        else:
            s, n = sequence_bounds(pos[k])
        keep = n >= 2
        starts.append(s[keep] + offset)
        lengths.append(n[keep])
        offset += a.shape[0]
    starts, lengths = np.concatenate(starts), np.concatenate(lengths)
    if lengths.size == 0:
        raise UsageError("the batch holds no sequence of 2 or more tokens, so nothing to train on")
    return starts, lengths


def flat_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Where each token of the padding-free row comes from in the items' ids laid end to end."""
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))


def flatten(ids: list[np.ndarray], labels: list[np.ndarray], pos: list[np.ndarray | None]) -> dict:
    """The padding-free batch (module docstring) of items given as arrays; ``pos`` None
    for an episode (one sequence)."""
    starts, lengths = flat_sequences(ids, pos)
    all_ids = np.concatenate(ids)
    all_labels = np.concatenate(labels)
    total = int(lengths.sum())
    index = flat_index(starts, lengths)
    new_starts = np.cumsum(lengths) - lengths
    flat_labels = all_labels[index]
    flat_labels[new_starts] = IGNORE_INDEX
    position_ids = np.arange(total, dtype=np.int64) - np.repeat(new_starts, lengths)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    longest = int(lengths.max())
    return {"input_ids": all_ids[index][None, :], "labels": flat_labels[None, :], "position_ids": position_ids[None, :],
            "cu_seq_lens_q": cu, "cu_seq_lens_k": cu.copy(), "max_length_q": longest, "max_length_k": longest,
            "use_cache": False}


def _round_up(n: int, multiple: int | None) -> int:
    return n if not multiple else -(-n // multiple) * multiple
