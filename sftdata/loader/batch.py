"""``Batch``: what ``get_batch`` returns for every kind of dataset, and the -100 targets.

Every field is ``(batch_size, block_size)``: x, y, position_ids and seq_ids int64, mask
float32 (1 = the target is trained). Fields a dataset has none of are None::

    dataset                      x  y  mask                 position_ids  seq_ids
    episodes (one per row)       ✓  ✓  with use_loss_mask   None          None
    packed rows                  ✓  ✓  ✓ (always)           ✓             ✓
    token windows                ✓  ✓  None                 None          None

Iterating a batch yields its fields that are not None, in the order above, so the
tuple forms keep working: ``x, y, mask = loader.get_batch("train")`` (episodes with a
mask), ``x, y = ...`` (token windows, or episodes without a mask).

Beside them, not in the tuple: ``trained_tokens``, the number of trained targets of the
batch (the mask's sum; without a mask, the targets a loss trains: an episode row's up to
its EOS, every target of a token window), what a loss normalised over an optimizer step
adds up (``Loader.step_trained_tokens``); and for packed rows the varlen-attention inputs
``cu_seqlens``, ``cu_seqlens_padded`` and ``max_seqlen`` (docs/PACKING.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

IGNORE_INDEX = -100
FIELDS = ("x", "y", "mask", "position_ids", "seq_ids")
ARRAYS = FIELDS + ("cu_seqlens", "cu_seqlens_padded")  # converted by ``map`` (to torch, to a device)


@dataclass(frozen=True, eq=False)
class Batch:
    """One batch of rows; numpy arrays, or torch tensors with the torch backend."""

    x: object
    y: object
    mask: object = None
    position_ids: object = None
    seq_ids: object = None
    trained_tokens: int | None = None  # trained targets of this batch (set by the loader)
    cu_seqlens: object = None  # packed rows: int32 segment boundaries of the flattened batch
    cu_seqlens_padded: object = None  # the same with each segment padded to pad_to_multiple_of
    max_seqlen: int | None = None  # the longest segment (padded lengths when padding is asked for)

    def as_dict(self) -> dict:
        """The fields that are not None, by name, in order."""
        return {f: getattr(self, f) for f in FIELDS if getattr(self, f) is not None}

    def __iter__(self):
        return iter(self.as_dict().values())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __getitem__(self, i):
        return tuple(self)[i]

    def map(self, fn) -> Batch:
        """A batch with ``fn`` applied to every array field that is not None (the counts stay ints)."""
        return replace(self, **{f.name: fn(v) for f in fields(self)
                                if f.name in ARRAYS and (v := getattr(self, f.name)) is not None})

    def pin_memory(self) -> Batch:
        """Called by ``torch.utils.data.DataLoader(..., pin_memory=True)`` (torch tensors)."""
        return self.map(lambda t: t.pin_memory())


def apply_ignore_index(y, mask):
    """``y`` with every target whose mask is 0 replaced by ``IGNORE_INDEX`` (-100), as
    ``F.cross_entropy(..., ignore_index=-100)`` expects. Works on numpy arrays and
    torch tensors; returns a new array."""
    if hasattr(y, "masked_fill"):
        return y.masked_fill(mask == 0, IGNORE_INDEX)
    return np.where(np.asarray(mask) == 0, IGNORE_INDEX, y)


def trained_count(x: np.ndarray, mask, end_id: int | None) -> int:
    """Trained targets of a numpy batch: the mask's sum; without a mask, each row's targets
    up to the first ``end_id`` in ``x`` (``scripts/trainer.episode_end_targets``: the EOS
    that ends a padded episode), or every target when ``end_id`` is None."""
    if mask is not None:
        return int(np.count_nonzero(np.asarray(mask)))
    x = np.asarray(x)
    if end_id is None:
        return int(x.size)
    hit = x == end_id
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), x.shape[1])
    return int(first.sum())
