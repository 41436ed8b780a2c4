"""The smallest block size that keeps a share of the trained tokens. Pure; no I/O.

A trained span (an ``<|ASSISTANT|>`` through its ``<|END|>``, trained by the mask rule
over its episode) stays trained in a row only when the row holds the span and its
complete context span (the ``<|USER|>`` or ``<|TOOL|>`` span before it). The row length
that takes depends on how an episode longer than a row is cut (``--overlong``):

* ``truncate`` (the episode's first ``row_len`` tokens): the span's ``<|END|>`` at
  episode position ``e`` needs ``row_len >= e + 1``;
* ``keep_end`` (its last ``row_len`` tokens, episode length ``n``): the context opener
  at position ``c`` needs ``row_len >= n - c``;
* ``drop`` (whole episodes only): ``row_len >= n``.

One episode of 16 tokens with two trained spans (3 tokens each)::

    position:  0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
    tokens:    S s E U u E A a E U v  E  A  b  E  EOS
    span 1 (A at 6, END at 8, context U at 3):  truncate 9,  keep_end 13, drop 16
    span 2 (A at 12, END at 14, context U at 9): truncate 15, keep_end 7,  drop 16

Keeping 99% (here: both spans) takes rows of 15 tokens with ``truncate`` (block size
14), 13 with ``keep_end`` (12) and 16 with ``drop`` (15); keeping one span of two takes
9, 7 and 16. These figures are exact for the ``bfd`` strategy (one segment per episode).
``split`` keeps at least what ``truncate`` keeps at the same size (its first piece is
truncate's row), so the truncate figure is enough for it; ``stream`` cuts episodes
where rows end and has no such figure.

With a model template's rule (``loss_rule.TemplateRule``) a reply is a span from after
its header through its end-of-turn token; a row that keeps an episode's end trains a
reply only when it also holds the reply before it (the first reply of a cut segment is
never trained), so ``keep_end`` needs the previous reply's header, and the first reply
of an episode needs the whole episode.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..chat.loss_rule import LossRule, as_rule
from ..chat.markers import MarkerIds
from ..chat.template_rule import header_spans, rule_spans
from .plan import MIN_BLOCK_SIZE, segment_masks

KEEP_PERCENT = 99  # the share of trained tokens a block size is suggested for


@dataclass(frozen=True)
class TrainedSpans:
    """The trained spans of some episodes: int64 arrays, one entry per span."""

    tokens: np.ndarray  # trained tokens of the span
    need_head: np.ndarray  # row length that keeps it when an episode keeps its first tokens (truncate)
    need_tail: np.ndarray  # ... its last tokens (keep_end)
    need_whole: np.ndarray  # ... only whole episodes (drop): the episode's length

    @classmethod
    def empty(cls) -> TrainedSpans:
        return cls(*(np.zeros(0, np.int64) for _ in fields(cls)))

    @classmethod
    def concat(cls, parts: list[TrainedSpans]) -> TrainedSpans:
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    @property
    def total(self) -> int:
        return int(self.tokens.sum())

    def need(self, overlong: str) -> np.ndarray:
        """The row length each span needs under ``overlong`` (``split``: truncate's, an
        upper bound)."""
        return {"truncate": self.need_head, "split": self.need_head, "keep_end": self.need_tail,
                "drop": self.need_whole}[overlong]


def trained_spans(tokens: np.ndarray, lengths: np.ndarray, rule: LossRule | MarkerIds) -> TrainedSpans:
    """The trained spans of the episodes laid end to end in ``tokens`` (``lengths``
    each), by the mask rule per episode, and the row length each needs (module
    docstring). ``tokens.sum()`` of the result is the episodes' trained tokens."""
    tokens = np.asarray(tokens)
    lengths = np.asarray(lengths, dtype=np.int64)
    rule = as_rule(rule)
    if rule.kind != "markers":
        return _template_spans(tokens, lengths, rule)
    m = rule.markers
    mask = segment_masks(tokens, lengths, m)
    starts = np.flatnonzero((tokens == m.assistant) & (mask == 1))
    if starts.size == 0:
        return TrainedSpans.empty()
    ends = np.flatnonzero(tokens == m.end)
    e = ends[np.searchsorted(ends, starts)]  # a trained span is closed by the first <|END|> after it
    ctx = np.flatnonzero((tokens == m.user) | (tokens == m.tool))
    c = ctx[np.searchsorted(ctx, starts) - 1]  # a trained span has a context opener before it
    ep_end = np.cumsum(lengths)
    ep = np.searchsorted(ep_end, starts, side="right")
    ep_start = ep_end[ep] - lengths[ep]
    return TrainedSpans(tokens=e - starts + 1, need_head=e - ep_start + 1, need_tail=ep_end[ep] - c,
                        need_whole=lengths[ep].copy())


def _template_spans(tokens: np.ndarray, lengths: np.ndarray, rule) -> TrainedSpans:
    """``trained_spans`` by a template's rule: spans per episode (a stop after each)."""
    n = lengths.size
    total = int(lengths.sum())
    where = np.arange(total, dtype=np.int64) + np.repeat(np.arange(n, dtype=np.int64), lengths)
    buf = np.full(total + n, -1, dtype=np.int64)
    buf[where] = tokens
    stops = np.cumsum(lengths) + np.arange(n, dtype=np.int64)
    starts, ends = rule_spans(buf, rule.rule, stops)
    if starts.size == 0:
        return TrainedSpans.empty()
    ep = np.searchsorted(stops, starts, side="left")
    ep_start = stops[ep] - lengths[ep]  # in the layout
    ep_end = stops[ep]
    closer = ends - 1 if rule.rule.end_inclusive else ends  # the end-of-turn token must be in the row
    h_begin, h_end = header_spans(buf, rule.rule)
    order = np.lexsort((h_begin, h_end))
    h_begin, h_end = h_begin[order], h_end[order]
    begin = h_begin[np.searchsorted(h_end, starts, side="left")]  # the (longest) header of each span
    first = np.ones(starts.size, dtype=bool)
    first[1:] = ep[1:] != ep[:-1]
    prev_begin = np.empty_like(begin)
    prev_begin[1:] = begin[:-1]
    need_tail = np.where(first, lengths[ep], ep_end - np.where(first, 0, prev_begin))
    return TrainedSpans(tokens=ends - starts, need_head=closer - ep_start + 1, need_tail=need_tail,
                        need_whole=lengths[ep].copy())


def smallest_row_len(need: np.ndarray, weight: np.ndarray, percent: int = KEEP_PERCENT) -> int:
    """The smallest ``r`` with ``weight[need <= r].sum() >= percent / 100 * weight.sum()``
    (exact, in integers); 0 when the weights sum to 0.

    >>> smallest_row_len(np.array([9, 15]), np.array([3, 3]), 50), smallest_row_len(np.array([9, 15]), np.array([3, 3]))
    (9, 15)
    """
    need = np.asarray(need, dtype=np.int64)
    weight = np.asarray(weight, dtype=np.int64)
    total = int(weight.sum())
    if total == 0:
        return 0
    order = np.argsort(need, kind="stable")
    cum = np.cumsum(weight[order])
    goal = -(-percent * total // 100)
    return int(need[order][int(np.searchsorted(cum, goal, side="left"))])


def min_block_size(spans: TrainedSpans, overlong: str, percent: int = KEEP_PERCENT) -> int | None:
    """The smallest ``--block-size`` (at least ``MIN_BLOCK_SIZE``) at which ``bfd`` with
    ``overlong`` keeps ``percent`` % of the spans' trained tokens; None when they hold
    none. For ``split`` the figure is truncate's (enough, perhaps not the smallest)."""
    r = smallest_row_len(spans.need(overlong), spans.tokens, percent)
    return None if r == 0 else max(MIN_BLOCK_SIZE, r - 1)
