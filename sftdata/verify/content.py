"""The content checks of ``verify`` for episodes datasets: token ids, mask values and
the mask rule, one chunk of whole episodes at a time.

The dataset's rule (``loss_rule``: the chat markers' or a template's) masks a chunk of
thousands of episodes in one call, each as if alone::

    chunk:   [ep 0 ......EOS][ep 1 .....EOS][ep 2 ........EOS]
    derived:  rule.masks(chunk, lengths)  vs  mask.bin  ->  first difference in ep 1: report ep 1
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ranges import gather_ranges, whole_runs
from ..store import MASK_FILE, RECREATE, TOKENS_FILE, Problem, Shard
from ..store.format import more_like_it
from ..store.structure import EpisodeBounds
from .description import Vocab
from .stops import StopFindings

# tokens checked at once (whole episodes): about 5 MB of tokens + mask. Small enough that
# the temporaries are reused by the allocator instead of mapped afresh (page faults cost
# more than the arithmetic on virtual machines), large enough to amortise the calls.
CHUNK_TOKENS = 1 << 20


def check_content(shard: Shard, bounds: EpisodeBounds, vocab: Vocab | None,
                  tick: Callable[[int], None] = lambda n: None, stops: StopFindings | None = None) -> list[Problem]:
    """Token ids, mask values and the mask rule of the usable episodes (``bounds``), one
    chunk of whole episodes at a time; ``stops`` also sees each chunk (the stops check)."""
    if shard.tokens is None:
        return []
    use = np.flatnonzero(bounds.usable)
    s, ln = bounds.starts[use], bounds.lengths[use]
    csum = np.cumsum(ln)
    mask = shard.mask
    binary = mask is None or mask.dtype == np.uint8
    first: dict[str, tuple] = {}  # check -> (local episode, position in episode, chunk ids, ...)
    counts = {"vocab": 0, "mask_values": 0, "mask_rule": 0}
    for i, j in whole_runs(csum, CHUNK_TOKENS):
        cs, cl = s[i:j], ln[i:j]
        off = np.concatenate([[0], np.cumsum(cl)])
        if np.array_equal(cs[1:], cs[:-1] + cl[:-1]):  # contiguous: a plain slice, no copy
            ids = np.asarray(shard.tokens[cs[0]:cs[0] + off[-1]])
            m = None if mask is None else np.asarray(mask[cs[0]:cs[0] + off[-1]])
        else:
            ids = gather_ranges(shard.tokens, cs, cl)
            m = None if mask is None else gather_ranges(mask, cs, cl)

        def locate(p):
            k = int(np.searchsorted(off, p, side="right")) - 1
            return k, int(p - off[k])

        if vocab is not None and ids.size and int(ids.max()) >= vocab.size:
            bad = np.flatnonzero(ids >= vocab.size)
            counts["vocab"] += int(np.unique(np.searchsorted(off, bad, side="right")).size)
            if "vocab" not in first:
                k, p = locate(bad[0])
                first["vocab"] = (use[i + k], p, int(ids[bad[0]]), cs[k])
        badv = False
        if m is not None and m.size:
            badv = bool(m.max() > 1) if binary else bool(np.any((m != 0) & (m != 1)))
            if badv:
                bad = np.flatnonzero(m > 1) if binary else np.flatnonzero((m != 0) & (m != 1))
                counts["mask_values"] += int(np.unique(np.searchsorted(off, bad, side="right")).size)
                if "mask_values" not in first:
                    k, p = locate(bad[0])
                    first["mask_values"] = (use[i + k], p, m[bad[0]], cs[k])
        if m is not None and vocab is not None:
            stored = m if binary and not badv else (m != 0).astype(np.uint8)  # any non-zero value trains
            derived = vocab.rule.masks(ids, cl)  # each episode as if alone
            d = np.flatnonzero(derived != stored)
            if d.size:
                eps = np.unique(np.searchsorted(off, d, side="right") - 1)
                counts["mask_rule"] += int(eps.size)
                if "mask_rule" not in first:
                    k = int(eps[0])
                    a, b = int(off[k]), int(off[k + 1])
                    first["mask_rule"] = (use[i + k], ids[a:b], stored[a:b], derived[a:b], cs[k])
        if stops is not None and m is not None:
            stops.add(shard, ids, m if binary else (m != 0).astype(np.uint8), off, use[i:j], cs)
        tick(int(ids.nbytes) + (0 if m is None else int(m.nbytes)))
    return _content_problems(shard, vocab, first, counts) + ([] if stops is None else stops.shard_problems(shard))


def _content_problems(shard: Shard, vocab: Vocab | None, first: dict, counts: dict) -> list[Problem]:
    out = []
    isz = shard.token_dtype.itemsize
    if "vocab" in first:
        k, p, tok, start = first["vocab"]
        out.append(Problem("vocab", shard.file(TOKENS_FILE), message=f"token {p} of episode {shard.first_gid + k} is "
                           f"id {tok:,}, past the vocabulary ({vocab.size:,} ids): no tokenizer can decode it"
                           f"{more_like_it(counts['vocab'])}", fix="the tokens were damaged or written with another "
                           "tokenizer: restore the shard, or " + RECREATE,
                           **shard.at(k, TOKENS_FILE, (int(start) + p) * isz)))
    if "mask_values" in first:
        k, p, val, start = first["mask_values"]
        msz = shard.mask.dtype.itemsize
        out.append(Problem("mask_values", shard.file(MASK_FILE), message=f"token {p} of episode "
                           f"{shard.first_gid + k} has mask value {val}, not 0 or 1"
                           f"{more_like_it(counts['mask_values'])}",
                           fix="restore the shard, or " + RECREATE, **shard.at(k, MASK_FILE, (int(start) + p) * msz)))
    if "mask_rule" in first:
        k, ids, stored, rule, start = first["mask_rule"]
        extra = np.flatnonzero((stored == 1) & (rule == 0))
        missing = np.flatnonzero((stored == 0) & (rule == 1))
        said = []
        if extra.size:
            said.append(f"trains {extra.size} token(s) the mask rule leaves untrained (first: token {extra[0]}, in "
                        f"{vocab.rule.where(ids, int(extra[0]))})")
        if missing.size:
            said.append(f"leaves {missing.size} token(s) untrained that the rule trains (first: token "
                        f"{missing[0]}, in {vocab.rule.where(ids, int(missing[0]))})")
        p = int(extra[0] if extra.size else missing[0])
        n = counts["mask_rule"]
        msz = shard.mask.dtype.itemsize
        out.append(Problem("mask_rule", shard.file(MASK_FILE), message=f"the mask of episode {shard.first_gid + k} "
                           + " and ".join(said) + (f"; {n:,} episodes of this shard differ" if n > 1 else ""),
                           fix="this mask was not made by sftdata's mask rule (or was edited); training on it "
                           "would learn from the wrong tokens. " + RECREATE[0].upper() + RECREATE[1:],
                           **shard.at(k, MASK_FILE, (int(start) + p) * msz)))
    return out
