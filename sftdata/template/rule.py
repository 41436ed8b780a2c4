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
  (each episode is the render up to one reply), only the episode's last reply is trained.
  The rule then applies to one episode's ids at a time.

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

    def state(self) -> dict:
        return {"kind": RULE_KIND, "headers": [list(h) for h in self.headers], "end_ids": list(self.end_ids),
                "end_inclusive": self.end_inclusive, "last_reply_only": self.last_reply_only}

    @classmethod
    def from_state(cls, state: dict, where: str = "tokenizer_state.json") -> MaskRule:
        """Rebuild a rule from ``state()``; a malformed one is a ``DatasetError`` naming ``where``."""
        def ints(v) -> bool:
            return isinstance(v, list) and bool(v) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                           for i in v)

        if not isinstance(state, dict) or state.get("kind") != RULE_KIND:
            raise DatasetError(f"{where}: mask_rule is not a {RULE_KIND!r} rule; re-prepare the dataset")
        headers, end_ids = state.get("headers"), state.get("end_ids")
        if not (isinstance(headers, list) and headers and all(ints(h) for h in headers) and ints(end_ids)
                and isinstance(state.get("end_inclusive"), bool)
                and isinstance(state.get("last_reply_only", False), bool)):
            raise DatasetError(f"{where}: mask_rule needs non-empty 'headers' (lists of token ids), 'end_ids' and "
                               f"booleans 'end_inclusive' and 'last_reply_only'; re-prepare the dataset")
        return cls(tuple(tuple(h) for h in headers), tuple(end_ids), state["end_inclusive"],
                   state.get("last_reply_only", False))


def _header_ends(ids: np.ndarray, header: tuple[int, ...]) -> np.ndarray:
    """Positions just after each occurrence of ``header`` in ``ids``."""
    n, m = ids.shape[0], len(header)
    if n < m:
        return np.empty(0, dtype=np.int64)
    ok = ids[: n - m + 1] == header[0]
    for j in range(1, m):  # a loop over the header's few tokens, not over the array
        ok &= ids[j: n - m + 1 + j] == header[j]
    return np.flatnonzero(ok) + m


def rule_spans(ids: np.ndarray, rule: MaskRule) -> tuple[np.ndarray, np.ndarray]:
    """The trained token spans ``[starts[i], ends[i])`` the rule finds, disjoint and in order.
    Where one header is a prefix of another at the same place (``<|im_start|>assistant\n``
    and the same followed by an empty think block), the longer one is the header."""
    ids = np.asarray(ids)
    found = [(_header_ends(ids, h), len(h)) for h in rule.headers]
    ends_ = np.concatenate([e for e, _ in found] or [np.empty(0, np.int64)]).astype(np.int64)
    begins = np.concatenate([e - m for e, m in found] or [np.empty(0, np.int64)]).astype(np.int64)
    order = np.lexsort((-ends_, begins))  # by begin, the longest first
    begins, ends_ = begins[order], ends_[order]
    keep = np.ones(begins.size, dtype=bool)
    keep[1:] = begins[1:] != begins[:-1]
    starts = np.unique(ends_[keep])
    end_pos = np.flatnonzero(np.isin(ids, np.asarray(rule.end_ids, dtype=np.int64)))
    k = np.searchsorted(end_pos, starts, side="left")
    closed = k < end_pos.size
    starts, k = starts[closed], k[closed]
    # a header inside a span already opened belongs to that span: keep the first start per end
    first = np.ones(k.size, dtype=bool)
    first[1:] = k[1:] != k[:-1]
    starts, k = starts[first], k[first]
    ends = end_pos[k] + (1 if rule.end_inclusive else 0)
    if rule.last_reply_only:
        starts, ends = starts[-1:], ends[-1:]
    return starts.astype(np.int64), ends.astype(np.int64)


def rule_mask(ids: np.ndarray, rule: MaskRule) -> np.ndarray:
    """The uint8 loss mask (1 = trained) the rule derives from ``ids``. Pure, vectorised."""
    ids = np.asarray(ids)
    n = ids.shape[0]
    starts, ends = rule_spans(ids, rule)
    delta = np.bincount(starts, minlength=n + 1)[: n + 1].astype(np.int64)
    delta -= np.bincount(ends, minlength=n + 1)[: n + 1]
    return (np.cumsum(delta[:n]) > 0).astype(np.uint8)


def mask_disagreement(ids: np.ndarray, mask: np.ndarray, rule: MaskRule) -> int | None:
    """The first token position where ``mask`` differs from the rule's mask, or None."""
    derived = rule_mask(ids, rule)
    diff = np.flatnonzero(derived != np.asarray(mask, dtype=np.uint8))
    return int(diff[0]) if diff.size else None
