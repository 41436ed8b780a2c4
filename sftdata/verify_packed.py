"""The checks of ``verify`` for packed datasets (``kind: "packed"``, docs/PACKING.md).

A packed shard holds rows of ``row_len`` tokens, ``episodes.idx`` with one
``(r * row_len, row_len)`` record per row, and ``segments.idx`` (``SEGMENT_FIELDS``):
each row is a run of segments from offset 0, then padding::

    row (row_len 12):  S  u  E  A  a  E  EOS | U  v  E  EOS | pad
    segment:           0 (offset 0, length 7) | 1 (7, 4)    | -
    position_ids:      0  1  2  3  4  5  6   | 0  1  2  3   | 0

* rows: the row geometry (whole rows, one index record per row, in place);
* segments: sorted by (row, offset), inside their row, tiling it from offset 0 with no
  hole or overlap (so ``position_ids`` and ``seq_ids`` rebuild), at least one episode
  token each, no row without a segment;
* mask_rule: per segment, 0 on its injected prefix and its first token, then the mask
  rule over its episode tokens alone (``packing.segment_masks``, the packer's own
  function); 0 on padding;
* padding: the tail of every row after its last segment is ``packing.pad_token_id``;
* references: no episode token in two segments, one record number per episode, and,
  when the source dataset is still at its recorded path unchanged, every segment's
  tokens equal its source episode's tokens, its record number the source's, and its
  injected context (stream) what ``stream_prefix`` injects for that episode there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .errors import SftDataError
from .packing import segment_masks, stream_prefix
from .ranges import gather_ranges
from .store import (
    EPISODES_FILE,
    MASK_FILE,
    METADATA_FILE,
    SEGMENT_FIELDS,
    SEGMENTS_FILE,
    TOKENS_FILE,
    open_dataset,
    sha256_file,
)
from .tokenizer import MarkerIds
from .verify_checks import CHUNK_TOKENS, REPACK, Part, Problem, Vocab, more_like_it, range_index
from .verify_content import span_at

SEG_BYTES = 8 * len(SEGMENT_FIELDS)


def _seg(part: Part) -> np.ndarray | None:
    """The shard's segments as int64 (k, 7) with the source field's 'unknown' as -1."""
    if part.segments is None:
        return None
    a = np.asarray(part.segments)
    out = np.minimum(a, np.uint64(2**62)).astype(np.int64)
    out[:, 6] = np.where(a[:, 6] == np.iinfo(np.uint64).max, -1, out[:, 6])
    return out


def _at_row(part: Part, r: int, seg: int | None = None) -> dict:
    g = part.first_gid + int(r)
    if seg is None:
        return {"where": f"row {g} of {part.split}", "split": part.split, "episode": g}
    return {"where": f"row {g} of {part.split}, segment {seg}, byte {SEG_BYTES * seg:,} of {SEGMENTS_FILE}",
            "split": part.split, "episode": g, "byte": SEG_BYTES * seg}


def check_rows(part: Part, row_len: int) -> list[Problem]:
    """Whole rows of ``row_len`` tokens (and mask values), one record (r * row_len,
    row_len) per row in ``episodes.idx``."""
    out = []
    n, ntok = part.num_episodes, part.num_tokens
    rows = ntok // row_len
    if part.mask is not None:
        rows = min(rows, int(part.mask.shape[0]) // row_len)
    if ntok % row_len:
        out.append(Problem("rows", part.file(TOKENS_FILE), "", f"{ntok:,} tokens are not whole rows of {row_len} "
                           "(packing.row_len): the file is truncated or from another packing", REPACK, part.split,
                           byte=ntok // row_len * row_len * part.token_dtype.itemsize))
    if n != ntok // row_len:
        out.append(Problem("rows", part.file(EPISODES_FILE), "", f"{n:,} row records for the {ntok // row_len:,} "
                           f"rows of {TOKENS_FILE}: there must be one per row", REPACK, part.split))
    ep = part.episodes
    want = np.arange(n, dtype=np.uint64) * np.uint64(row_len)
    bad = np.flatnonzero((ep[:, 0] != want) | (ep[:, 1] != row_len))
    if bad.size:
        i = int(bad[0])
        out.append(Problem("rows", part.file(EPISODES_FILE), message=f"row {part.first_gid + i} is recorded as tokens "
                           f"[{int(ep[i, 0]):,}, +{int(ep[i, 1]):,}), not [{i * row_len:,}, +{row_len}): rows must be "
                           f"consecutive blocks of row_len{more_like_it(bad.size, 'rows')}", fix=REPACK, **part.at(i)))
    idx = np.arange(n, dtype=np.int64)
    part.starts, part.lengths = idx * row_len, np.full(n, row_len, np.int64)
    part.usable = idx < rows
    return out


def check_segments(part: Part, row_len: int) -> list[Problem]:
    """Segments sorted, inside their row, tiling it from offset 0; every row has one."""
    seg = _seg(part)
    part.segments_ok = False
    if seg is None:
        return []
    out = []
    f = part.file(SEGMENTS_FILE)
    nrows = part.num_episodes
    row, off, length, pre = seg[:, 0], seg[:, 1], seg[:, 2], seg[:, 3]

    def add(i: int, message: str, n: int, code: str) -> None:
        out.append(Problem("segments", f, message=message + more_like_it(n, "segments"), fix=REPACK, code=code,
                           **_at_row(part, min(int(row[i]), max(nrows - 1, 0)), i)))

    g = part.first_gid
    bad = np.flatnonzero(row >= nrows)
    if bad.size:
        i = int(bad[0])
        add(i, f"segment {i} names row {g + int(row[i]):,}, but the shard has rows {g}..{g + nrows - 1}",
            bad.size, "row_out_of_range")
    key = np.minimum(row, nrows) * (row_len + 1) + np.minimum(off, row_len)
    bad = np.flatnonzero(key[1:] <= key[:-1]) + 1
    if bad.size:
        i = int(bad[0])
        add(i, f"segment {i} (row {g + int(row[i])}, offset {off[i]}) comes after segment {i - 1} (row "
               f"{g + int(row[i - 1])}, offset {off[i - 1]}): {SEGMENTS_FILE} is not sorted by (row, offset)",
            bad.size, "unsorted")
    bad = np.flatnonzero(off + length > row_len)
    if bad.size:
        i = int(bad[0])
        add(i, f"segment {i} spans [{off[i]}, {off[i] + length[i]}) of its row, past the row's {row_len} tokens",
            bad.size, "past_row_end")
    bad = np.flatnonzero(length - pre < 1)
    if bad.size:
        i = int(bad[0])
        add(i, f"segment {i} has length {length[i]} with {pre[i]} injected tokens: no episode token", bad.size,
            "empty")
    if not out:
        first = np.ones(row.size, bool)
        first[1:] = row[1:] != row[:-1]
        prev_end = np.zeros(row.size, np.int64)
        prev_end[1:] = off[:-1] + length[:-1]
        bad = np.flatnonzero(first & (off != 0))
        if bad.size:
            i = int(bad[0])
            add(i, f"the first segment of row {g + int(row[i])} starts at offset {off[i]}, not 0: its positions "
                   "would not match the tokens", bad.size, "not_at_zero")
        hole = np.flatnonzero(~first & (off > prev_end))
        over = np.flatnonzero(~first & (off < prev_end))
        if hole.size:
            i = int(hole[0])
            add(i, f"tokens [{prev_end[i]}, {off[i]}) of row {g + int(row[i])} lie between segments {i - 1} and "
                   f"{i}: they belong to no segment", hole.size, "hole")
        if over.size:
            i = int(over[0])
            add(i, f"segment {i} starts at offset {off[i]} of row {g + int(row[i])}, inside segment {i - 1} "
                   f"(ends at {prev_end[i]}): the segments overlap", over.size, "overlap")
        empty = np.setdiff1d(np.arange(nrows), row)
        if empty.size:
            out.append(Problem("segments", f, message=f"row {g + int(empty[0])} has no segment: a row of padding only"
                               + more_like_it(empty.size, "rows"), fix=REPACK, code="row_without_segment",
                               **_at_row(part, int(empty[0]))))
    part.segments_ok = not out
    return out


def check_packed_content(part: Part, vocab: Vocab | None, pad_id: int | None, row_len: int,
                         tick: Callable[[int], None] = lambda n: None) -> list[Problem]:
    """Token ids, mask values, the per-segment mask rule and the padding, a chunk of rows
    at a time."""
    if part.tokens is None or part.usable is None or not part.usable.any():
        return []
    rows = int(np.flatnonzero(part.usable)[-1]) + 1
    seg = _seg(part) if getattr(part, "segments_ok", False) else None
    mask, L = part.mask, row_len
    binary = mask is None or mask.dtype == np.uint8
    first: dict[str, tuple] = {}
    counts = {"vocab": 0, "mask_values": 0, "mask_rule": 0, "padding": 0}
    step = max(1, CHUNK_TOKENS // L)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        ids = np.asarray(part.tokens[r0 * L:r1 * L])
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
            a, b = np.searchsorted(seg[:, 0], [r0, r1], side="left")
            s = seg[a:b]
            base = (s[:, 0] - r0) * L + s[:, 1]  # where each segment starts in this chunk
            take = s[:, 2] - s[:, 3]
            ends = np.zeros(r1 - r0, np.int64)
            np.maximum.at(ends, s[:, 0] - r0, s[:, 1] + s[:, 2])
            pad = np.arange(L)[None, :] >= ends[:, None]
            if pad_id is not None:
                badp = np.flatnonzero(pad.reshape(-1) & (ids != pad_id))
                if badp.size:
                    counts["padding"] += int(np.unique(badp // L).size)
                    p = int(badp[0])
                    first.setdefault("padding", (r0 + p // L, p % L, int(ids[p]), int(ends[p // L])))
            if m is not None and vocab is not None:
                dest = range_index(base + s[:, 3], take)
                exp = np.zeros(ids.size, np.uint8)
                exp[dest] = segment_masks(ids[dest], take, vocab.markers)
                exp[base] = 0
                stored = m if binary and not badv else (m != 0).astype(np.uint8)
                d = np.flatnonzero(exp != stored)
                if d.size:
                    counts["mask_rule"] += int(np.unique(d // L).size)
                    if "mask_rule" not in first:
                        r = int(d[0]) // L
                        in_row = np.flatnonzero(exp[r * L:(r + 1) * L] != stored[r * L:(r + 1) * L])
                        first["mask_rule"] = (r0 + r, in_row, ids[r * L:(r + 1) * L], exp[r * L:(r + 1) * L],
                                              s[s[:, 0] - r0 == r], int(ends[r]))
        tick(int(ids.nbytes) + (0 if m is None else int(m.nbytes)))
    return _packed_problems(part, vocab, pad_id, first, counts)


def _packed_problems(part: Part, vocab, pad_id, first: dict, counts: dict) -> list[Problem]:
    out = []
    L = part.lengths[0] if part.lengths is not None and part.lengths.size else 0
    isz = part.token_dtype.itemsize
    if "vocab" in first:
        r, p, tok = first["vocab"]
        out.append(Problem("vocab", part.file(TOKENS_FILE), message=f"token {p} of row {part.first_gid + r} is id "
                           f"{tok:,}, past the vocabulary ({vocab.size:,} ids){more_like_it(counts['vocab'], 'rows')}",
                           fix="the tokens were damaged: restore the shard, or " + REPACK,
                           **part.at(r, TOKENS_FILE, (r * L + p) * isz)))
    if "mask_values" in first:
        r, p, val = first["mask_values"]
        out.append(Problem("mask_values", part.file(MASK_FILE), message=f"token {p} of row {part.first_gid + r} has "
                           f"mask value {val}, not 0 or 1{more_like_it(counts['mask_values'], 'rows')}",
                           fix="restore the shard, or " + REPACK,
                           **part.at(r, MASK_FILE, (r * L + p) * part.mask.dtype.itemsize)))
    if "padding" in first:
        r, p, tok, end = first["padding"]
        out.append(Problem("padding", part.file(TOKENS_FILE), message=f"token {p} of row {part.first_gid + r}, after "
                           f"its segments end at {end}, is id {tok:,}, not the padding id {pad_id}"
                           f"{more_like_it(counts['padding'], 'rows')}", fix="restore the shard, or " + REPACK,
                           **part.at(r, TOKENS_FILE, (r * L + p) * isz)))
    if "mask_rule" in first:
        r, diff, ids, exp, segs, end = first["mask_rule"]
        p = int(diff[0])
        j = int(np.searchsorted(segs[:, 1], p, side="right")) - 1
        if p >= end or j < 0:
            where = "the padding"
        elif p < segs[j, 1] + segs[j, 3]:
            where = f"segment {j}'s injected context"
        else:
            a, b = int(segs[j, 1] + segs[j, 3]), int(segs[j, 1] + segs[j, 2])
            where = f"segment {j} (episode {segs[j, 4]}), {span_at(ids[a:b], p - a, vocab.markers)}"
        trained = "trains" if exp[p] == 0 else "leaves untrained"
        out.append(Problem("mask_rule", part.file(MASK_FILE), message=f"the mask of row {part.first_gid + r} differs "
                           f"from the mask rule at {diff.size} token(s): it {trained} token {p}, in {where}"
                           f"{more_like_it(counts['mask_rule'], 'rows')}",
                           fix="this mask was not made by the mask rule per segment (or was edited); " + REPACK,
                           **part.at(r, MASK_FILE, (r * L + p) * part.mask.dtype.itemsize)))
    return out


def check_references(parts: list[Part], meta: dict, root: Path, notes: list[str]) -> list[Problem]:
    """Segments' episode references: consistent among themselves and, when the source
    dataset is at its recorded path and unchanged, equal to the source episodes."""
    out: list[Problem] = []
    src_info = meta.get("source") or {}
    src_ds = markers = None
    src_path = Path(str(src_info.get("path", "")))
    if src_info.get("path") and (src_path / METADATA_FILE).is_file():
        if sha256_file(src_path / METADATA_FILE) == src_info.get("metadata_sha256"):
            src_ds = open_dataset(src_path)
            try:
                markers = MarkerIds.from_special_tokens((src_ds.tokenizer_state or {})["special_tokens"])
            except (SftDataError, KeyError, TypeError):
                notes.append(f"the source dataset {src_path} records no chat markers: injected context not checked")
        else:
            notes.append(f"the source dataset {src_path} changed since packing (its metadata sha256 differs): "
                         "segments not compared with its episodes")
    elif src_info.get("path"):
        notes.append(f"the source dataset {src_path} is not there: segments checked for consistency only, "
                     "not against the source episodes")
    for split in dict.fromkeys(p.split for p in parts):
        mine = [p for p in parts if p.split == split and getattr(p, "segments_ok", False)]
        if not mine:
            continue
        seg = np.concatenate([_seg(p) for p in mine])
        owner = np.concatenate([np.full(p.segments.shape[0], k) for k, p in enumerate(mine)])
        local = np.concatenate([np.arange(p.segments.shape[0]) for p in mine])
        ep, st, take, src = seg[:, 4], seg[:, 5], seg[:, 2] - seg[:, 3], seg[:, 6]

        def add(i, message, code, n=1):
            part = mine[int(owner[i])]
            out.append(Problem("references", part.file(SEGMENTS_FILE), message=message + more_like_it(n, "segments"),
                               fix="the rows do not match their source: " + REPACK, code=code,
                               **_at_row(part, int(seg[i, 0]), int(local[i]))))

        order = np.lexsort((st, ep))
        e_o, s_o, t_o, r_o = ep[order], st[order], take[order], src[order]
        same = e_o[1:] == e_o[:-1]
        bad = np.flatnonzero(same & (s_o[1:] < s_o[:-1] + t_o[:-1]))
        if bad.size:
            i = int(order[bad[0] + 1])
            add(i, f"tokens {s_o[bad[0] + 1]}.. of episode {ep[i]} are also in another segment: they would be "
                   "trained twice", "episode_twice", bad.size)
        bad = np.flatnonzero(same & (r_o[1:] != r_o[:-1]))
        if bad.size:
            i = int(order[bad[0] + 1])
            add(i, f"segments of episode {ep[i]} name records {r_o[bad[0]]} and {r_o[bad[0] + 1]}", "record_mismatch",
                bad.size)
        if src_ds is None or split not in src_ds.splits:
            continue
        sp = src_ds.split(split)
        bad = np.flatnonzero((ep >= sp.num_episodes) | (ep < 0))
        if bad.size:
            i = int(bad[0])
            add(i, f"segment names episode {ep[i]}, but split {split} of the source has {sp.num_episodes} episodes",
                "no_such_episode", bad.size)
            continue
        bad = np.flatnonzero(st + take > sp.lengths[ep])
        if bad.size:
            i = int(bad[0])
            add(i, f"segment takes tokens [{st[i]}, {st[i] + take[i]}) of episode {ep[i]}, which has "
                   f"{sp.lengths[ep[i]]} tokens", "past_episode_end", bad.size)
            continue
        srcs = sp.sources
        if srcs is not None:
            bad = np.flatnonzero((src != -1) & (src != srcs[ep]))
            if bad.size:
                i = int(bad[0])
                add(i, f"segment names record {src[i]} for episode {ep[i]}; the source episode came from record "
                       f"{srcs[ep[i]]}", "record_mismatch", bad.size)
        _compare_tokens(mine, seg, owner, local, sp, add)
        if markers is not None:
            _compare_prefixes(mine, seg, owner, local, sp, markers, add)
    return out


def _compare_prefixes(mine, seg, owner, local, sp, markers: MarkerIds, add) -> None:
    """Each injected prefix equals what stream packing injects for its episode at its
    start (``stream_packing.stream_prefix``): the conversation's own system span and
    ``<|USER|>``. One call per rewritten row; bfd rows have none."""
    for i in np.flatnonzero(seg[:, 3] > 0).tolist():
        part = mine[int(owner[i])]
        at = int(seg[i, 0]) * int(part.lengths[0]) + int(seg[i, 1])
        got = np.asarray(part.tokens[at:at + int(seg[i, 3])]).astype(np.int64)
        ep, start = int(seg[i, 4]), int(seg[i, 5])
        want = stream_prefix(np.asarray(sp.episode(ep)[0]), start, markers)[0] if start > 0 else None
        if want is None or not np.array_equal(got, want):
            should = "none (the row is not rewritten there)" if want is None else \
                " ".join(_token_name(int(t), markers) for t in want[:8]) + (" ..." if want.size > 8 else "")
            add(i, f"segment {int(local[i])}'s injected context ({int(seg[i, 3])} token(s)) is not what stream "
                   f"packing injects for episode {ep} at its token {start} ({should})", "prefix_differs")
            return


def _token_name(t: int, m: MarkerIds) -> str:
    names = {v: k for k, v in m.as_dict().items()}
    return names.get(t, str(t))


def _compare_tokens(mine, seg, owner, local, sp, add) -> None:
    """Each segment's episode tokens equal the source episode's, a chunk at a time."""
    take = seg[:, 2] - seg[:, 3]
    csum = np.cumsum(take)
    k, n = 0, seg.shape[0]
    while k < n:
        base = int(csum[k - 1]) if k else 0
        j = max(k + 1, int(np.searchsorted(csum, base + CHUNK_TOKENS, side="right")))
        got, want = [], []
        for part_i in np.unique(owner[k:j]):
            sel = np.flatnonzero(owner[k:j] == part_i) + k
            part = mine[int(part_i)]
            L = int(part.lengths[0])
            got.append(gather_ranges(part.tokens, seg[sel, 0] * L + seg[sel, 1] + seg[sel, 3], take[sel]))
        eps = seg[k:j, 4]
        starts = sp.starts[eps] + seg[k:j, 5]
        shard_of = sp.shard_of(eps)
        for si in np.unique(shard_of):
            sel = np.flatnonzero(shard_of == si)
            want.append((sel, gather_ranges(sp.shards[int(si)].tokens, starts[sel], take[k:j][sel])))
        got_all = np.concatenate(got).astype(np.int64)
        want_all = np.empty_like(got_all)
        off = np.concatenate([[0], np.cumsum(take[k:j])])
        for sel, vals in want:
            dest = range_index(off[sel], take[k:j][sel])
            want_all[dest] = vals
        d = np.flatnonzero(got_all != want_all)
        if d.size:
            i = k + int(np.searchsorted(off, d[0], side="right")) - 1
            add(i, f"segment {int(local[i])}'s tokens differ from episode {seg[i, 4]} of the source (first at its "
                   f"token {int(d[0] - off[i - k])}): the rows were not packed from this source, or were changed",
                "tokens_differ")
            return
        k = j
