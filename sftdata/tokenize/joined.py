"""Many texts encoded with ONE call of tiktoken's BPE core, with the ids of one call per text.

The core reads an allowed special string as its id and encodes the text between two of
them on its own: the split pattern runs on that stretch alone (its ``$`` and look-aheads
see the stretch's end) and BPE merges within a piece. So, for texts holding no special
string::

    encode(a + "<|END|>" + b, allowed={"<|END|>"}) == encode_ordinary(a) + [END] + encode_ordinary(b)

Two uses, each one call of the core per chunk of records instead of one per text:

* ``JoinedEncoder.encode``: a chunk's rendered text (message texts between the chat
  markers' strings) gives the rendered ids directly, markers and all;
* ``JoinedEncoder.encode_many``: texts joined by one marker string, cut where its id lies.

A user who types a marker string must still get those characters as text. So the
caller says how many marker strings it ``placed``, and the joined ids are used only when
exactly ``placed`` marker ids come out: a typed marker string would add one (no marker
string borders or holds another, see below, so the core reads every placed one as its
id). Otherwise (or for text with a lone surrogate, which the core refuses) the answer is
None and the caller encodes text by text. Once a text held a marker string, the text is
searched for marker strings before each later call (every marker string starts with the
same prefix, ``<|``, found once in it: one count of the prefix settles the common case,
an exact count per marker string the rest), so such data does not pay for a call of the
core it cannot use; data without them is not searched at all. The construction also needs that no
match can start inside a text and end inside a marker: no special string of the encoding
may end with the start of a marker string or start with a marker's end, nor hold one
(checked once per tokenizer).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from .space_runs import overflowed


def _borders(a: str, b: str) -> bool:
    """True when a proper suffix of ``a`` is a prefix of ``b`` (or ``b`` lies inside ``a``)."""
    return (a != b and b in a) or any(b.startswith(a[k:]) for k in range(1, len(a)))


class JoinedEncoder:
    """The markers' strings of one tiktoken encoding, and encoding by one call of its core."""

    def __init__(self, core, special_tokens: dict[str, int], marker_ids: Iterable[int], max_rank: int):
        self._encode = core.encode_to_tiktoken_buffer
        ids = set(marker_ids)
        self.text = {i: s for s, i in special_tokens.items() if i in ids}  # marker id -> the string the core reads
        self.allowed = set(self.text.values())
        self.floor = min(self.text)  # every id the core returns at or above it is a marker (the ranks lie below)
        self.prefix = os.path.commonprefix(sorted(self.allowed))
        self.separator = self.text[self.floor]
        self.typed = False  # whether a text held a marker string (then texts are searched first)
        if set(self.text) != ids or max_rank >= self.floor or not self.prefix:
            raise ValueError("the markers are not special tokens of the encoding above its ranks")
        if any(m.count(self.prefix) != 1 for m in self.allowed):
            raise ValueError("a marker string holds its common prefix twice")
        if any(_borders(s, m) or _borders(m, s) for s in special_tokens for m in self.allowed):
            raise ValueError("a special string of the encoding overlaps a marker string")

    @classmethod
    def build(cls, enc, marker_ids: Iterable[int], max_rank: int) -> JoinedEncoder | None:
        """The joined encoder of tiktoken encoding ``enc``, or None where it cannot be used."""
        core = enc._core_bpe
        if not hasattr(core, "encode_to_tiktoken_buffer"):
            return None
        try:
            return cls(core, enc._special_tokens, marker_ids, max_rank)
        except ValueError:
            return None

    def encode(self, text: str, placed: int) -> np.ndarray | None:
        """The ids of ``text`` in which the caller put ``placed`` marker strings, each read as
        its id and every stretch between them as ordinary text; None when another marker
        string occurs in it (or a lone surrogate): then encode text by text."""
        if self.typed and text.count(self.prefix) != placed and sum(text.count(m) for m in self.allowed) != placed:
            return None
        try:
            buf = self._encode(text, self.allowed)
        except UnicodeEncodeError:  # a lone surrogate: tiktoken's own fix-up runs text by text
            return None
        except ValueError as e:  # a run of whitespace too long for the split regex: text by text
            if overflowed(e):     # (``ChatTokenizer.encode_long`` cuts it out)
                return None
            raise
        ids = np.frombuffer(buf, dtype=np.uint32).copy()  # writable, owned
        if int(np.count_nonzero(ids >= self.floor)) != placed:
            self.typed = True  # marker strings in the data: search for them before the next call
            return None
        return ids

    def encode_many(self, texts: Sequence[str]) -> list[np.ndarray] | None:
        """Each text's ids (views into one array), from one call of the core; None as
        ``encode``."""
        if not texts:
            return []
        ids = self.encode(self.separator.join(texts), len(texts) - 1)
        if ids is None:
            return None
        cuts = np.flatnonzero(ids >= self.floor).tolist()
        starts = [0, *(c + 1 for c in cuts)]
        ends = [*cuts, ids.shape[0]]
        return [ids[a:b] for a, b in zip(starts, ends)]
