"""The loss-mask rule of a dataset: one interface (``LossRule``), two implementations, and
the one function that loads it from ``tokenizer_state.json`` (``rule_from_state``).

* ``MarkerRule``: sftdata's chat markers (``masking.loss_mask``): an assistant span is
  trained from ``<|ASSISTANT|>`` through its ``<|END|>`` when the context span before it
  is complete in the same array (``<|ASSISTANT_CONTEXT|>`` opens one that is never trained);
* ``TemplateRule``: a model's chat template (``template.MaskRule``): from the token after
  an assistant header through the next end-of-turn token.

Pack (per segment of a row), verify (per episode, and per segment of packed rows) and
inspect (the rule's mask beside the stored one) all call the same methods::

    rule = rule_from_state(ds.tokenizer_state)
    rule.masks(tokens, lengths, cut)   # uint8: each piece masked as if alone
    rule.where(ids, p)                 # "a <|USER|> span", "an assistant reply", ...

A piece that begins inside its episode (``cut``: a row of stream packing, a later piece
of a split episode) never trains a reply whose context may be missing. The marker rule
needs no flag for it (it sees whether the user or tool span before a reply is complete).
The template rule knows only where replies start and stop, not where other turns do, so
it leaves the first reply of a cut piece untrained: everything between the end of a
reply and the next header lies in the piece, so later replies have their whole context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import DatasetError, SftDataError
from ..tokenize import is_hf_state
from ..util.ranges import range_index
from .markers import EOS, MarkerIds
from .masking import rule_mask as marker_rule_mask
from .template_rule import MaskRule, header_spans, rule_spans, segment_rule_mask


class LossRule(Protocol):
    """What every user of a dataset's mask rule calls."""

    kind: str  # "markers" | "template"
    eos_id: int | None  # the id every episode ends with (markers), None when none is required
    pad_id: int  # what rows are padded with unless told otherwise

    def masks(self, tokens: np.ndarray, lengths: np.ndarray, cut: np.ndarray | None = None,
              last_only: np.ndarray | None = None) -> np.ndarray:
        """``concatenate([mask(piece) for piece in pieces])``: ``lengths`` tokens each, each
        masked as if alone; ``cut[i]`` says piece ``i`` begins inside its episode;
        ``last_only[i]``: piece ``i`` trains its last reply only (a template's episode
        served as one reply's prefix; the markers never flag one)."""
        ...

    def where(self, ids: np.ndarray, p: int) -> str:
        """Which part of one episode token ``p`` lies in, for messages."""
        ...

    def span_names(self, ids: np.ndarray, last_only: bool = False) -> list[str]:
        """The span each token of one episode lies in (``inspect --tokens``; ``last_only``:
        the episode is flagged to train its last reply only)."""
        ...


def _check_lengths(tokens: np.ndarray, lengths: np.ndarray) -> int:
    total = int(lengths.sum())
    if total != tokens.shape[0]:
        raise ValueError(f"segment lengths sum to {total}, but {tokens.shape[0]} tokens were given")
    return total


@dataclass(frozen=True)
class MarkerRule:
    """The rule of sftdata's chat markers (docs/ARCHITECTURE.md §3, ``masking``)."""

    markers: MarkerIds
    kind = "markers"

    @property
    def eos_id(self) -> int:
        return self.markers.eos

    @property
    def pad_id(self) -> int:
        return self.markers.eos

    def masks(self, tokens: np.ndarray, lengths: np.ndarray, cut: np.ndarray | None = None,
              last_only: np.ndarray | None = None) -> np.ndarray:
        """One ``loss_mask`` call over all pieces. When every piece ends with EOS and none
        holds an unclosed ``<|ASSISTANT|>``, the rule over their concatenation is exact (it
        resets at EOS). Otherwise the pieces are laid out with one EOS after each, which
        resets the context and leaves an opener at a piece's end incomplete, exactly as the
        piece's own end does; an unclosed ``<|ASSISTANT|>`` (which zeroes everything after
        it in an array, but must zero only the rest of its own piece) is replaced by EOS in
        the layout and the rest of its piece is zeroed afterwards::

            pieces:  U u E A   a     | U v E A w E EOS
            layout:  U u E EOS a EOS   U v E A w E EOS EOS
            mask:    0 0 0 0   0     | 0 0 0 1 1 1 0
        """
        m = self.markers
        if last_only is not None and np.any(last_only):
            raise DatasetError("an episode is flagged 'last reply only', which only a chat template's rule knows; "
                               "the dataset's files disagree with its tokenizer_state.json: re-prepare it")
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int64)
        total = _check_lengths(tokens, lengths)
        if total == 0:
            return np.zeros(0, dtype=np.uint8)
        if lengths.min() > 0:
            derived, stop = marker_rule_mask(tokens, m)
            if stop < 0 and np.all(tokens[np.cumsum(lengths) - 1] == m.eos):
                return derived
        n = lengths.size
        where = np.arange(total, dtype=np.int64) + np.repeat(np.arange(n, dtype=np.int64), lengths)  # in the layout
        buf = np.full(total + n, m.eos, dtype=np.int64)
        buf[where] = tokens
        openers = (m.system, m.user, m.assistant, m.tool, m.assistant_context, m.end, m.eos)
        pos = np.flatnonzero(np.isin(buf, [c for c in openers if c is not None]))
        ids = buf[pos]
        asst = np.flatnonzero(ids == m.assistant)
        unclosed = pos[asst[ids[asst + 1] != m.end]]  # the layout ends with EOS: asst + 1 always exists
        if not unclosed.size:
            return marker_rule_mask(buf, m)[0][where]
        buf[unclosed] = m.eos
        mask = marker_rule_mask(buf, m)[0]
        ends = np.cumsum(lengths) + np.arange(n)  # the EOS after each piece
        seg = np.searchsorted(ends, unclosed, side="right")
        first = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])  # the first unclosed opener of each piece
        q = unclosed[first]
        mask[range_index(q, ends[seg[first]] - q)] = 0
        return mask[where]

    def where(self, ids: np.ndarray, p: int) -> str:
        m = self.markers
        openers = {m.system: "<|SYSTEM|>", m.user: "<|USER|>", m.assistant: "<|ASSISTANT|>", m.tool: "<|TOOL|>"}
        if m.assistant_context is not None:
            openers[m.assistant_context] = "<|ASSISTANT_CONTEXT|>"
        if int(ids[p]) == m.eos:
            return f"the closing {EOS}"
        seg = np.asarray(ids[:p + 1])
        op = np.flatnonzero(np.isin(seg, list(openers)))
        if not op.size or np.any(seg[op[-1]:p] == m.end):
            return "text outside any span"
        return f"a {openers[int(seg[op[-1]])]} span"

    def span_names(self, ids: np.ndarray, last_only: bool = False) -> list[str]:
        span_of = {"<|SYSTEM|>": "system", "<|USER|>": "user", "<|ASSISTANT|>": "assistant", "<|TOOL|>": "tool",
                   "<|ASSISTANT_CONTEXT|>": "assistant"}
        out, cur = [], ""
        for t in np.asarray(ids).tolist():
            name = self.markers.name(t)
            cur = span_of.get(name, cur)
            out.append(cur)
            if name in ("<|END|>", EOS):
                cur = ""
        return out


@dataclass(frozen=True)
class TemplateRule:
    """The rule a model's chat template yields (``template.MaskRule``, learned at prepare
    time): trained = from the token after an assistant header through the next
    end-of-turn token."""

    rule: MaskRule
    pad_id: int
    kind = "template"
    eos_id = None  # a template's episodes end with whatever it writes last

    def masks(self, tokens: np.ndarray, lengths: np.ndarray, cut: np.ndarray | None = None,
              last_only: np.ndarray | None = None) -> np.ndarray:
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int64)
        _check_lengths(tokens, lengths)
        return segment_rule_mask(tokens, lengths, self.rule, cut, last_only)

    def _parts(self, ids: np.ndarray, last_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Per token: inside a trained reply; inside an assistant header."""
        ids = np.asarray(ids)
        n = ids.shape[0]
        starts, ends = rule_spans(ids, self.rule, last_only=np.array([True]) if last_only else None)
        reply = np.zeros(n, dtype=bool)
        reply[range_index(starts, ends - starts)] = True
        header = np.zeros(n, dtype=bool)
        begins, ends = header_spans(ids, self.rule)
        header[range_index(begins, ends - begins)] = True
        return reply, header

    def where(self, ids: np.ndarray, p: int) -> str:
        reply, header = self._parts(ids)
        if reply[p]:
            return "an assistant reply"
        if header[p]:
            return "an assistant header"
        return "text outside any assistant reply"

    def span_names(self, ids: np.ndarray, last_only: bool = False) -> list[str]:
        reply, header = self._parts(ids, last_only)
        return ["assistant" if r else "header" if h else "" for r, h in zip(reply.tolist(), header.tolist())]


def as_rule(rule: LossRule | MarkerIds) -> LossRule:
    """``rule`` itself, or the ``MarkerRule`` of chat markers given as ``MarkerIds``."""
    return MarkerRule(rule) if isinstance(rule, MarkerIds) else rule


def rule_from_state(state: dict | None, where: str = "tokenizer_state.json") -> LossRule | None:
    """The mask rule a ``tokenizer_state.json`` records: its ``mask_rule`` (a model's
    template), or its chat markers. None when there is no state; ``DatasetError`` naming
    ``where`` when it records no usable rule."""
    if state is None:
        return None
    if not isinstance(state, dict):
        raise DatasetError(f"{where} is not a JSON object; re-prepare the dataset")
    if is_hf_state(state):
        rule = MaskRule.from_state(state.get("mask_rule"), where)
        pad = state.get("pad_id", state.get("eos_id"))
        if not isinstance(pad, int) or isinstance(pad, bool):
            pad = rule.end_ids[0]  # a tokenizer with neither pad nor EOS: the end-of-turn id pads
        return TemplateRule(rule, int(pad))
    try:
        return MarkerRule(MarkerIds.from_special_tokens(state["special_tokens"]))
    except (SftDataError, KeyError, TypeError):
        raise DatasetError(f"{where} records neither sftdata's chat markers (special_tokens) nor a template's "
                           f"mask_rule, so the loss mask cannot be re-derived; re-prepare the dataset") from None
