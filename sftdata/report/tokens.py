"""Tokens as the report draws them: runs of tokens drawn alike (trained or not, one
marker, one segment), each token with its id and its text.

The texts of a run's tokens, joined, are exactly ``tok.decode`` of the run, so the
highlighted text on the page is the decoded trained text. A character whose UTF-8
bytes are split across tokens (an emoji in two tokens) is shown once, by a group of
those tokens::

    ids:     9906   11    11410 2122       (the last two tokens hold one emoji's bytes)
    groups:  "Hello" ","  "😀" (ids 11410, 2122)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .views import Tokenizer, is_marker

MAX_CHAR_TOKENS = 4  # a UTF-8 character has at most 4 bytes, so spans at most 4 tokens


@dataclass
class TokenGroup:
    """One token, or the few tokens that hold one character's bytes together."""

    ids: list[int]
    text: str


@dataclass
class Run:
    """Consecutive tokens drawn alike."""

    start: int  # position of its first token in the episode (row)
    trained: bool
    marker: bool
    injected: bool  # packed rows: context the packer prepended (never trained)
    segment: int | None  # packed rows: the segment (seq_id) it lies in
    groups: list[TokenGroup]


def token_groups(ids, tok: Tokenizer) -> list[TokenGroup]:
    """The tokens of ``ids`` with their texts; ``"".join`` of the texts is ``tok.decode(ids)``."""
    ids = [int(t) for t in ids]
    known = {t: tok.token_text(t) for t in set(ids)}  # a long episode repeats its ids
    texts = [known[t] for t in ids]
    if "\ufffd" not in "".join(texts):  # every token decodes alone: the common case
        return [TokenGroup([t], s) for t, s in zip(ids, texts)]
    out, i, n = [], 0, len(ids)
    while i < n:
        j = i + 1
        if "\ufffd" in texts[i]:  # bytes of a character split across tokens: join until it decodes
            for k in range(i + 2, min(n, i + MAX_CHAR_TOKENS) + 1):
                if "\ufffd" not in tok.decode(ids[i:k]):
                    j = k
                    break
        out.append(TokenGroup(ids[i:j], tok.decode(ids[i:j]) if j > i + 1 else texts[i]))
        i = j
    if "".join(g.text for g in out) != tok.decode(ids):  # bytes that no grouping decodes alone: one group
        return [TokenGroup(ids, tok.decode(ids))]
    return out


def token_runs(ids: np.ndarray, trained: np.ndarray, tok: Tokenizer, *, segment: np.ndarray | None = None,
               injected: np.ndarray | None = None, media: list[tuple[int, int, str]] | None = None) -> list[Run]:
    """Runs that break at every marker and wherever training, the segment or injected
    context starts or stops. Each of ``media`` (start, end, label: a media item's placeholder
    tokens) is one run of one group, drawn as its label."""
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.shape[0]
    if not n:
        return []
    trained = np.asarray(trained, dtype=bool)
    marker = is_marker(ids, tok)
    cut = marker[1:] | marker[:-1] | (trained[1:] != trained[:-1])
    if segment is not None:
        cut |= segment[1:] != segment[:-1]
    if injected is not None:
        cut |= injected[1:] != injected[:-1]
    labels = {}
    for a, b, label in media or ():
        if a >= n:
            continue
        b = min(b, n)
        cut[a:b - 1] = False
        if a > 0:
            cut[a - 1] = True
        if b < n:
            cut[b - 1] = True
        labels[a] = label
    bounds = [0, *(np.flatnonzero(cut) + 1).tolist(), n]
    return [Run(a, bool(trained[a:b].any()) if a in labels else bool(trained[a]), a in labels or bool(marker[a]),
                bool(injected[a]) if injected is not None else False, int(segment[a]) if segment is not None else None,
                [TokenGroup(ids[a:b].tolist(), labels[a])] if a in labels else token_groups(ids[a:b], tok))
            for a, b in zip(bounds[:-1], bounds[1:])]
