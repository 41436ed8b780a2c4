"""The two packing strategies, each a plan from episode lengths. Pure; no I/O.

``bfd`` (the default): best-fit decreasing of whole episodes.

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

``stream``: episodes in order, cut into rows. Episodes are concatenated in order and cut
into rows of ``row_len`` tokens. A row that starts inside a user span is rewritten to
start with the conversation's system span (if one was seen) and ``<|USER|>``; if that
user span's ``<|END|>`` does not fit in the row too, the rest of the conversation is
skipped. See ``stream_prefix`` for which rows are
rewritten, and docs/PACKING.md.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable

import numpy as np

from ..chat.loss_rule import LossRule, as_rule
from ..chat.markers import MarkerIds
from ..errors import UsageError
from .layout import Segments
from .plan import DEFAULT_OVERLONG, OVERLONG_POLICIES, PackPlan, check_lengths, marker_positions


def _pieces(lengths: np.ndarray, row_len: int, overlong: str):
    """(episode, start, length) of every piece to place under the overlong policy."""
    if overlong not in OVERLONG_POLICIES:
        raise UsageError(f"overlong must be one of {', '.join(OVERLONG_POLICIES)}, not {overlong!r}")
    if lengths.size and lengths.min() > 0:  # the usual case: no empty episode to leave out
        ep, ln = np.arange(lengths.size, dtype=np.int64), lengths
    else:
        ep = np.flatnonzero(lengths > 0)
        ln = lengths[ep]
    if overlong == "drop":
        keep = ln <= row_len
        ep, ln = ep[keep], ln[keep]
        return ep, np.zeros(ep.size, dtype=np.int64), ln
    if overlong == "truncate":
        return ep, np.zeros(ep.size, dtype=np.int64), np.minimum(ln, row_len)
    if overlong == "keep_end":
        return ep, np.maximum(ln - row_len, 0), np.minimum(ln, row_len)
    k = -(-ln // row_len)  # pieces per episode
    pe = np.repeat(ep, k)
    first = np.repeat(np.cumsum(k) - k, k)
    j = np.arange(pe.size, dtype=np.int64) - first  # piece number within its episode
    start = j * row_len
    return pe, start, np.minimum(row_len, np.repeat(ln, k) - start)


def _best_fit_decreasing(sizes: np.ndarray, counts: np.ndarray, row_len: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Bin of every item and its rank in that bin, items placed by decreasing size:
    ``counts[k]`` items of size ``sizes[k]`` (``sizes`` decreasing), in that order.

    Equal to placing items one at a time into the open bin with the least room that
    fits (opening a bin when none fits), done per distinct size: a bin with room ``r``
    takes ``r // s`` items of size ``s`` in a row (after the first, it is the best fit
    again), so each (size, room level) is one bulk step. ``rank`` counts the items a bin
    held before (0 for the first), so the rows can be laid out without sorting.
    """
    total = int(counts.sum())
    idx = np.int32 if total < 1 << 31 else np.int64  # half the memory traffic for the usual sizes
    bins = np.empty(total, dtype=idx)  # bin of the item at each placement position
    rank = np.empty(total, dtype=idx)  # items already in that bin when it was placed
    if total == 0:
        return bins, rank, 0
    fill = np.zeros(total, dtype=idx)  # items per bin so far (at most one bin per item)
    tiles: dict[int, np.ndarray] = {}
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

    def place(ids: np.ndarray, q: int) -> None:
        """``q`` items of the current size into each bin of ``ids``, bin after bin."""
        nonlocal pos
        k = ids.size * q
        bins[pos:pos + k] = np.repeat(ids, q)
        if q not in tiles:
            tiles[q] = np.arange(q, dtype=idx)
        rank[pos:pos + k] = (fill[ids][:, None] + tiles[q]).ravel()
        fill[ids] += q
        pos += k

    for s, c in zip(sizes.tolist(), counts.tolist()):
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
                    place(np.asarray(take, dtype=idx), q)
                    c -= kf * q
                    put(r - q * s, take)
                if c and c < q and here:
                    b = here.pop()
                    place(np.full(1, b, dtype=idx), c)
                    put(r - c * s, [b])
                    c = 0
                if not here:
                    del nonempty[bisect_left(nonempty, r)]
                    del levels[r]
            else:
                q = row_len // s
                kf = c // q
                if kf:
                    new = np.arange(nbins, nbins + kf, dtype=idx)
                    nbins += kf
                    place(new, q)
                    c -= kf * q
                    put(row_len - q * s, new.tolist())
                if c:
                    place(np.full(1, nbins, dtype=idx), c)
                    put(row_len - c * s, [nbins])
                    nbins += 1
                    c = 0
    return bins, rank, nbins


def _repeat(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``np.repeat(values, counts)`` for positive ``counts``, by a cumulative sum of the
    steps (several times faster than ``np.repeat`` when the runs are short)."""
    out = np.zeros(int(counts.sum()), dtype=np.int64)
    if out.size:
        out[np.cumsum(counts[:-1])] = np.diff(values)
        out[0] = values[0]
        np.cumsum(out, out=out)
    return out


def _size_histogram(take: np.ndarray, order: np.ndarray, row_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct sizes, decreasing, and how many items have each."""
    if row_len <= 1 << 24:  # a count per possible size: no sort, no gather
        counts = np.bincount(take, minlength=row_len + 1)
        sizes = np.flatnonzero(counts)[::-1]
        return sizes, counts[sizes]
    s_sorted = take[order]
    if s_sorted.size == 0:
        return s_sorted, np.zeros(0, dtype=np.int64)
    change = np.flatnonzero(np.diff(s_sorted)) + 1
    starts = np.concatenate([[0], change]).astype(np.int64)
    return s_sorted[starts], np.diff(np.concatenate([starts, [s_sorted.size]]))


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
    order = tie[np.argsort(key[tie], kind="stable")]  # placement order
    sizes, counts = _size_histogram(take, order, row_len)
    bins, rank, nbins = _best_fit_decreasing(sizes, counts, row_len)
    perm = rng.permutation(nbins).astype(np.int64)  # rows in a seeded order, not longest first
    # segments sorted by (row, placement order), laid out by counting, not by sorting
    per_row = np.empty(nbins, dtype=np.int64)
    per_row[perm] = np.bincount(bins, minlength=nbins)
    first = np.cumsum(per_row) - per_row
    dest = first[perm][bins] + rank  # output position of the item at each placement position
    src = np.empty(take.size, dtype=np.int64)  # piece at each output position
    src[dest] = order
    out_take = np.empty_like(take)
    out_take[dest] = _repeat(sizes, counts)
    # offset = tokens before a segment in its row: a running sum restarted at each row
    step = out_take.copy()
    if nbins:
        step[first[1:]] -= np.add.reduceat(out_take, first)[:-1]
    offset = np.cumsum(step) - out_take
    n = take.size
    over = int((lengths > row_len).sum())
    segments = Segments(row=_repeat(np.arange(nbins, dtype=np.int64), per_row), offset=offset, length=out_take,
                        prefix=np.zeros(n, dtype=np.int64),
                        episode=src if ep.size == lengths.size and overlong != "split" else ep[src],
                        episode_start=start[src] if overlong in ("split", "keep_end") else np.zeros(n, dtype=np.int64),
                        source=np.full(n, -1, dtype=np.int64))
    return PackPlan(row_len=row_len, num_rows=int(nbins), lengths=lengths, segments=segments,
                    prefix_tokens=np.zeros(0, np.int64), overlong_episodes=over,
                    dropped_episodes=over if overlong == "drop" else 0)


def stream_prefix(toks: np.ndarray, q: int, rule: LossRule | MarkerIds) -> tuple[np.ndarray | None, int | None]:
    """The rewrite of a row that starts at token ``q`` (> 0) of an episode.

    Returns ``(prefix, user_end)``: ``prefix`` is None when the row is not rewritten;
    otherwise the injected tokens (the latest complete system span of the conversation
    before ``q``, if any, then ``<|USER|>`` unless token ``q`` is that marker itself),
    and ``user_end`` the position of the user span's ``<|END|>`` (None if never closed).

    Rewritten: a row starting inside a user span (after its ``<|USER|>``, up to and
    including its ``<|END|>``) or at its ``<|USER|>``. Not rewritten: a row starting
    inside or at a system, assistant or tool span, or between spans; the mask rule
    leaves such a partial span (and an assistant answering it) untrained.

    Only the chat markers' rule rewrites rows: a model template's rows are never rewritten
    (``(None, None)``), and its rule leaves the first reply of a cut segment untrained.
    """
    rule = as_rule(rule)
    if rule.kind != "markers":
        return None, None
    m = rule.markers
    pos, ids = marker_positions(toks, m)
    k = int(np.searchsorted(pos, q, side="left"))  # structural tokens strictly before q: pos[:k]
    at_user = k < pos.size and pos[k] == q and ids[k] == m.user
    in_user = k > 0 and ids[k - 1] == m.user
    if not (at_user or in_user):
        return None, None
    u = k if at_user else k - 1  # index of the user opener
    user_end = int(pos[u + 1]) if u + 1 < pos.size and ids[u + 1] == m.end else None
    # latest complete system span before the user opener, after the latest EOS
    before = np.arange(u)
    eos = before[ids[:u] == m.eos]
    lo = int(eos[-1]) + 1 if eos.size else 0
    sys_idx = [i for i in range(lo, u) if ids[i] == m.system and i + 1 < u + 1 and ids[i + 1] == m.end]
    parts = []
    if sys_idx:
        i = sys_idx[-1]
        parts.append(np.asarray(toks[pos[i]:pos[i + 1] + 1]).astype(np.int64))
    if not at_user:
        parts.append(np.array([m.user], dtype=np.int64))
    return (np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)), user_end


def plan_stream(lengths, episode_tokens: Callable[[int], np.ndarray], rule: LossRule | MarkerIds,
                row_len: int) -> PackPlan:
    """Episodes concatenated in order and cut into rows of ``row_len``.

    When a row starts mid-episode, ``stream_prefix`` decides the rewrite. A rewritten
    row begins with the injected tokens; if the user span's ``<|END|>`` does not fit in
    the row as well, the row is filled with what fits and the rest of that conversation
    is skipped (``stopped_conversations``). Injected tokens are context only: the mask
    is the rule over the episode tokens of the segment, so the assistant answering a
    user span cut by the row start stays untrained.

    ``episode_tokens(i)`` returns the tokens of episode ``i``; it is called only for
    episodes a row starts inside.
    """
    lengths = check_lengths(lengths, row_len)
    L = row_len
    rows, offs, eps, starts, takes, pres = [], [], [], [], [], []
    injected: list[np.ndarray] = []  # the injected tokens, in segment order
    row = used = 0
    stopped = 0
    n_eps = lengths.size
    e, q = 0, 0
    ln = lengths.tolist()
    while e < n_eps:
        n = ln[e]
        if q >= n:
            e, q = e + 1, 0
            continue
        prefix = None
        if used == 0 and q > 0:
            prefix, user_end = stream_prefix(np.asarray(episode_tokens(e)), q, rule)
            if prefix is not None and (user_end is None or prefix.size + user_end - q + 1 > L):
                stopped += 1
                if prefix.size < L:  # fill the row with what fits, then stop the conversation
                    take = min(L - prefix.size, n - q)
                    injected.append(prefix)
                    rows.append(row), offs.append(0), eps.append(e), starts.append(q)
                    takes.append(take), pres.append(prefix.size)
                    used = prefix.size + take
                    if used == L:
                        row, used = row + 1, 0
                e, q = e + 1, 0
                continue
        p = 0 if prefix is None else prefix.size
        take = min(L - used - p, n - q)
        if p:
            injected.append(prefix)
        rows.append(row), offs.append(used), eps.append(e), starts.append(q), takes.append(take), pres.append(p)
        used += p + take
        q += take
        if used == L:
            row, used = row + 1, 0
    a = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    seg = Segments(row=a(rows), offset=a(offs), length=a(pres) + a(takes), prefix=a(pres), episode=a(eps),
                   episode_start=a(starts), source=np.full(len(rows), -1, np.int64))
    return PackPlan(row_len=L, num_rows=row + (1 if used else 0), lengths=lengths, segments=seg,
                    prefix_tokens=np.concatenate(injected) if injected else np.zeros(0, np.int64),
                    overlong_episodes=int((lengths > L).sum()), stopped_conversations=stopped)
