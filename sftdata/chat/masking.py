"""The loss-mask rule: one pure function over a token array (docs/ARCHITECTURE.md §3).

Used by prepare (render), pack (per row segment) and verify (re-derivation).

Rule: ``mask = 1`` for every token from an ``<|ASSISTANT|>`` through its ``<|END|>``
inclusive when the context span before it (the latest ``<|USER|>`` or ``<|TOOL|>``
span since the last ``<|EOS|>``) is complete, i.e. its ``<|END|>`` lies in the same
array. An ``<|ASSISTANT|>`` whose span is not closed by ``<|END|>`` before the next
span opener or EOS zeroes itself and everything after it. An assistant turn opened by
``<|ASSISTANT_CONTEXT|>`` (marked ``weight: 0`` / ``train: false``, or made context by
``--train-on last``) is a span like the others and is never trained. ``<|THINK|>``,
``<|END_THINK|>`` and ``<|TOOL_CALL|>`` open no span: they lie inside an assistant span
and take its mask. Everything else is 0.

Worked example (S/U/A/E = SYSTEM/USER/ASSISTANT/END markers, EOS at the end)::

    tokens: S  s  E  U  u  u  E  A  a  a  E  EOS
    mask:   0  0  0  0  0  0  0  1  1  1  1  0

An untrained turn (X = ASSISTANT_CONTEXT), then a trained one with reasoning
(K/k = THINK/END_THINK)::

    tokens: U  u  E  X  x  E  U  v  E  A  K  r  k  a  E  EOS
    mask:   0  0  0  0  0  0  0  0  0  1  1  1  1  1  1  0

A row that starts inside a user span (no ``<|USER|>`` opener in the array)::

    tokens: u  E  A  a  E
    mask:   0  0  0  0  0      (the context span is not complete in this array)
"""

from __future__ import annotations

import numpy as np

from .markers import MarkerIds

# kinds of structural tokens: the span openers first
_SYS, _USER, _ASST, _TOOL, _CTX_ASST, _END, _EOS = range(7)


def _structural(m: MarkerIds) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, kinds)`` of the structural tokens a dataset has (a dataset written before
    ``<|ASSISTANT_CONTEXT|>`` existed has no such opener)."""
    pairs = [(m.system, _SYS), (m.user, _USER), (m.assistant, _ASST), (m.tool, _TOOL),
             (m.assistant_context, _CTX_ASST), (m.end, _END), (m.eos, _EOS)]
    pairs = [(c, k) for c, k in pairs if c is not None]
    return (np.array([c for c, _ in pairs], dtype=np.int64), np.array([k for _, k in pairs], dtype=np.int64))


def loss_mask(ids: np.ndarray, m: MarkerIds) -> np.ndarray:
    """Return the uint8 loss mask (1 = trained target) for ``ids``. Pure; no input is changed.

    Vectorised: the work is over the structural tokens (one per span), never a
    Python loop over tokens.
    """
    return rule_mask(ids, m)[0]


def rule_mask(ids: np.ndarray, m: MarkerIds) -> tuple[np.ndarray, int]:
    """``(loss_mask(ids, m), stop)``: ``stop`` is the position of the first unclosed
    ``<|ASSISTANT|>``, from which the rule trains nothing to the end of the array, or -1.

    For a caller that masks many episodes with one call (verify): where ``stop`` is -1
    and every episode ends with EOS, the one mask equals the masks of the episodes alone.
    """
    ids = np.asarray(ids)
    n = ids.shape[0]
    mask = np.zeros(n, dtype=np.uint8)
    if n == 0:
        return mask, -1
    codes, kinds = _structural(m)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    # Markers sit at the top of the vocabulary: one comparison over the whole array finds
    # the few candidates, and the exact lookup runs on those only (5x faster than a
    # lookup per token, which matters to verify on gigabytes).
    cand = np.flatnonzero(ids >= int(sorted_codes[0]))
    cand_ids = ids[cand].astype(np.int64)
    pos_in_sorted = np.minimum(np.searchsorted(sorted_codes, cand_ids), len(codes) - 1)
    is_struct = sorted_codes[pos_in_sorted] == cand_ids
    pos = cand[is_struct]
    if pos.size == 0:
        return mask, -1
    kind = kinds[order[pos_in_sorted[is_struct]]]
    k = pos.size
    nxt_kind = np.empty(k, dtype=kind.dtype)
    nxt_kind[:-1] = kind[1:]
    nxt_kind[-1] = -1
    is_opener = kind <= _CTX_ASST
    complete = is_opener & (nxt_kind == _END)
    idx = np.arange(k)
    # latest context opener (USER/TOOL) at or before each structural token, and latest EOS
    last_ctx = np.maximum.accumulate(np.where((kind == _USER) | (kind == _TOOL), idx, -1))
    last_eos = np.maximum.accumulate(np.where(kind == _EOS, idx, -1))
    is_asst = kind == _ASST
    # the context opener strictly before the assistant, in the same conversation
    prev_ctx = np.empty(k, dtype=np.int64)
    prev_ctx[0] = -1
    prev_ctx[1:] = last_ctx[:-1]
    ctx_ok = (prev_ctx >= 0) & (prev_ctx > last_eos) & complete[np.maximum(prev_ctx, 0)]
    trained = is_asst & complete & ctx_ok
    # an unclosed assistant span zeroes itself and everything after it
    broken = np.flatnonzero(is_asst & ~complete)
    stop = int(pos[broken[0]]) if broken.size else -1
    if broken.size:
        trained &= idx < broken[0]
    t = np.flatnonzero(trained)
    if t.size == 0:
        return mask, stop
    starts = pos[t]
    ends = pos[t + 1]  # the closing <|END|>, inclusive
    # trained spans are disjoint and in order: the mask is alternating runs of 0 and 1
    bounds = np.empty(2 * t.size + 2, dtype=np.int64)
    bounds[0], bounds[-1] = 0, n
    bounds[1:-1:2] = starts
    bounds[2:-1:2] = ends + 1
    runs = np.diff(bounds)
    values = np.zeros(runs.size, dtype=np.uint8)
    values[1::2] = 1
    return np.repeat(values, runs), stop
