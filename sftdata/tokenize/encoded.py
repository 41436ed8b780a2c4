"""A rendered text's tokens and where each lies in the text, and the token ranges of many
texts' character spans at once.

    >>> enc = tok.encode_rendered(text)              # Encoded: ids, offsets on first use
    >>> lo, hi = enc.token_ranges([(a, b)])          # the tokens a:b covers
    >>> lo, hi = token_ranges_many(fast, texts, encs, spans)   # every text's, concatenated
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .fast_bpe import FastBPE


class Encoded:
    """A rendered text's tokens: ``ids`` (uint32), and where each token lies in the text
    (``offsets``, int64, shape (n, 2): token i covers characters ``offsets[i, 0] :
    offsets[i, 1]``; built on first use, ``token_ranges`` needs only a few lookups)."""

    __slots__ = ("ids", "_encoding", "_offsets", "_text_len", "_make_offsets", "ranks")

    def __init__(self, ids: np.ndarray, offsets: np.ndarray | None = None, encoding=None, text_len: int = 0,
                 make_offsets=None, ranks: np.ndarray | None = None):
        self.ids = ids
        self.ranks = ranks  # the fast engine's ranks (None: the library encoded it)
        self._offsets = offsets
        self._encoding = encoding  # the tokenizers library's Encoding, when offsets are not built yet
        self._text_len = text_len
        self._make_offsets = make_offsets  # the fast engine's: offsets from the tokens' byte lengths

    @property
    def offsets(self) -> np.ndarray:
        if self._offsets is None and self._make_offsets is not None:
            self._offsets = self._make_offsets()
        if self._offsets is None:
            pairs = self._encoding.offsets
            # fromiter over the flattened pairs: 3x faster than converting a list of tuples
            self._offsets = np.fromiter(chain.from_iterable(pairs), dtype=np.int64,
                                        count=2 * len(pairs)).reshape(-1, 2)
        return self._offsets

    def token_ranges(self, spans) -> tuple[np.ndarray, np.ndarray]:
        """For each character span ``(start, end)``, the tokens ``lo:hi`` that overlap it
        (from the token holding ``start`` through the one holding ``end - 1``, as
        ``return_assistant_tokens_mask`` maps them)."""
        spans = [(int(a), int(b)) for a, b in spans]
        enc, n = self._encoding, int(self.ids.shape[0])
        if enc is not None and self._offsets is None:
            lo, hi = [], []
            for a, b in spans:
                first = enc.char_to_token(a) if b > a else None
                after = enc.char_to_token(b)
                if first is None or (after is None and b < self._text_len):
                    break  # a character no token covers (a normaliser dropped it): use the offsets
                lo.append(first)
                hi.append(n if after is None else after + (enc.token_to_chars(after)[0] < b))
            else:
                return np.asarray(lo, dtype=np.int64), np.maximum(np.asarray(hi, dtype=np.int64),
                                                                   np.asarray(lo, dtype=np.int64))
        offsets = self.offsets
        bounds = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        lo_ = np.searchsorted(offsets[:, 1], bounds[:, 0], side="right")
        hi_ = np.searchsorted(offsets[:, 0], bounds[:, 1], side="left")
        return lo_, np.maximum(hi_, lo_)


def token_ranges_many(fast: FastBPE | None, texts: Sequence[str], encoded: Sequence[Encoded],
                      spans: Sequence[Sequence[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray]:
    """``encoded[i].token_ranges(spans[i])`` of every text, concatenated; the texts ``fast``
    (the tokenizer's fast engine) encoded in one pass over their joined tokens, in UTF-8
    bytes: as ``offsets`` reports characters, a token ends at or before character ``a``
    exactly when its bytes end at or before ``a``'s first byte, and starts before character
    ``b`` exactly when its first byte is before ``b``'s; a span of one text never reaches
    another's tokens (each token holds at least one byte of its own text)."""
    counts = [len(s) for s in spans]
    first = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    lo = np.zeros(int(first[-1]), dtype=np.int64)
    hi = np.zeros_like(lo)
    mine = [i for i, e in enumerate(encoded) if e.ranks is not None and counts[i]]  # the fast engine's
    for i, e in enumerate(encoded):
        if e.ranks is None and counts[i]:
            lo[first[i]:first[i + 1]], hi[first[i]:first[i + 1]] = e.token_ranges(spans[i])
    if mine:
        ends = fast.byte_ends(np.concatenate([encoded[i].ranks for i in mine]))
        n_tok = np.fromiter((encoded[i].ids.shape[0] for i in mine), dtype=np.int64, count=len(mine))
        tok_base = np.cumsum(n_tok) - n_tok
        byte_base = np.concatenate([[0], ends])[tok_base]
        bounds = []
        for i in mine:
            text = texts[i]
            if text.isascii():
                bounds.extend(spans[i])
            else:  # characters to UTF-8 bytes, at the bounds only
                bounds.extend((len(text[:a].encode("utf-8", "surrogatepass")),
                               len(text[:b].encode("utf-8", "surrogatepass"))) for a, b in spans[i])
        bounds = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
        n_span = np.asarray([counts[i] for i in mine], dtype=np.int64)
        bounds += np.repeat(byte_base, n_span)[:, None]
        base = np.repeat(tok_base, n_span)
        lo_ = np.searchsorted(ends, bounds[:, 0], side="right") - base
        starts = np.concatenate([[0], ends[:-1]])  # the joined texts' bytes are contiguous
        hi_ = np.maximum(np.searchsorted(starts, bounds[:, 1], side="left") - base, lo_)
        is_fast = np.zeros(len(encoded), dtype=bool)
        is_fast[mine] = True
        where = np.flatnonzero(np.repeat(is_fast, counts))  # the fast texts' spans, in order
        lo[where], hi[where] = lo_, hi_
    return lo, hi
