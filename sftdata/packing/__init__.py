"""Packing: several episodes per fixed-length row. Pure; no I/O (``sftdata.pack`` reads
and writes). One module per job:

* ``plan``: the ``Segments`` records (what every row holds), the row layout
  (``seq_ids``, ``position_ids``) and ``row_mask``, the loss mask a packed row must hold;
  ``PackPlan`` (where every segment goes) and ``assemble_rows``;
* ``strategies``: ``plan_bfd``, best-fit decreasing of whole episodes (the default), and
  ``plan_stream``, episodes in order cut into rows, a row starting inside a user span
  rewritten (``stream_prefix``);
* ``block_size``: ``trained_spans`` and ``min_block_size``, the smallest block size that
  keeps 99% of the trained tokens;
* ``varlen``: ``cu_seqlens`` (unpadded and padded) of a batch of rows for varlen attention
  kernels, each sequence padded to a multiple of N.

See docs/PACKING.md for the layout of a row and the rules of each strategy.
"""

from .block_size import KEEP_PERCENT, TrainedSpans, min_block_size, smallest_row_len, trained_spans
from .plan import (
    DEFAULT_OVERLONG,
    MIN_BLOCK_SIZE,
    OVERLONG_POLICIES,
    PAD_SEQ_ID,
    STRATEGIES,
    PackPlan,
    Rows,
    Segments,
    assemble_rows,
    check_lengths,
    episode_positions,
    marker_positions,
    padding_baseline,
    row_layout,
    row_mask,
    segment_masks,
)
from .strategies import plan_bfd, plan_stream, stream_prefix
from .varlen import VarlenLayout, varlen_layout, varlen_width

__all__ = [
    "DEFAULT_OVERLONG", "KEEP_PERCENT", "MIN_BLOCK_SIZE", "OVERLONG_POLICIES", "PAD_SEQ_ID", "STRATEGIES",
    "PackPlan", "Rows", "Segments", "TrainedSpans", "assemble_rows", "check_lengths", "episode_positions",
    "marker_positions", "min_block_size", "padding_baseline", "plan_bfd", "plan_stream", "row_layout", "row_mask",
    "segment_masks", "smallest_row_len", "stream_prefix", "trained_spans", "VarlenLayout", "varlen_layout",
    "varlen_width",
]
