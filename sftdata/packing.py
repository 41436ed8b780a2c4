"""Packing strategies: several episodes per fixed-length row. Pure; no I/O.

A row holds ``row_len = block_size + 1`` tokens (``x = row[:-1]``, ``y = row[1:]``).
Each piece of an episode placed in a row is a *segment*; segments are contiguous from
offset 0, padding (``pad_id``, mask 0) fills the rest::

    row (row_len = 12):   S  u  E  A  a  E  EOS | U  v  E  EOS | pad
    seq_ids:              0  0  0  0  0  0  0   | 1  1  1  1   | -1
    position_ids:         0  1  2  3  4  5  6   | 0  1  2  3   |  0
    mask (per segment):   0  0  0  1  1  1  0   | 0  0  0  0   |  0

The mask of a segment is ``masking.loss_mask`` over that segment's episode tokens
alone (never over the row), so an assistant span cut by a row end, or whose context
span is not complete in the segment, is untrained. The first token of a segment is
never trained, so the target of a segment's last token (``y`` at that position) never
crosses a boundary.

Strategies:

* ``plan_bfd``: best-fit decreasing of whole episodes. Works on the length histogram
  (lengths are small integers, at most ``row_len`` distinct values) and gives exactly
  the rows of a sequential best-fit decreasing; ties between equal lengths and the row
  order are drawn from ``RandomState(seed)``. Episodes longer than a row follow
  ``overlong``: ``truncate`` (default: keep the first ``row_len`` tokens), ``split``
  (consecutive pieces of ``row_len``, each its own segment) or ``drop``.
* ``stream_packing.plan_stream``: seed 002. Episodes concatenated in order and cut
  into rows; a row starting inside (or at) a user span is rewritten.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass, field

import numpy as np

from .errors import UsageError
from .masking import loss_mask
from .tokenizer import MarkerIds

STRATEGIES = ("bfd", "stream")
OVERLONG_POLICIES = ("truncate", "split", "drop")
DEFAULT_OVERLONG = "truncate"
PAD_SEQ_ID = -1  # seq_id of padding positions


@dataclass
class PackPlan:
    """Where every segment goes. Segment arrays are int64, sorted by (row, offset).

    ``seg_episode`` indexes the ``lengths`` given to the planner; a segment holds
    ``seg_prefix`` injected tokens (``prefixes[j]``, stream only) followed by
    ``seg_take`` tokens of its episode starting at ``seg_start``.
    """

    row_len: int
    num_rows: int
    lengths: np.ndarray  # of the episodes given to the planner
    seg_row: np.ndarray
    seg_offset: np.ndarray
    seg_episode: np.ndarray
    seg_start: np.ndarray
    seg_take: np.ndarray
    seg_prefix: np.ndarray
    prefixes: dict = field(default_factory=dict)
    episodes: int = 0
    tokens_in: int = 0
    overlong_episodes: int = 0
    dropped_episodes: int = 0
    stopped_conversations: int = 0

    @property
    def seg_length(self) -> np.ndarray:
        return self.seg_prefix + self.seg_take

    @property
    def num_segments(self) -> int:
        return int(self.seg_row.shape[0])

    @property
    def tokens_placed(self) -> int:
        """Real tokens in the rows (episode tokens plus injected ones)."""
        return int(self.seg_take.sum() + self.seg_prefix.sum())

    @property
    def tokens_lost(self) -> int:
        """Episode tokens that are in no row (truncated, dropped, stopped)."""
        return self.tokens_in - int(self.seg_take.sum())

    @property
    def lower_bound_rows(self) -> int:
        return math.ceil(self.tokens_placed / self.row_len)

    @property
    def fill(self) -> float:
        return self.tokens_placed / (self.num_rows * self.row_len) if self.num_rows else 0.0

    def whole_episodes(self) -> np.ndarray:
        """Bool per episode: placed as exactly one segment holding all of it, nothing injected."""
        n = self.episodes
        count = np.bincount(self.seg_episode, minlength=n)
        full = np.zeros(n, dtype=bool)
        one = (self.seg_start == 0) & (self.seg_prefix == 0)
        full[self.seg_episode[one]] = True
        taken = np.bincount(self.seg_episode, weights=self.seg_take, minlength=n)
        return full & (count == 1) & (taken == self.lengths)

    def row_segments(self, r0: int, r1: int) -> tuple[int, int]:
        """Index range [a, b) of the segments of rows r0..r1-1."""
        a, b = np.searchsorted(self.seg_row, [r0, r1], side="left")
        return int(a), int(b)


def gather_ranges(arr, starts, lengths) -> np.ndarray:
    """``concatenate([arr[s:s + n] for s, n in zip(starts, lengths)])``, one fancy index."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.asarray(arr[:0]).copy()
    shift = np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths)
    return np.asarray(arr)[np.repeat(shift, lengths) + np.arange(total, dtype=np.int64)]


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


def _pieces(lengths: np.ndarray, row_len: int, overlong: str):
    """(episode, start, length) of every piece to place under the overlong policy."""
    if overlong not in OVERLONG_POLICIES:
        raise UsageError(f"overlong must be one of {', '.join(OVERLONG_POLICIES)}, not {overlong!r}")
    ep = np.flatnonzero(lengths > 0)
    ln = lengths[ep]
    if overlong == "drop":
        keep = ln <= row_len
        ep, ln = ep[keep], ln[keep]
        return ep, np.zeros_like(ep), ln
    if overlong == "truncate":
        return ep, np.zeros_like(ep), np.minimum(ln, row_len)
    k = -(-ln // row_len)  # pieces per episode
    pe = np.repeat(ep, k)
    first = np.repeat(np.cumsum(k) - k, k)
    j = np.arange(pe.size, dtype=np.int64) - first  # piece number within its episode
    start = j * row_len
    return pe, start, np.minimum(row_len, np.repeat(ln, k) - start)


def _best_fit_decreasing(sizes: np.ndarray, row_len: int, order: np.ndarray) -> tuple[np.ndarray, int]:
    """Bin of every item (placed in ``order``, which must sort ``sizes`` decreasing).

    Equal to placing items one at a time into the open bin with the least room that
    fits (opening a bin when none fits), done per distinct size: a bin with room ``r``
    takes ``r // s`` items of size ``s`` in a row (after the first, it is the best fit
    again), so each (size, room level) is one bulk step.
    """
    s_sorted = sizes[order]
    bins = np.empty(sizes.size, dtype=np.int64)  # bin of the item at each position of ``order``
    if sizes.size == 0:
        return bins, 0
    change = np.flatnonzero(np.diff(s_sorted)) + 1
    group_start = np.concatenate([[0], change])
    group_end = np.concatenate([change, [s_sorted.size]])
    levels: list[list[int]] = [[] for _ in range(row_len + 1)]  # open bins by room left
    nonempty: list[int] = []  # sorted room levels holding bins
    nbins = 0
    pos = 0

    def put(level: int, ids: list[int]) -> None:
        if level <= 0 or not ids:
            return  # a full bin never takes anything again
        if not levels[level]:
            insort(nonempty, level)
        levels[level].extend(ids)

    for g0, g1 in zip(group_start.tolist(), group_end.tolist()):
        s = int(s_sorted[g0])
        c = g1 - g0
        while c:
            i = bisect_left(nonempty, s)
            if i < len(nonempty):
                r = nonempty[i]
                here = levels[r]
                q = r // s
                kf = min(len(here), c // q)
                if kf:
                    take = here[len(here) - kf:]
                    del here[len(here) - kf:]
                    bins[pos:pos + kf * q] = np.repeat(np.asarray(take, dtype=np.int64), q)
                    pos += kf * q
                    c -= kf * q
                    put(r - q * s, take)
                if c and c < q and here:
                    b = here.pop()
                    bins[pos:pos + c] = b
                    pos += c
                    put(r - c * s, [b])
                    c = 0
                if not here:
                    nonempty.remove(r)
            else:
                q = row_len // s
                kf = c // q
                if kf:
                    new = list(range(nbins, nbins + kf))
                    nbins += kf
                    bins[pos:pos + kf * q] = np.repeat(np.asarray(new, dtype=np.int64), q)
                    pos += kf * q
                    c -= kf * q
                    put(row_len - q * s, new)
                if c:
                    bins[pos:pos + c] = nbins
                    pos += c
                    put(row_len - c * s, [nbins])
                    nbins += 1
                    c = 0
    return bins, nbins


def _sorted_by_row(row, ep, start, take) -> dict:
    """Segments sorted by (row, placement order) with their offsets in the row."""
    # (row, placement) keys are unique, so an unstable sort is deterministic (and 3x faster)
    o = np.argsort(row * max(row.size, 1) + np.arange(row.size, dtype=np.int64))
    row, ep, start, take = row[o], ep[o], start[o], take[o]
    csum = np.cumsum(take) - take
    offset = csum - csum[np.searchsorted(row, row, side="left")]
    return dict(seg_row=row, seg_offset=offset, seg_episode=ep, seg_start=start, seg_take=take,
                seg_prefix=np.zeros_like(take))


def plan_bfd(lengths, row_len: int, overlong: str = DEFAULT_OVERLONG, seed: int = 0) -> PackPlan:
    """Best-fit decreasing of episodes into rows of ``row_len`` tokens.

    >>> p = plan_bfd(np.array([6, 3, 5, 4]), row_len=9)
    >>> p.num_rows, sorted(p.seg_length.tolist())
    (2, [3, 4, 5, 6])

    Every token of every episode is placed exactly once, except what ``overlong``
    removes from episodes longer than ``row_len`` (``PackPlan.tokens_lost``).
    """
    lengths = check_lengths(lengths, row_len)
    ep, start, take = _pieces(lengths, row_len, overlong)
    rng = np.random.RandomState(seed)
    tie = rng.permutation(take.size)
    # decreasing length, seeded among equals (a 16-bit key sorts by radix)
    key = (row_len - take).astype(np.uint16 if row_len < 65536 else np.int64)
    order = tie[np.argsort(key[tie], kind="stable")]
    bins_in_order, nbins = _best_fit_decreasing(take, row_len, order)
    seg_bin = np.empty(take.size, dtype=np.int64)
    seg_bin[order] = bins_in_order
    perm = rng.permutation(nbins).astype(np.int64)  # rows in a seeded order, not longest first
    # placement order inside a row: the order items were placed (longest first)
    ep, start, take, seg_bin = ep[order], start[order], take[order], seg_bin[order]
    over = lengths > row_len
    return PackPlan(row_len=row_len, num_rows=int(nbins), lengths=lengths,
                    **_sorted_by_row(perm[seg_bin], ep, start, take),
                    episodes=int(lengths.size), tokens_in=int(lengths.sum()), overlong_episodes=int(over.sum()),
                    dropped_episodes=int(over.sum()) if overlong == "drop" else 0)


# ------------------------------------------------------------------ masks and rows
def marker_positions(toks: np.ndarray, m: MarkerIds) -> tuple[np.ndarray, np.ndarray]:
    """Positions and marker ids of the span markers (not TOOL_CALL) and EOS in ``toks``."""
    codes = np.array([m.system, m.user, m.assistant, m.tool, m.end, m.eos])
    pos = np.flatnonzero(np.isin(toks, codes))
    return pos, np.asarray(toks[pos]).astype(np.int64)


def segment_masks(tokens: np.ndarray, lengths: np.ndarray, m: MarkerIds) -> np.ndarray:
    """``concatenate([loss_mask(seg, m) for seg in segments])``, vectorised.

    The rule resets context at EOS, but an unclosed ``<|ASSISTANT|>`` zeroes everything
    after it in the array. So segments holding an unclosed assistant span are masked one
    by one, and all the others in one ``loss_mask`` call with an EOS after each segment
    (the EOS makes an opener at a segment's end incomplete and resets the context,
    exactly as the segment's own end does).
    """
    tokens = np.asarray(tokens)
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total != tokens.shape[0]:
        raise ValueError(f"segment lengths sum to {total}, but {tokens.shape[0]} tokens were given")
    out = np.zeros(total, dtype=np.uint8)
    if total == 0:
        return out
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    seg_of_token = np.repeat(np.arange(lengths.size), lengths)
    pos, ids = marker_positions(tokens, m)
    seg = seg_of_token[pos]
    nxt_ok = np.zeros(pos.size, dtype=bool)
    nxt_ok[:-1] = (ids[1:] == m.end) & (seg[1:] == seg[:-1])
    broken = np.unique(seg[(ids == m.assistant) & ~nxt_ok])
    clean = np.ones(lengths.size, dtype=bool)
    clean[broken] = False
    for s in broken.tolist():
        a, b = int(bounds[s]), int(bounds[s + 1])
        out[a:b] = loss_mask(tokens[a:b], m)
    keep = clean[seg_of_token]
    if keep.any():
        ct = tokens[keep].astype(np.int64)
        cseg = seg_of_token[keep]
        cl = lengths[clean]
        # place the tokens with one EOS after each clean segment
        rank = np.cumsum(clean) - 1  # index of each clean segment among the clean ones
        buf = np.full(ct.size + cl.size, m.eos, dtype=np.int64)
        where = np.arange(ct.size) + rank[cseg]
        buf[where] = ct
        out[keep] = loss_mask(buf, m)[where]
    return out


@dataclass
class Rows:
    """``tokens``/``mask`` of shape (rows, row_len); mask uint8, 1 = trained."""

    tokens: np.ndarray
    mask: np.ndarray


def assemble_rows(plan: PackPlan, r0: int, r1: int, seg_tokens: np.ndarray, markers: MarkerIds,
                  pad_id: int, dtype=np.int64) -> Rows:
    """Build rows ``r0..r1-1`` from the concatenated episode tokens of their segments
    (``seg_tokens``, segment order, ``seg_take`` tokens each; prefixes come from the plan).
    """
    a, b = plan.row_segments(r0, r1)
    L = plan.row_len
    k = r1 - r0
    take = plan.seg_take[a:b]
    pre = plan.seg_prefix[a:b]
    seg_tokens = np.asarray(seg_tokens)
    if seg_tokens.shape[0] != int(take.sum()):
        raise ValueError(f"rows {r0}..{r1 - 1} need {int(take.sum())} segment tokens, got {seg_tokens.shape[0]}")
    toks = np.full(k * L, pad_id, dtype=dtype)
    mask = np.zeros(k * L, dtype=np.uint8)
    base = (plan.seg_row[a:b] - r0) * L + plan.seg_offset[a:b] + pre  # where each segment's tokens go
    dest = np.repeat(base - (np.cumsum(take) - take), take) + np.arange(int(take.sum()))
    toks[dest] = seg_tokens
    mask[dest] = segment_masks(seg_tokens, take, markers)
    for j in range(a, b):
        p = plan.prefixes.get(j)
        if p is not None:
            at = (int(plan.seg_row[j]) - r0) * L + int(plan.seg_offset[j])
            toks[at:at + p.size] = p
    # the first token of a segment is never a trained target (the rule already gives 0;
    # kept explicit so no target can cross a boundary whatever the segment holds)
    mask[(plan.seg_row[a:b] - r0) * L + plan.seg_offset[a:b]] = 0
    return Rows(toks.reshape(k, L), mask.reshape(k, L))


def row_layout(seg_row: np.ndarray, seg_offset: np.ndarray, seg_length: np.ndarray, num_rows: int,
               row_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``seq_ids`` and ``position_ids`` (int64, shape (num_rows, row_len)) of rows whose
    segments (``seg_row`` local to these rows, sorted by (row, offset), contiguous from
    offset 0) are given. Segment ``i`` of a row has seq_id ``i``; padding has
    ``PAD_SEQ_ID`` and position 0 (each padding token is its own length-1 sequence).
    """
    seg_row = np.asarray(seg_row, dtype=np.int64)
    seg_offset = np.asarray(seg_offset, dtype=np.int64)
    seg_length = np.asarray(seg_length, dtype=np.int64)
    L = row_len
    starts = np.zeros((num_rows, L), dtype=np.int64)
    starts[seg_row, seg_offset] = 1
    seq = np.cumsum(starts, axis=1) - 1
    real = np.zeros(num_rows, dtype=np.int64)
    np.maximum.at(real, seg_row, seg_offset + seg_length)
    col = np.arange(L, dtype=np.int64)
    pad = col[None, :] >= real[:, None]
    seg_start = np.maximum.accumulate(np.where(starts == 1, col[None, :], 0), axis=1)
    pos = col[None, :] - seg_start
    seq[pad] = PAD_SEQ_ID
    pos[pad] = 0
    return seq, pos
