"""The mask rule a chat template yields, re-derivable from token ids alone.

Learned from the template at prepare time and stored in ``tokenizer_state.json`` so that
verify and pack can re-derive every mask without the template, the tokenizer or the text:

* ``headers``: the id sequences that open an assistant reply (the role header the
  generation prompt writes, e.g. Llama 3's ``<|start_header_id|>assistant<|end_header_id|>\\n\\n``,
  or for a template with no assistant header the token before the reply, Mistral's ``[/INST]``);
* ``end_ids``: the end-of-turn token(s) that close a reply (``<|eot_id|>``, ``<|im_end|>``);
* ``end_inclusive``: whether the end-of-turn token is trained (it is, so the model learns
  to stop, unless a template's ``{% generation %}`` blocks leave it out);
* ``last_reply_only``: for a template whose replies can only be located one at a time
  (each episode is the render up to one reply), only the episode's last reply is trained:
  its last span, and where ``joined_spans`` (learned: a probe reply was several spans) the
  spans right before it that only a header separates from it (a reply whose reasoning the
  template writes as a message of its own, gpt-oss's analysis channel, is two spans; so is
  an assistant message right after another under such a template). The rule then applies
  to one episode's ids at a time;
* ``end_seqs``: end-of-turn markers of several tokens, for a template that closes a reply
  with text, not an added token (RWKV World's ``\n\n``, split ``\n``, ``\n`` before the
  next turn's text): a reply ends after the first of them or of ``end_ids``; recorded only
  where there is one;
* ``asked``: the id sequences that open a turn a reply answers (a user turn's header,
  ``<|start_header_id|>user<|end_header_id|>``, ``<|im_start|>user``; a tool result's). A
  reply with none of them before it in its episode answers no one (a conversation that
  opens with the assistant) and is not trained, as with sftdata's markers. Empty (a rule
  recorded before it existed, or a template whose turns it cannot tell): every reply is;
* ``media_ids``: the ids that stand for an image's or video's pixels (Qwen's ``<|image_pad|>``,
  ``<|video_pad|>``): never trained, wherever they are; recorded only where the dataset was
  prepared for a vision model's processor (a rule without them reads as before).

Rule: mask = 1 from the token after a header through the next end-of-turn token (inclusive
when ``end_inclusive``); a header with no end-of-turn token after it trains nothing; all
else is 0. Worked example in Llama 3's format (H = the four header tokens, E = ``<|eot_id|>``)::

    tokens: <bos> <sh> user <eh> \\n\\n Hi E   <sh> assistant <eh> \\n\\n Hello ! E
    mask:     0    0    0    0    0    0  0    0      0       0    0     1   1  1
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DatasetError

RULE_KIND = "template-headers"


@dataclass(frozen=True)
class MaskRule:
    headers: tuple[tuple[int, ...], ...]
    end_ids: tuple[int, ...]
    end_inclusive: bool = True
    last_reply_only: bool = False
    asked: tuple[tuple[int, ...], ...] = ()
    joined_spans: bool = False  # a reply may be several spans only a header separates (gpt-oss's reasoning)
    end_seqs: tuple[tuple[int, ...], ...] = ()  # end-of-turn markers of several tokens (a text marker)
    media_ids: tuple[int, ...] = ()  # media placeholder ids: mask 0 wherever they are

    def state(self) -> dict:
        out = {"kind": RULE_KIND, "headers": [list(h) for h in self.headers], "end_ids": list(self.end_ids),
               "end_inclusive": self.end_inclusive, "last_reply_only": self.last_reply_only}
        if self.asked:  # recorded only where there is one: a rule without it reads as before
            out["asked"] = [list(h) for h in self.asked]
        if self.end_seqs:
            out["end_seqs"] = [list(e) for e in self.end_seqs]
        if self.media_ids:
            out["media_ids"] = list(self.media_ids)
        return {**out, "joined_spans": True} if self.joined_spans else out  # absent: false (older datasets)

    @classmethod
    def from_state(cls, state: dict, where: str = "tokenizer_state.json") -> MaskRule:
        """Rebuild a rule from ``state()``; a malformed one is a ``DatasetError`` naming ``where``."""
        def ints(v) -> bool:
            return isinstance(v, list) and bool(v) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                           for i in v)

        if not isinstance(state, dict) or state.get("kind") != RULE_KIND:
            raise DatasetError(f"{where}: mask_rule is not a {RULE_KIND!r} rule; re-prepare the dataset")
        headers, end_ids = state.get("headers"), state.get("end_ids")
        asked, seqs, media = state.get("asked", []), state.get("end_seqs", []), state.get("media_ids", [])
        if not (isinstance(headers, list) and headers and all(ints(h) for h in headers)
                and isinstance(seqs, list) and all(ints(e) for e in seqs)
                and (ints(end_ids) or (end_ids == [] and seqs))
                and isinstance(state.get("end_inclusive"), bool)
                and isinstance(state.get("last_reply_only", False), bool)
                and isinstance(asked, list) and all(ints(h) for h in asked)
                and isinstance(state.get("joined_spans", False), bool)
                and (media == [] or ints(media))):
            raise DatasetError(f"{where}: mask_rule needs non-empty 'headers' (lists of token ids), 'end_ids' "
                               f"(empty only beside 'end_seqs', lists of token ids), booleans 'end_inclusive' and "
                               f"'last_reply_only', 'asked' (lists of token ids) where given and the boolean "
                               f"'joined_spans' and 'media_ids' (token ids) where given; re-prepare the dataset")
        return cls(tuple(tuple(h) for h in headers), tuple(end_ids), state["end_inclusive"],
                   state.get("last_reply_only", False), tuple(tuple(h) for h in asked),
                   state.get("joined_spans", False), tuple(tuple(e) for e in seqs), tuple(media))


def _header_ends(ids: np.ndarray, header: tuple[int, ...]) -> np.ndarray:
    """Positions just after each occurrence of ``header`` in ``ids``: one pass over the
    array for the first token, then the few candidates only."""
    n, m = ids.shape[0], len(header)
    if n < m:
        return np.empty(0, dtype=np.int64)
    cand = np.flatnonzero(ids[: n - m + 1] == header[0])
    for j in range(1, m):  # a loop over the header's few tokens, on the candidates only
        if not cand.size:
            break
        cand = cand[ids[cand + j] == header[j]]
    return cand.astype(np.int64) + m


def header_spans(ids: np.ndarray, rule: MaskRule) -> tuple[np.ndarray, np.ndarray]:
    """Begin and end (exclusive) of every occurrence of one of the rule's headers, by begin."""
    ids = np.asarray(ids)
    found = [(_header_ends(ids, h), len(h)) for h in rule.headers]
    ends = np.concatenate([e for e, _ in found] or [np.empty(0, np.int64)]).astype(np.int64)
    begins = np.concatenate([e - m for e, m in found] or [np.empty(0, np.int64)]).astype(np.int64)
    order = np.argsort(begins, kind="stable")
    return begins[order], ends[order]


def _positions_of(ids: np.ndarray, values: tuple[int, ...]) -> np.ndarray:
    if not values:
        return np.empty(0, np.int64)
    hit = ids == values[0]
    for v in values[1:]:
        hit |= ids == v
    return np.flatnonzero(hit)


def _end_positions(ids: np.ndarray, rule: MaskRule) -> tuple[np.ndarray, np.ndarray]:
    """Where each end-of-turn marker begins, by position, and its length in tokens: the
    ``end_ids`` (one token) and the ``end_seqs``, the longest where two begin at one place."""
    pos = _positions_of(ids, rule.end_ids).astype(np.int64)
    if not rule.end_seqs:
        return pos, np.ones(pos.size, np.int64)
    found = [(_header_ends(ids, e) - len(e), len(e)) for e in rule.end_seqs]
    pos = np.concatenate([pos] + [p for p, _ in found]).astype(np.int64)
    lens = np.concatenate([np.ones(pos.size - sum(p.size for p, _ in found), np.int64)]
                          + [np.full(p.size, m, np.int64) for p, m in found])
    order = np.lexsort((-lens, pos))
    pos, lens = pos[order], lens[order]
    keep = np.ones(pos.size, dtype=bool)
    keep[1:] = pos[1:] != pos[:-1]
    return pos[keep], lens[keep]


def rule_spans(ids: np.ndarray, rule: MaskRule, stops: np.ndarray | None = None,
               cut: np.ndarray | None = None, last_only: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The trained token spans ``[starts[i], ends[i])`` the rule finds, disjoint and in order.
    Where one header is a prefix of another at the same place (``<|im_start|>assistant\n``
    and the same followed by an empty think block), the longer one is the header.

    ``stops`` (sorted positions holding no token of the rule) split ``ids`` into pieces that
    are masked as if alone: a span open at a stop trains nothing, and ``last_reply_only``
    keeps the last span of each piece. ``cut`` (a bool per piece) marks pieces that begin
    inside an episode: their first span is not trained (the context before it may be cut).
    With ``asked``, a span with no asked turn's header before it in its piece answers no
    one and is not trained. ``last_only`` (a bool per piece): the piece keeps its last
    reply only, as under ``last_reply_only`` (an episode served as one reply's prefix in a
    dataset whose rule trains every reply: ``store.format.LAST_REPLY_FILE``).
    """
    ids = np.asarray(ids)
    found = [(_header_ends(ids, h), len(h)) for h in rule.headers]
    ends_ = np.concatenate([e for e, _ in found] or [np.empty(0, np.int64)]).astype(np.int64)
    begins = np.concatenate([e - m for e, m in found] or [np.empty(0, np.int64)]).astype(np.int64)
    if len(found) > 1:
        order = np.lexsort((-ends_, begins))  # by begin, the longest first
        begins, ends_ = begins[order], ends_[order]
        keep = np.ones(begins.size, dtype=bool)
        keep[1:] = begins[1:] != begins[:-1]
        starts, first_at = np.unique(ends_[keep], return_index=True)
        heads = begins[keep][first_at]
    else:
        starts, heads = ends_, begins
    end_pos, end_len = _end_positions(ids, rule)
    stops = np.empty(0, np.int64) if stops is None else np.asarray(stops, dtype=np.int64)
    if stops.size:
        is_stop = np.concatenate([np.zeros(end_pos.size, bool), np.ones(stops.size, bool)])
        closers = np.concatenate([end_pos, stops])
        lengths = np.concatenate([end_len, np.ones(stops.size, np.int64)])
        order = np.argsort(closers, kind="stable")
        closers, is_stop, lengths = closers[order], is_stop[order], lengths[order]
    else:
        closers, is_stop, lengths = end_pos, np.zeros(end_pos.size, bool), end_len
    k = np.searchsorted(closers, starts, side="left")
    closed = k < closers.size
    starts, k, heads = starts[closed], k[closed], heads[closed]
    # a header inside a span already opened belongs to that span: keep the first start per end
    first = np.ones(k.size, dtype=bool)
    first[1:] = k[1:] != k[:-1]
    starts, k, heads = starts[first], k[first], heads[first]
    real = ~is_stop[k]  # a span still open where its piece ends trains nothing
    starts, k, heads = starts[real], k[real], heads[real]
    ends = closers[k] + (lengths[k] if rule.end_inclusive else 0)
    after = closers[k] + lengths[k]  # just after each span's end-of-turn token(s)
    piece = np.searchsorted(stops, starts, side="left")
    if cut is not None and starts.size:  # before ``asked``: the cut piece's first span, answered or not
        lead = np.ones(piece.size, dtype=bool)
        lead[1:] = piece[1:] != piece[:-1]
        drop = lead & np.asarray(cut, dtype=bool)[piece]
        starts, ends, piece, heads, after = starts[~drop], ends[~drop], piece[~drop], heads[~drop], after[~drop]
    if rule.asked and starts.size:
        answers = _answering(ids, rule.asked, starts, stops)
        starts, ends, piece, heads, after = starts[answers], ends[answers], piece[answers], heads[answers], after[answers]
    flagged = last_only is not None and bool(np.any(last_only))
    if rule.last_reply_only or flagged:
        # the piece's last reply: its last span, with the spans right before it that only
        # a header separates from it (gpt-oss writes a reply's reasoning as a message of
        # its own: ``analysis ... <|end|>`` then ``<|start|>assistant`` and the answer)
        joined = np.zeros(piece.size, dtype=bool)
        if rule.joined_spans:
            joined[:-1] = (heads[1:] == after[:-1]) & (piece[1:] == piece[:-1])
        group = np.concatenate([[0], np.cumsum(~joined[:-1])]) if piece.size else piece
        last = np.ones(piece.size, dtype=bool)
        last[:-1] = piece[1:] != piece[:-1]
        keep = np.isin(group, group[last]) if piece.size else last
        if not rule.last_reply_only:  # only the flagged pieces keep their last reply alone
            keep |= ~np.asarray(last_only, dtype=bool)[piece]
        starts, ends = starts[keep], ends[keep]
    return starts.astype(np.int64), ends.astype(np.int64)


def _answering(ids: np.ndarray, asked: tuple[tuple[int, ...], ...], starts: np.ndarray,
               stops: np.ndarray) -> np.ndarray:
    """For each reply start, whether an ``asked`` header ends before it in its piece (the
    pieces between ``stops``)."""
    found = np.sort(np.concatenate([_header_ends(ids, h) for h in asked]))
    k = np.searchsorted(found, starts, side="right") - 1  # the last asked header ending at or before each start
    ok = k >= 0
    if stops.size and ok.any():
        before = found[np.maximum(k, 0)]
        ok &= np.searchsorted(stops, before, side="left") == np.searchsorted(stops, starts, side="left")
    return ok


def spans_mask(n: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """uint8 mask of length ``n``: 1 inside the disjoint spans ``[starts[i], ends[i])``."""
    delta = np.bincount(starts, minlength=n + 1)[: n + 1].astype(np.int64)
    delta -= np.bincount(ends, minlength=n + 1)[: n + 1]
    return (np.cumsum(delta[:n]) > 0).astype(np.uint8)


def rule_mask(ids: np.ndarray, rule: MaskRule, last_only: bool = False) -> np.ndarray:
    """The uint8 loss mask (1 = trained) the rule derives from ``ids`` (``last_only``: the
    episode trains its last reply only, see ``rule_spans``). Pure, vectorised."""
    ids = np.asarray(ids)
    starts, ends = rule_spans(ids, rule, last_only=np.array([last_only]) if last_only else None)
    return without_media(ids, spans_mask(ids.shape[0], starts, ends), rule)


def without_media(ids: np.ndarray, mask: np.ndarray, rule: MaskRule) -> np.ndarray:
    """``mask`` (changed in place, returned) with 0 on every token of the rule's ``media_ids``."""
    if rule.media_ids:
        mask[_positions_of(np.asarray(ids), rule.media_ids)] = 0
    return mask


def segment_rule_mask(tokens: np.ndarray, lengths: np.ndarray, rule: MaskRule,
                      cut: np.ndarray | None = None, last_only: np.ndarray | None = None) -> np.ndarray:
    """``concatenate([rule_mask(seg, rule) for seg in segments])`` in one pass: the segments
    (``lengths`` tokens each) are laid out with a stop after each, which no header or
    end-of-turn id matches across. ``cut[i]``: segment ``i`` begins inside its episode, so
    its first reply is left untrained; ``last_only[i]``: segment ``i`` trains its last reply
    only (see ``rule_spans``)::

        segments:   <h> a E <h> b       | x E <h> c E
        layout:     <h> a E <h> b STOP    x E <h> c E STOP
        mask:        0  1 1  0  0       | 0 0  0  1 1      (b is open at the stop)
    """
    tokens = np.asarray(tokens)
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total != tokens.shape[0]:
        raise ValueError(f"segment lengths sum to {total}, but {tokens.shape[0]} tokens were given")
    if total == 0:
        return np.zeros(0, dtype=np.uint8)
    n = lengths.size
    if last_only is not None and np.asarray(last_only).shape != (n,):
        raise ValueError(f"{np.asarray(last_only).shape} last-reply flags for {n} segments")
    if n == 1 and cut is None:
        return rule_mask(tokens, rule, bool(last_only[0]) if last_only is not None else False)
    where = np.arange(total, dtype=np.int64) + np.repeat(np.arange(n, dtype=np.int64), lengths)
    buf = np.full(total + n, -1, dtype=np.int64)  # -1: no token id, so never part of a header or an end
    buf[where] = tokens
    stops = np.cumsum(lengths) + np.arange(n, dtype=np.int64)
    starts, ends = rule_spans(buf, rule, stops, cut, last_only)
    return without_media(tokens, spans_mask(total + n, starts, ends)[where], rule)


def mask_disagreement(ids: np.ndarray, mask: np.ndarray, rule: MaskRule, last_only: bool = False) -> int | None:
    """The first token position where ``mask`` differs from the rule's mask, or None."""
    derived = rule_mask(ids, rule, last_only)
    diff = np.flatnonzero(derived != np.asarray(mask, dtype=np.uint8))
    return int(diff[0]) if diff.size else None
