"""Packing: several episodes per fixed-length row. Pure; no I/O (``sftdata.pack`` reads
and writes). One module per job:

* ``segments``: the ``Segments`` records (what every row holds), the row layout
  (``seq_ids``, ``position_ids``) and ``row_mask``, the loss mask a packed row must hold;
* ``plan``: ``PackPlan`` (where every segment goes) and ``assemble_rows``;
* ``bfd``: ``plan_bfd``, best-fit decreasing of whole episodes (the default strategy);
* ``stream``: ``plan_stream``, episodes in order cut into rows, a row starting inside a
  user span rewritten (``stream_prefix``).

See docs/PACKING.md for the layout of a row and the rules of each strategy.
"""

from .bfd import plan_bfd
from .plan import (
    DEFAULT_OVERLONG,
    OVERLONG_POLICIES,
    STRATEGIES,
    PackPlan,
    Rows,
    assemble_rows,
    check_lengths,
    padding_baseline,
)
from .segments import (
    PAD_SEQ_ID,
    Segments,
    episode_positions,
    marker_positions,
    row_layout,
    row_mask,
    segment_masks,
)
from .stream import plan_stream, stream_prefix

__all__ = [
    "DEFAULT_OVERLONG", "OVERLONG_POLICIES", "PAD_SEQ_ID", "STRATEGIES", "PackPlan", "Rows", "Segments",
    "assemble_rows", "check_lengths", "episode_positions", "marker_positions", "padding_baseline", "plan_bfd", "plan_stream",
    "row_layout", "row_mask", "segment_masks", "stream_prefix",
]
