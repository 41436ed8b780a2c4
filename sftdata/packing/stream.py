"""The ``stream`` packing strategy: episodes in order, cut into rows. Pure; no I/O.

Episodes are concatenated in order and cut into rows of ``row_len`` tokens. A row that
starts inside a user span is rewritten to start with the conversation's system span (if
one was seen) and ``<|USER|>``; if that user span's ``<|END|>`` does not fit in the row
too, the rest of the conversation is skipped. See ``stream_prefix`` for which rows are
rewritten, and docs/PACKING.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..loss_rule import LossRule, as_rule
from ..tokenizer import MarkerIds
from .plan import PackPlan, check_lengths
from .segments import Segments, marker_positions


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
