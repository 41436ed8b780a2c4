"""The loss mask of a packed row, a packing plan (where every segment goes) and the rows
built from it. Pure; no I/O. The row layout (``Segments``, ``seq_ids``, ``position_ids``)
is ``layout``'s::

    row (row_len = 12):   U  u  E  A  a  E  EOS | U  v  E  EOS | pad
    mask (row_mask):      0  0  0  1  1  1  0   | 0  0  0  0   |  0

The mask of a segment is the dataset's mask rule (``loss_rule``: the chat markers' or a
model template's) over that segment's episode tokens alone (never over the row), 0 on
its injected prefix (stream packing) and on its first token, so an assistant reply cut
by a row end, or whose context is not complete in the segment, is untrained, and no
target (``y``) crosses a segment boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..chat.loss_rule import LossRule, as_rule
from ..chat.markers import MarkerIds
from ..errors import UsageError
from ..util.ranges import range_index
from .layout import Segments, episode_positions


def marker_positions(toks: np.ndarray, m: MarkerIds) -> tuple[np.ndarray, np.ndarray]:
    """Positions and marker ids of the span markers (not TOOL_CALL, THINK, END_THINK) and
    EOS in ``toks``."""
    codes = np.array([c for c in (m.system, m.user, m.assistant, m.tool, m.assistant_context, m.end, m.eos)
                      if c is not None])
    pos = np.flatnonzero(np.isin(toks, codes))
    return pos, np.asarray(toks[pos]).astype(np.int64)


def segment_masks(tokens: np.ndarray, lengths: np.ndarray, rule: LossRule | MarkerIds,
                  cut: np.ndarray | None = None, last_only: np.ndarray | None = None) -> np.ndarray:
    """``concatenate([mask(seg) for seg in segments])``: the dataset's rule
    (``loss_rule.LossRule``: the chat markers' or a template's) over each segment's tokens
    alone, in one call. ``cut[i]``: segment ``i`` begins inside its episode (see
    ``loss_rule``: a template's rule then leaves its first reply untrained);
    ``last_only[i]``: its episode trains its last reply only (``store.format.LAST_REPLY_FILE``)."""
    return as_rule(rule).masks(tokens, lengths, cut, last_only=last_only)


def row_mask(tokens: np.ndarray, seg: Segments, row_len: int, rule: LossRule | MarkerIds,
             positions: np.ndarray | None = None, last_only: np.ndarray | None = None) -> np.ndarray:
    """The loss mask packed rows must hold (uint8, the shape of ``tokens``): the rule per
    segment over its episode tokens alone (``segment_masks``; a segment that begins inside
    its episode is ``cut``), 0 on injected prefixes, on every segment's first token and
    on padding.

    ``tokens`` are consecutive rows, ``(k, row_len)`` or flat; ``seg`` their segments
    with rows local to them (0 .. k-1); ``positions`` is ``episode_positions(seg,
    row_len)`` when the caller has it already; ``last_only``: each segment's flag (None:
    none). Pack writes this mask, verify compares the stored one with it, and the report
    shows where they differ.
    """
    flat = np.asarray(tokens).reshape(-1)
    dest = episode_positions(seg, row_len) if positions is None else positions
    out = np.zeros(flat.shape[0], dtype=np.uint8)
    out[dest] = segment_masks(flat[dest], seg.take, rule, cut=seg.episode_start > 0, last_only=last_only)
    # the rule already gives 0 at a segment's first token; kept explicit so that no target
    # crosses a boundary whatever a segment holds
    out[seg.flat_start(row_len)] = 0
    return out.reshape(np.shape(tokens))


STRATEGIES = ("bfd", "stream")
OVERLONG_POLICIES = ("truncate", "keep_end", "split", "drop")
DEFAULT_OVERLONG = "truncate"
# the smallest block size pack accepts: a row of 4 tokens is the smallest that can hold a
# trained reply, <|USER|> <|END|> <|ASSISTANT|> <|END|> (the first token of a row is never
# a trained target)
MIN_BLOCK_SIZE = 3


@dataclass
class PackPlan:
    """Where every segment goes: ``segments`` with global row ids 0 .. num_rows-1 and no
    record numbers (``source`` -1; the planner sees lengths only), sorted by (row, offset).

    ``segments.episode`` indexes the ``lengths`` given to the planner. ``prefix_tokens``
    holds the injected tokens of every segment (``segments.prefix`` of them each, stream
    packing), in segment order.
    """

    row_len: int
    num_rows: int
    lengths: np.ndarray  # of the episodes given to the planner
    segments: Segments
    prefix_tokens: np.ndarray
    overlong_episodes: int = 0
    dropped_episodes: int = 0
    stopped_conversations: int = 0

    @property
    def episodes(self) -> int:
        return int(self.lengths.size)

    @property
    def tokens_in(self) -> int:
        return int(self.lengths.sum())

    @property
    def num_segments(self) -> int:
        return len(self.segments)

    @property
    def tokens_placed(self) -> int:
        """Real tokens in the rows (episode tokens plus injected ones)."""
        return int(self.segments.length.sum())

    @property
    def tokens_injected(self) -> int:
        return int(self.segments.prefix.sum())

    @property
    def tokens_lost(self) -> int:
        """Episode tokens that are in no row (truncated, dropped, stopped)."""
        return self.tokens_in - int(self.segments.take.sum())

    @property
    def lower_bound_rows(self) -> int:
        return math.ceil(self.tokens_placed / self.row_len)

    @property
    def fill(self) -> float:
        return self.tokens_placed / (self.num_rows * self.row_len) if self.num_rows else 0.0

    def whole_episodes(self) -> np.ndarray:
        """Bool per episode: placed as exactly one segment holding all of it, nothing injected."""
        n, seg = self.episodes, self.segments
        count = np.bincount(seg.episode, minlength=n)
        full = np.zeros(n, dtype=bool)
        full[seg.episode[(seg.episode_start == 0) & (seg.prefix == 0)]] = True
        taken = np.bincount(seg.episode, weights=seg.take, minlength=n)
        return full & (count == 1) & (taken == self.lengths)


def padding_baseline(lengths: np.ndarray, row_len: int) -> tuple[int, float]:
    """Rows and fill of one episode per row, truncated to ``row_len`` (empty ones skipped)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    lengths = lengths[lengths > 0]
    if lengths.size == 0:
        return 0, 0.0
    return int(lengths.size), float(np.minimum(lengths, row_len).sum() / (lengths.size * row_len))


def check_lengths(lengths, row_len: int) -> np.ndarray:
    """``lengths`` as int64 after checking it is a 1-d array of non-negative integers."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise UsageError(f"lengths must be a 1-d integer array, got shape {lengths.shape} of {lengths.dtype}")
    if row_len < 2:
        raise UsageError(f"a row needs at least 2 tokens (block_size >= 1), got row_len {row_len}")
    lengths = lengths.astype(np.int64)
    if lengths.size and lengths.min() < 0:
        raise UsageError(f"episode {int(np.argmin(lengths))} has a negative length {int(lengths.min())}")
    return lengths


@dataclass
class Rows:
    """Consecutive rows of a plan: ``tokens``/``mask`` of shape (rows, row_len), mask
    uint8 (1 = trained), and their ``segments`` with rows local to them (0 .. rows-1)."""

    tokens: np.ndarray
    mask: np.ndarray
    segments: Segments


def assemble_rows(plan: PackPlan, r0: int, r1: int, seg_tokens: np.ndarray, rule: LossRule | MarkerIds,
                  pad_id: int, dtype=np.int64, last_only: np.ndarray | None = None) -> Rows:
    """Build rows ``r0 .. r1-1`` from the concatenated episode tokens of their segments
    (``seg_tokens``: segment order, ``take`` tokens each; injected ones come from the
    plan), padded with ``pad_id``; the mask is ``row_mask``'s (``last_only``: each of
    these segments' flag).
    """
    a, b = plan.segments.row_range(r0, r1)
    seg = plan.segments[a:b]
    seg = replace(seg, row=seg.row - r0)
    L, k = plan.row_len, r1 - r0
    take = seg.take
    seg_tokens = np.asarray(seg_tokens)
    if seg_tokens.shape[0] != int(take.sum()):
        raise ValueError(f"rows {r0}..{r1 - 1} need {int(take.sum())} segment tokens, got {seg_tokens.shape[0]}")
    toks = np.full(k * L, pad_id, dtype=dtype)
    dest = episode_positions(seg, L)
    toks[dest] = seg_tokens
    if plan.prefix_tokens.size:
        before = int(plan.segments.prefix[:a].sum())
        toks[range_index(seg.flat_start(L), seg.prefix)] = plan.prefix_tokens[before:before + int(seg.prefix.sum())]
    toks = toks.reshape(k, L)
    return Rows(toks, row_mask(toks, seg, L, rule, positions=dest, last_only=last_only), seg)
