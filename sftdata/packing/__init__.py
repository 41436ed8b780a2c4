"""Packing: several episodes per fixed-length row. Pure; no I/O (``sftdata.pack`` reads
and writes). One module per job:

* ``layout``: the ``Segments`` records (what every row holds) and the row layout
  (``seq_ids``, ``position_ids``);
* ``plan``: ``row_mask``, the loss mask a packed row must hold; ``PackPlan`` (where every
  segment goes) and ``assemble_rows``;
* ``strategies``: ``plan_bfd``, best-fit decreasing of whole episodes (the default), and
  ``plan_stream``, episodes in order cut into rows, a row starting inside a user span
  rewritten (``stream_prefix``);
* ``block_size``: ``trained_spans`` and ``min_block_size``, the smallest block size that
  keeps 99% of the trained tokens;
* ``varlen``: ``cu_seqlens`` (unpadded and padded) of a batch of rows for varlen attention
  kernels, each sequence padded to a multiple of N.

See docs/PACKING.md for the layout of a row and the rules of each strategy.
``sftdata.packing`` itself names a packed row's layout (what a training process reads
packed rows with); the planners are imported from their modules.
"""

from .layout import PAD_SEQ_ID, Segments, row_layout
from .varlen import VarlenLayout, varlen_layout, varlen_width

__all__ = ["PAD_SEQ_ID", "Segments", "row_layout", "VarlenLayout", "varlen_layout", "varlen_width"]
