"""Stop tokens: which ids end a trained reply, and the trained replies that cannot stop.

A model learns to stop only if every reply it is trained on ends with a *trained* stop
id: the end-of-turn token of the dataset's rule (``<|END|>`` for sftdata's chat markers,
a template's ``end_ids`` such as ``<|eot_id|>`` or ``<|im_end|>``). Pure, over numpy
arrays, for verify (per episode, per packed row) and for prepare (the rule alone)::

    tokens:  <|USER|> hi <|END|> <|ASSISTANT|> hello <|END|> <|EOS|>
    mask:        0     0    0          1         1      1       0
                                                        ^ the trained span ends with a stop id: it can stop

    template rule without the end-of-turn token (a {% generation %} block that leaves it out):
    tokens:  <sh> assistant <eh> Hello ! <|eot_id|>
    mask:      0      0       0    1   1     0
                                       ^ ends with "!": this reply never learns to stop

The pad id must never be trained and must not be a stop id: trainers that derive labels
from ``input_ids != pad_id`` then mask every stop token (the model never stops), and an
inference config whose pad id is also a stop id ends or trims completions wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .loss_rule import LossRule, MarkerRule, TemplateRule


def rule_stop_ids(rule: LossRule) -> tuple[int, ...]:
    """The ids a trained reply ends with under ``rule``: ``<|END|>`` (chat markers), the
    template's end-of-turn ids (a template), and the last id of each of its end-of-turn
    markers of several tokens (a text marker: RWKV World's ``\n\n`` as ``\n``, ``\n``)."""
    if isinstance(rule, MarkerRule):
        return (int(rule.markers.end),)
    if isinstance(rule, TemplateRule):
        return serving_stop_ids(rule) + tuple(dict.fromkeys(int(e[-1]) for e in rule.rule.end_seqs
                                                            if int(e[-1]) not in rule.rule.end_ids))
    raise TypeError(f"not a mask rule: {type(rule).__name__}")


def serving_stop_ids(rule: LossRule) -> tuple[int, ...]:
    """The ids generation stops at under ``rule`` (``serving.json``): its one-token
    end-of-turn ids; a marker of several tokens is a stop string only."""
    if isinstance(rule, TemplateRule):
        return tuple(int(i) for i in rule.rule.end_ids)
    return rule_stop_ids(rule)


def rule_opener(rule: LossRule) -> int | None:
    """The id a trained reply of ``rule`` opens with, inside its trained span: ``<|ASSISTANT|>``
    (chat markers); None for a template (its header is never trained)."""
    return int(rule.markers.assistant) if isinstance(rule, MarkerRule) else None


def rule_trains_stop(rule: LossRule) -> bool:
    """Whether the rule trains its end-of-turn token (a template's ``{% generation %}``
    blocks may leave it out: then no reply ever learns to stop)."""
    return not isinstance(rule, TemplateRule) or bool(rule.rule.end_inclusive)


@dataclass(frozen=True)
class StopScan:
    """What ``scan_stops`` finds in a chunk of whole pieces (episodes or rows).

    ``unstoppable``: local piece index and in-piece position of the last token of each
    trained span that does not end with a stop id, in order; ``pad_trained``: the same
    for every trained token holding the pad id; ``empty``: the same for the last token of
    each trained reply that is empty (its only trained tokens its end-of-turn, and the
    opener of a marker reply)."""

    unstoppable: tuple[np.ndarray, np.ndarray]
    pad_trained: tuple[np.ndarray, np.ndarray]
    empty: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.int64), np.empty(0, np.int64))


def span_ends(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Positions of the last token of every trained span (maximal run of 1s) of a chunk of
    pieces; ``offsets`` (length pieces + 1) bound the pieces, and no span crosses one.

    >>> span_ends(np.array([0, 1, 1, 0, 1, 1, 1]), np.array([0, 5, 7])).tolist()
    [2, 4, 6]
    """
    m = np.asarray(mask) != 0
    n = m.shape[0]
    if n == 0:
        return np.empty(0, np.int64)
    last = np.zeros(n, dtype=bool)
    last[np.asarray(offsets[1:], dtype=np.int64) - 1] = True  # the last token of each piece
    nxt = np.ones(n, dtype=bool)
    nxt[:-1] = ~m[1:]
    return np.flatnonzero(m & (nxt | last)).astype(np.int64)


def span_starts(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Positions of the first token of every trained span (``span_ends``' spans, in order).

    >>> span_starts(np.array([0, 1, 1, 0, 1, 1, 1]), np.array([0, 5, 7])).tolist()
    [1, 4, 5]
    """
    m = np.asarray(mask) != 0
    n = m.shape[0]
    if n == 0:
        return np.empty(0, np.int64)
    first = np.zeros(n, dtype=bool)
    first[np.asarray(offsets[:-1], dtype=np.int64)] = True  # the first token of each piece
    prev = np.ones(n, dtype=bool)
    prev[1:] = ~m[:-1]
    return np.flatnonzero(m & (prev | first)).astype(np.int64)


def scan_stops(ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray, stops: tuple[int, ...],
               pad_id: int | None, opener: int | None = None) -> StopScan:
    """Trained spans of a chunk that do not end with one of ``stops``, trained pad tokens
    (``pad_id`` None: not checked), and empty replies: spans holding nothing but their
    stop id (and ``opener``, the chat markers' ``<|ASSISTANT|>``, where it opens them).
    ``offsets`` bound the chunk's pieces::

        markers:  <|ASSISTANT|> <|END|>     template:  <|eot_id|>
        mask:           1          1                       1        (empty: nothing but the stop)
    """
    ids = np.asarray(ids)
    offsets = np.asarray(offsets, dtype=np.int64)
    ends = span_ends(mask, offsets)
    stop_ids = np.asarray(stops, dtype=np.int64)
    stopped = np.isin(ids[ends], stop_ids)
    bad = ends[~stopped]
    starts = span_starts(mask, offsets)
    content = ends - starts  # the trained tokens before the stop
    if opener is not None:
        content = content - (ids[starts] == opener)
    empty = ends[stopped & (content == 0)]
    pads = np.empty(0, np.int64) if pad_id is None else np.flatnonzero((np.asarray(mask) != 0) & (ids == pad_id))

    def located(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = np.searchsorted(offsets, p, side="right") - 1
        return k.astype(np.int64), (p - offsets[k]).astype(np.int64)

    return StopScan(located(bad), located(pads), located(empty))
