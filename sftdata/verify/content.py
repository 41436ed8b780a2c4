"""The content checks of ``verify``: token ids against the vocabulary, mask values and
the mask rule, for episodes and for packed rows; and the tokenizer check they start from.

``check_tokenizer`` and ``Vocab`` (what the content checks need to know of the tokenizer:
its mask rule and vocabulary size). Two kinds of ``tokenizer_state.json``: a tiktoken
encoding with sftdata's chat markers (rebuilt from its name or ranks file, its ranks hash
compared), and a model's own ``tokenizer.json`` with its chat template (``kind:
"hf-tokenizers"``: the file's sha256 compared when the file is still at its recorded
path; the mask rule and the vocabulary size are in the state itself, so the content
checks run either way).

Episodes datasets, one chunk of whole episodes at a time (``check_content``): the
dataset's rule (``loss_rule``: the chat markers' or a template's) masks a chunk of
thousands of episodes in one call, each as if alone::

    chunk:   [ep 0 ......EOS][ep 1 .....EOS][ep 2 ........EOS]
    derived:  rule.masks(chunk, lengths)  vs  mask.bin  ->  first difference in ep 1: report ep 1

Packed datasets (``kind: "packed"``, docs/PACKING.md; ``check_packed_content``): a packed
shard holds rows of ``row_len`` tokens, ``episodes.idx`` with one ``(r * row_len,
row_len)`` record per row, and ``segments.idx`` (``SEGMENT_FIELDS``): each row is a run
of segments from offset 0, then padding::

    row (row_len 12):  S  u  E  A  a  E  EOS | U  v  E  EOS | pad
    segment:           0 (offset 0, length 7) | 1 (7, 4)    | -
    position_ids:      0  1  2  3  4  5  6   | 0  1  2  3   | 0

The row geometry and the segments are the reader's structural checks (rows,
segments); here, a chunk of rows at a time:

* vocab, mask_values: ids below the vocabulary size, mask values 0/1;
* mask_rule: the stored mask equals ``packing.row_mask``, the mask pack writes: per
  segment, 0 on its injected prefix and its first token, then the dataset's mask rule
  over its episode tokens alone (a segment that begins inside its episode is cut: a
  template's rule leaves its first reply untrained); 0 on padding;
* padding: the tail of every row after its last segment is ``packing.pad_token_id``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..chat.loss_rule import LossRule, MarkerRule, rule_from_state
from ..chat.tokenizer import load_tokenizer, tokenizer_from_state
from ..errors import SftDataError
from ..packing.plan import row_mask
from ..store.format import MASK_FILE, RECREATE, REPACK, TOKENIZER_FILE, TOKENS_FILE, Problem, decode_segments, more_like_it
from ..store.reader import Scan
from ..store.shard import Shard
from ..store.structure import EpisodeBounds, readable_rows
from ..tokenize import is_hf_state
from ..tokenize.open import hf_tokenizer_from_state
from ..util.ranges import gather_ranges, whole_runs
from .stops import StopFindings
from .template import rederived_rule_problems


@dataclass(frozen=True)
class Vocab:
    rule: LossRule
    size: int

    @property
    def markers(self):
        """The chat markers (a marker rule only): the EOS check of an older flat layout."""
        return self.rule.markers


def vocab_from_state(state: dict | None) -> Vocab | None:
    """The recorded mask rule and vocabulary size, without rebuilding the tokenizer."""
    try:
        rule = rule_from_state(state)
        return None if rule is None else Vocab(rule, int(state["vocab_size"]))
    except (SftDataError, KeyError, TypeError, ValueError):
        return None


@dataclass
class TokenizerCheck:
    """The tokenizer check's verdict: the vocabulary the content checks use (None: they
    cannot run), its problems, and a note for the report."""

    vocab: Vocab | None
    problems: list[Problem] = field(default_factory=list)
    note: str | None = None
    unknown: bool = False  # no tokenizer at all: vocab, eos and mask_rule are skipped
    unchecked: str | None = None  # why the tokenizer check itself was skipped (the file is not here)


def _check_template_state(state: dict) -> TokenizerCheck:
    """A model's own tokenizer: its recorded rule and size drive the content checks; the
    tokenizer.json is compared with its recorded sha256 when it is still there, and the
    recorded rule with the one its template and variables give again (``template``)."""
    try:
        vocab = Vocab(rule_from_state(state, TOKENIZER_FILE), int(state["vocab_size"]))
    except SftDataError as e:
        return TokenizerCheck(None, [Problem("tokenizer", TOKENIZER_FILE, "", str(e), RECREATE)])
    except (KeyError, TypeError, ValueError):
        return TokenizerCheck(None, [Problem("tokenizer", TOKENIZER_FILE, "", f"{TOKENIZER_FILE} records no "
                                             f"integer vocab_size", RECREATE)])
    path = state.get("path")
    if not isinstance(path, str) or not Path(path).is_file():
        why = f"the tokenizer file {path} is not here" if path else f"{TOKENIZER_FILE} records no tokenizer path"
        return TokenizerCheck(vocab, note=f"{why}: its sha256 was not compared (token ids and masks were checked "
                                          f"with the vocabulary size and mask rule the dataset records)",
                              unchecked="tokenizer file not here")
    try:
        tok = hf_tokenizer_from_state(state, TOKENIZER_FILE)
    except SftDataError as e:
        return TokenizerCheck(vocab, [Problem("tokenizer", TOKENIZER_FILE, "", str(e),
                                              "use the tokenizer.json the dataset was prepared with")])
    return TokenizerCheck(vocab, rederived_rule_problems(state, tok))


def check_tokenizer(scan: Scan, tokenizer: str | None) -> TokenizerCheck:
    """The tokenizer the ids were made with rebuilds, with the recorded ranks hash (a
    model's tokenizer.json: the recorded file sha256). ``tokenizer`` names one for an
    older flat layout, which records none."""
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        return TokenizerCheck(Vocab(MarkerRule(tok.ids), tok.vocab_size),
                              note=f"token ids, EOS endings and the mask rule checked with --tokenizer {tokenizer}")
    if not scan.tokenizer_file:
        if scan.dataset.layout == "sharded":
            return TokenizerCheck(None, [Problem("tokenizer", TOKENIZER_FILE, "", f"{TOKENIZER_FILE} is missing: the "
                                                 "tokenizer the ids were made with is unknown", RECREATE)],
                                  unknown=True)
        return TokenizerCheck(None, note=f"no {TOKENIZER_FILE}: token ids, EOS endings and the loss mask cannot be "
                                         "checked (pass --tokenizer NAME to check them with a known tokenizer)",
                              unknown=True)
    state = scan.dataset.tokenizer_state
    if state is None:  # unreadable: the reader reported it
        return TokenizerCheck(None)
    if is_hf_state(state):
        return _check_template_state(state)
    try:
        tok = tokenizer_from_state(state, TOKENIZER_FILE)
        return TokenizerCheck(Vocab(MarkerRule(tok.ids), tok.vocab_size))
    except SftDataError as e:
        problem = Problem("tokenizer", TOKENIZER_FILE, "", str(e),
                          "use the encoding or ranks file the dataset was prepared with")
        return TokenizerCheck(vocab_from_state(state), [problem])  # the recorded ids still allow the other checks


# tokens checked at once (whole episodes): about 5 MB of tokens + mask. Small enough that
# the temporaries are reused by the allocator instead of mapped afresh (page faults cost
# more than the arithmetic on virtual machines), large enough to amortise the calls.
CHUNK_TOKENS = 1 << 20


Part = tuple[int, int | None]  # a range [lo, hi) of a shard's episodes (packed: rows); hi None: to the end


@dataclass
class Tally:
    """What the content checks found in a range of a shard: each check's first problem
    (raw, in the shard's order) and how many episodes (rows) it counted. Tallies of
    consecutive ranges merge (``merge``) into the whole shard's tally exactly: a check's
    first problem is the first range's that has one, its counts add up (every episode or
    row is counted in the one chunk that holds it whole)."""

    first: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)

    def merge(self, later: Tally) -> None:
        """Add the tally of the range right after this one's."""
        for k, v in later.first.items():
            self.first.setdefault(k, v)
        for k, n in later.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n


def check_content(shard: Shard, bounds: EpisodeBounds, vocab: Vocab | None,
                  tick: Callable[[int], None] = lambda n: None, stops: StopFindings | None = None,
                  rule: bool = True) -> list[Problem]:
    """Token ids, mask values and (``rule``) the mask rule of the usable episodes
    (``bounds``), one chunk of whole episodes at a time; ``stops`` also sees each chunk
    (the stops check). A row dataset's entries hold their mask rule as rows (``rows``)."""
    if shard.tokens is None:
        return []
    return content_problems(shard, vocab, content_tally(shard, bounds, vocab, tick, stops, rule=rule)) + \
        ([] if stops is None else stops.shard_problems(shard))


def content_problems(shard: Shard, vocab: Vocab | None, tally: Tally) -> list[Problem]:
    """The problems of a shard's (merged) episodes tally."""
    return _content_problems(shard, vocab, tally.first, {"vocab": 0, "mask_values": 0, "mask_rule": 0} | tally.counts)


def content_tally(shard: Shard, bounds: EpisodeBounds, vocab: Vocab | None,
                  tick: Callable[[int], None] = lambda n: None, stops: StopFindings | None = None,
                  part: Part = (0, None), rule: bool = True) -> Tally:
    """``check_content``'s findings over the usable episodes of ``part`` (local ids), unmade
    into problems: ``stops`` keeps its own."""
    if shard.tokens is None:
        return Tally()
    use = np.flatnonzero(bounds.usable)
    use = use[(use >= part[0]) & (use < (len(bounds.usable) if part[1] is None else part[1]))]
    s, ln = bounds.starts[use], bounds.lengths[use]
    csum = np.cumsum(ln)
    mask = shard.mask
    binary = mask is None or mask.dtype == np.uint8
    first: dict[str, tuple] = {}  # check -> (local episode, position in episode, chunk ids, ...)
    counts = {"vocab": 0, "mask_values": 0, "mask_rule": 0}
    # each episode's "last reply only" flag (format.LAST_REPLY_FILE; a markers rule never has one: all differ)
    flags = None if shard.last_reply is None else shard.last_only()
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
        if m is not None and vocab is not None and rule:
            stored = m if binary and not badv else (m != 0).astype(np.uint8)  # any non-zero value trains
            last_only = None if flags is None or vocab.rule.kind != "template" else flags[use[i:j]]
            derived = vocab.rule.masks(ids, cl, last_only=last_only)  # each episode as if alone
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
    return Tally(first, counts)


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


def check_packed_content(shard: Shard, vocab: Vocab | None, pad_id: int | None, row_len: int, segments_ok: bool,
                         tick: Callable[[int], None] = lambda n: None,
                         stops: StopFindings | None = None) -> list[Problem]:
    """Token ids, mask values, the per-segment mask rule and the padding, a chunk of rows
    at a time. The mask rule and the padding need sound segments (``segments_ok``: the
    reader's segments check passed on this shard)."""
    if shard.tokens is None or readable_rows(shard, row_len) == 0:
        return []
    return packed_problems(shard, vocab, pad_id, row_len,
                           packed_tally(shard, vocab, pad_id, row_len, segments_ok, tick, stops)) + \
        ([] if stops is None else stops.shard_problems(shard))


def packed_problems(shard: Shard, vocab: Vocab | None, pad_id: int | None, row_len: int, tally: Tally
                    ) -> list[Problem]:
    """The problems of a packed shard's (merged) tally."""
    return _packed_problems(shard, vocab, pad_id, row_len, tally.first,
                            {"vocab": 0, "mask_values": 0, "mask_rule": 0, "padding": 0} | tally.counts)


def packed_tally(shard: Shard, vocab: Vocab | None, pad_id: int | None, row_len: int, segments_ok: bool,
                 tick: Callable[[int], None] = lambda n: None, stops: StopFindings | None = None,
                 part: Part = (0, None)) -> Tally:
    """``check_packed_content``'s findings over the rows of ``part``, unmade into problems
    (``stops`` keeps its own). A chunk starts at the part's first row: chunks never cross
    a row, so where they start changes no finding."""
    readable = readable_rows(shard, row_len)
    rows = readable if part[1] is None else min(readable, part[1])
    if shard.tokens is None or rows <= part[0]:
        return Tally()
    seg = decode_segments(shard.segments) if segments_ok else None
    # each segment's "last reply only" flag (format.LAST_REPLY_FILE), for a template's rule
    flags = shard.last_only() if seg is not None and shard.last_reply is not None and vocab is not None \
        and vocab.rule.kind == "template" else None
    mask, L = shard.mask, row_len
    binary = mask is None or mask.dtype == np.uint8
    first: dict[str, tuple] = {}
    counts = {"vocab": 0, "mask_values": 0, "mask_rule": 0, "padding": 0}
    step = max(1, CHUNK_TOKENS // L)
    for r0 in range(part[0], rows, step):
        r1 = min(rows, r0 + step)
        ids = np.asarray(shard.tokens[r0 * L:r1 * L])
        m = None if mask is None else np.asarray(mask[r0 * L:r1 * L])
        if vocab is not None and int(ids.max()) >= vocab.size:
            bad = np.flatnonzero(ids >= vocab.size)
            counts["vocab"] += int(np.unique(bad // L).size)
            first.setdefault("vocab", (r0 + int(bad[0]) // L, int(bad[0]) % L, int(ids[bad[0]])))
        badv = False
        if m is not None:
            badv = bool(m.max() > 1) if binary else bool(np.any((m != 0) & (m != 1)))
            if badv:
                bad = np.flatnonzero(m > 1) if binary else np.flatnonzero((m != 0) & (m != 1))
                counts["mask_values"] += int(np.unique(bad // L).size)
                first.setdefault("mask_values", (r0 + int(bad[0]) // L, int(bad[0]) % L, m[bad[0]]))
        if seg is not None:
            sa, sb = seg.row_range(r0, r1)
            s = seg[sa:sb]
            s = replace(s, row=s.row - r0)  # rows of this chunk
            ends = np.zeros(r1 - r0, np.int64)
            np.maximum.at(ends, s.row, s.offset + s.length)
            pad = np.arange(L)[None, :] >= ends[:, None]
            if pad_id is not None:
                badp = np.flatnonzero(pad.reshape(-1) & (ids != pad_id))
                if badp.size:
                    counts["padding"] += int(np.unique(badp // L).size)
                    p = int(badp[0])
                    first.setdefault("padding", (r0 + p // L, p % L, int(ids[p]), int(ends[p // L])))
            if m is not None and vocab is not None:
                exp = row_mask(ids, s, L, vocab.rule, last_only=None if flags is None else flags[sa:sb])
                stored = m if binary and not badv else (m != 0).astype(np.uint8)
                d = np.flatnonzero(exp != stored)
                if d.size:
                    counts["mask_rule"] += int(np.unique(d // L).size)
                    if "mask_rule" not in first:
                        r = int(d[0]) // L
                        in_row = np.flatnonzero(exp[r * L:(r + 1) * L] != stored[r * L:(r + 1) * L])
                        first["mask_rule"] = (r0 + r, in_row, ids[r * L:(r + 1) * L], exp[r * L:(r + 1) * L],
                                              s[s.row == r], int(ends[r]))
        if stops is not None and m is not None:
            rows_ = np.arange(r0, r1, dtype=np.int64)
            stops.add(shard, ids, m if binary else (m != 0).astype(np.uint8),
                      np.arange(r1 - r0 + 1, dtype=np.int64) * L, rows_, rows_ * L)
        tick(int(ids.nbytes) + (0 if m is None else int(m.nbytes)))
    return Tally(first, counts)


def _packed_problems(shard: Shard, vocab, pad_id, L: int, first: dict, counts: dict) -> list[Problem]:
    out = []
    isz = shard.token_dtype.itemsize
    if "vocab" in first:
        r, p, tok = first["vocab"]
        out.append(Problem("vocab", shard.file(TOKENS_FILE), message=f"token {p} of row {shard.first_gid + r} is id "
                           f"{tok:,}, past the vocabulary ({vocab.size:,} ids){more_like_it(counts['vocab'], 'rows')}",
                           fix="the tokens were damaged: restore the shard, or " + REPACK,
                           **shard.at(r, TOKENS_FILE, (r * L + p) * isz)))
    if "mask_values" in first:
        r, p, val = first["mask_values"]
        out.append(Problem("mask_values", shard.file(MASK_FILE), message=f"token {p} of row {shard.first_gid + r} has "
                           f"mask value {val}, not 0 or 1{more_like_it(counts['mask_values'], 'rows')}",
                           fix="restore the shard, or " + REPACK,
                           **shard.at(r, MASK_FILE, (r * L + p) * shard.mask.dtype.itemsize)))
    if "padding" in first:
        r, p, tok, end = first["padding"]
        out.append(Problem("padding", shard.file(TOKENS_FILE), message=f"token {p} of row {shard.first_gid + r}, "
                           f"after its segments end at {end}, is id {tok:,}, not the padding id {pad_id}"
                           f"{more_like_it(counts['padding'], 'rows')}", fix="restore the shard, or " + REPACK,
                           **shard.at(r, TOKENS_FILE, (r * L + p) * isz)))
    if "mask_rule" in first:
        r, diff, ids, exp, segs, end = first["mask_rule"]
        p = int(diff[0])
        j = int(np.searchsorted(segs.offset, p, side="right")) - 1
        if p >= end or j < 0:
            where = "the padding"
        elif p < segs.offset[j] + segs.prefix[j]:
            where = f"segment {j}'s injected context"
        else:
            a, b = int(segs.offset[j] + segs.prefix[j]), int(segs.offset[j] + segs.length[j])
            where = f"segment {j} (episode {segs.episode[j]}), {vocab.rule.where(ids[a:b], p - a)}"
        trained = "trains" if exp[p] == 0 else "leaves untrained"
        out.append(Problem("mask_rule", shard.file(MASK_FILE), message=f"the mask of row {shard.first_gid + r} "
                           f"differs from the mask rule at {diff.size} token(s): it {trained} token {p}, in {where}"
                           f"{more_like_it(counts['mask_rule'], 'rows')}",
                           fix="this mask was not made by the mask rule per segment (or was edited); " + REPACK,
                           **shard.at(r, MASK_FILE, (r * L + p) * shard.mask.dtype.itemsize)))
    return out
