"""The ``bfd`` packing strategy: best-fit decreasing of whole episodes. Pure; no I/O.

Works on the length histogram (lengths are small integers, at most ``row_len`` distinct
values) and gives exactly the rows of a sequential best-fit decreasing; ties between
equal lengths and the row order are drawn from ``RandomState(seed)``. Episodes longer
than a row follow ``overlong``: ``truncate`` (default: keep the first ``row_len``
tokens), ``keep_end`` (keep the last ``row_len`` tokens: the end of the conversation,
where its last replies are, with context cut from the front), ``split`` (consecutive
pieces of ``row_len``, each its own segment) or ``drop``.

What ``keep_end`` trains is the mask rule over the kept tokens (``row_mask``), so the
mask stays re-derivable from the tokens. The cut lands anywhere: in the system span
(no trained token is lost), in a user or tool span (the reply to it has no complete
context in the row and is untrained), or inside an assistant span (its opener is cut,
so it is untrained). An episode of 11 tokens in rows of 7, then of 6 tokens::

    episode:   S  s  s  E  U  u  E  A  a  E  EOS       (11 tokens; A a E trained)
    keep_end:                 U  u  E  A  a  E  EOS    (episode_start 4; A a E trained)
    rows of 6:                   u  E  A  a  E  EOS    (user opener cut: nothing trained)
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from ..errors import UsageError
from .plan import DEFAULT_OVERLONG, OVERLONG_POLICIES, PackPlan, check_lengths
from .segments import Segments


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
    if overlong == "keep_end":
        return ep, np.maximum(ln - row_len, 0), np.minimum(ln, row_len)
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
    # open bins by room left; a dict, not a list of row_len + 1, so a huge row costs nothing
    levels: dict[int, list[int]] = {}
    nonempty: list[int] = []  # sorted room levels holding bins
    nbins = 0
    pos = 0

    def put(level: int, ids: list[int]) -> None:
        if level <= 0 or not ids:
            return  # a full bin never takes anything again
        here = levels.setdefault(level, [])
        if not here:
            insort(nonempty, level)
        here.extend(ids)

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
                    del levels[r]
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


def _sorted_by_row(row, ep, start, take) -> Segments:
    """Segments sorted by (row, placement order) with their offsets in the row."""
    # (row, placement) keys are unique, so an unstable sort is deterministic (and 3x faster)
    o = np.argsort(row * max(row.size, 1) + np.arange(row.size, dtype=np.int64))
    row, ep, start, take = row[o], ep[o], start[o], take[o]
    csum = np.cumsum(take) - take
    offset = csum - csum[np.searchsorted(row, row, side="left")]
    zeros = np.zeros_like(take)
    return Segments(row=row, offset=offset, length=take, prefix=zeros, episode=ep, episode_start=start,
                    source=np.full_like(take, -1))


def plan_bfd(lengths, row_len: int, overlong: str = DEFAULT_OVERLONG, seed: int = 0) -> PackPlan:
    """Best-fit decreasing of episodes into rows of ``row_len`` tokens.

    >>> p = plan_bfd(np.array([6, 3, 5, 4]), row_len=9)
    >>> p.num_rows, sorted(p.segments.length.tolist())
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
    over = int((lengths > row_len).sum())
    return PackPlan(row_len=row_len, num_rows=int(nbins), lengths=lengths,
                    segments=_sorted_by_row(perm[seg_bin], ep, start, take), prefix_tokens=np.zeros(0, np.int64),
                    overlong_episodes=over, dropped_episodes=over if overlong == "drop" else 0)
