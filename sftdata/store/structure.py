"""The structural checks of a dataset: index-sized work, no pass over the token data
beyond one token per episode. ``scan_dataset`` runs them (``open_dataset`` refuses a
dataset that fails one); ``verify`` reports them with its content checks.

Each check is a pure function over shards (``Shard``) returning ``Problem`` records; a
problem names the first offender of its kind in a shard and how many more there are,
so a thoroughly broken shard gives a short report, not a million lines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..chat.markers import MarkerIds
from ..storage import METADATA_FILE
from .format import (
    EPISODES_FILE,
    MEDIA_FILE,
    RECREATE,
    REPACK,
    RESTORE,
    SEGMENTS_FILE,
    TOKENS_FILE,
    Problem,
    decode_segments,
    more_like_it,
    shard_record,
)
from .shard import Shard

# index problems an older flat layout may have by design (its specification asks only for
# (start, length) records): verify reports them, open_dataset lets the loader train
HARMLESS_IN_FLAT = ("unsorted", "gap", "leading_gap", "trailing_tokens")


def check_shard_list(meta: dict, shards_on_disk: dict[str, list[str]]) -> list[Problem]:
    """Shards the metadata lists but the disk lacks, and shards on disk it does not list."""
    out = []
    recreate = REPACK if meta.get("kind") == "packed" else RECREATE
    for split, names in shards_on_disk.items():
        recorded = [s.get("name") for s in ((meta.get("splits") or {}).get(split) or {}).get("shards") or []]
        for name in recorded:
            if name not in names:
                out.append(Problem("files", f"{split}/{name}", "", f"shard folder {split}/{name}, listed in "
                                   f"{METADATA_FILE}, is missing", "restore it, or " + recreate))
        for name in names:
            if name not in recorded:
                out.append(Problem("files", f"{split}/{name}", "", f"shard folder {split}/{name} is not listed in "
                                   f"{METADATA_FILE}: it was added after prepare (from another dataset?)",
                                   f"remove {split}/{name}, or " + recreate))
    for split in (meta.get("splits") or {}):
        if split not in shards_on_disk:
            out.append(Problem("files", split, "", f"split {split}, listed in {METADATA_FILE}, has no shard on disk",
                               "restore it, or " + recreate))
    return out


# ------------------------------------------------------------------------- episodes
@dataclass(frozen=True)
class EpisodeBounds:
    """The episodes of a shard as int64 ``starts``/``lengths`` (clipped to ``tokens + 1``,
    so sums cannot wrap), and which are ``usable``: in bounds and non-empty."""

    starts: np.ndarray
    lengths: np.ndarray
    usable: np.ndarray
    tokens: int  # tokens the episodes may span: of tokens.bin, and of mask.bin when shorter


def episode_bounds(shard: Shard) -> EpisodeBounds:
    ep, ntok = np.asarray(shard.index), shard.num_tokens  # a plain view: memmap indexing costs more
    if shard.mask is not None:
        ntok = min(ntok, int(shard.mask.shape[0]))  # episodes past the mask's end cannot be checked
    cap = np.uint64(ntok + 1)  # clip first: uint64 sums must not wrap around
    s = np.minimum(ep[:, 0], cap).astype(np.int64)
    ln = np.minimum(ep[:, 1], cap).astype(np.int64)
    return EpisodeBounds(s, ln, (s + ln <= ntok) & (ln > 0), ntok)


def check_index(shard: Shard, b: EpisodeBounds) -> list[Problem]:
    """Episodes in bounds, sorted, contiguous and non-overlapping; none empty.

    Each problem has a ``code``: out_of_bounds, empty, overlap (these break training),
    unsorted, gap, leading_gap, trailing_tokens (these only waste or reorder tokens)."""
    ep, n, ntok = shard.index, shard.num_items, b.tokens
    s, ln = b.starts, b.lengths
    e = s + ln
    oob = e > ntok
    out = []
    fix = f"{EPISODES_FILE} is damaged or belongs to other tokens: restore the shard, or " + RECREATE
    g = shard.first_gid

    def add(code: str, i: int, message: str) -> None:
        loc = shard.at(i) if n else {"where": "", "split": shard.split}
        out.append(Problem("index", shard.file(EPISODES_FILE), message=message, fix=fix, code=code, **loc))

    bad = np.flatnonzero(oob)
    if bad.size:
        i = int(bad[0])
        a, z = int(ep[i, 0]), int(ep[i, 0]) + int(ep[i, 1])
        add("out_of_bounds", i, f"episode {g + i} spans tokens [{a:,}, {z:,}) but the shard holds {ntok:,} "
                                f"tokens: the record points past the end{more_like_it(bad.size)}")
    bad = np.flatnonzero(ln == 0)
    if bad.size:
        add("empty", int(bad[0]), f"episode {g + int(bad[0])} has length 0{more_like_it(bad.size)}")
    if n >= 2:
        pair = ~oob[1:] & ~oob[:-1]
        back = np.flatnonzero(pair & (s[1:] < s[:-1]))
        over = np.flatnonzero(pair & (s[1:] >= s[:-1]) & (s[1:] < e[:-1]))
        gap = np.flatnonzero(pair & (s[1:] > e[:-1]))
        if back.size:
            i = int(back[0]) + 1
            add("unsorted", i, f"episode {g + i} starts at token {s[i]:,}, before episode {g + i - 1} (token "
                               f"{s[i - 1]:,}): {EPISODES_FILE} is not sorted{more_like_it(back.size)}")
        if over.size:
            i = int(over[0]) + 1
            add("overlap", i, f"episode {g + i} starts at token {s[i]:,}, inside episode {g + i - 1} (tokens "
                              f"[{s[i - 1]:,}, {e[i - 1]:,})): the episodes overlap, so tokens would be trained "
                              f"twice and conversations run into each other{more_like_it(over.size)}")
        if gap.size:
            i = int(gap[0]) + 1
            add("gap", i, f"tokens [{e[i - 1]:,}, {s[i]:,}) between episodes {g + i - 1} and {g + i} belong to "
                          f"no episode: the index is not contiguous{more_like_it(gap.size, 'gaps')}")
    if n and not oob[0] and s[0] > 0:
        add("leading_gap", 0, f"tokens [0, {s[0]:,}) before the first episode belong to no episode")
    if n and not oob.any() and int(e.max()) < shard.num_tokens:
        add("trailing_tokens", n - 1, f"{TOKENS_FILE} holds {shard.num_tokens - int(e.max()):,} tokens after the "
                                      f"last episode ends (token {int(e.max()):,}) that belong to no episode")
    if not n and shard.num_tokens:
        add("trailing_tokens", 0, f"no episodes, but {TOKENS_FILE} holds {shard.num_tokens:,} tokens")
    return out


def marker_name(token_id: int, markers: MarkerIds) -> str | None:
    """The name of the marker ``token_id`` is (``<|USER|>``), or None: for messages."""
    return {v: k for k, v in markers.as_dict().items()}.get(int(token_id))


def check_eos(shard: Shard, b: EpisodeBounds, markers: MarkerIds) -> list[Problem]:
    """Every usable episode ends with EOS: one token read per episode."""
    if shard.tokens is None:
        return []
    ends = b.starts + b.lengths - 1
    use = None if b.usable.all() else np.flatnonzero(b.usable)
    last = np.asarray(shard.tokens)[ends if use is None else ends[use]]  # a plain view: memmap indexing costs more
    bad = np.flatnonzero(last != markers.eos)
    bad = bad if use is None else use[bad]
    if not bad.size:
        return []
    i = int(bad[0])
    pos = int(b.starts[i] + b.lengths[i] - 1)
    tok = int(shard.tokens[pos])
    name = marker_name(tok, markers) or f"id {tok}"
    return [Problem("eos", shard.file(TOKENS_FILE), message=f"episode {shard.first_gid + i} ends with "
                    f"{name}, not <|EOS|> (id {markers.eos}): its boundaries in {EPISODES_FILE} "
                    f"do not match the tokens, or the tokens were changed{more_like_it(bad.size)}",
                    fix="restore the shard, or " + RECREATE,
                    **shard.at(i, TOKENS_FILE, pos * shard.token_dtype.itemsize))]


# ------------------------------------------------------------------------- media spans
def check_media_spans(shard: Shard, items: np.ndarray, offsets: np.ndarray, tokens: np.ndarray,
                      lines: np.ndarray) -> list[Problem]:
    """A shard's media spans (``items``: local episode or packed row, ``offsets`` within it,
    ``tokens``; ``lines``: their 1-based lines of ``MEDIA_FILE``) placed as the format says:
    each in an item of the shard and inside it, in (item, offset) order, none overlapping
    the one before it in its item. Pure over the arrays and the shard's index."""
    out = []
    n = shard.num_items
    f = shard.file(MEDIA_FILE)
    fix = RESTORE + shard.recreate
    what = "row" if shard.packed else "episode"

    def add(k: np.ndarray, message, code: str) -> None:
        i = int(k[0])
        gid = shard.first_gid + int(items[i]) if 0 <= int(items[i]) < n else None
        where = (f"{what} {gid} of {shard.split}, " if gid is not None else "") + f"line {int(lines[i]):,} of {MEDIA_FILE}"
        out.append(Problem("media", f, where, message(i) + more_like_it(k.size, "lines"), fix, shard.split,
                           episode=gid, code=code))

    g = shard.first_gid
    bad = np.flatnonzero(items >= n)
    if bad.size:
        add(bad, lambda i: f"line {lines[i]} places an item in {what} {items[i]} of the shard, which holds {n} "
                           f"{what}s", "item_out_of_range")
    inside = items < n
    length = np.zeros(items.shape, np.int64)
    length[inside] = np.minimum(np.asarray(shard.index)[items[inside], 1], 2**62).astype(np.int64)
    end = offsets + tokens
    bad = np.flatnonzero(inside & (end > length))
    if bad.size:
        add(bad, lambda i: f"the media span at offset {offsets[i]:,} ({tokens[i]:,} tokens) runs past the end of "
                           f"{what} {g + items[i]} ({length[i]:,} tokens)", "past_item_end")
    if items.size >= 2:
        key_back = (items[1:] < items[:-1]) | ((items[1:] == items[:-1]) & (offsets[1:] <= offsets[:-1]))
        bad = np.flatnonzero(key_back) + 1
        if bad.size:
            add(bad, lambda i: f"the span at ({what} {g + items[i]}, offset {offsets[i]:,}) comes after "
                               f"({what} {g + items[i - 1]}, offset {offsets[i - 1]:,}): {MEDIA_FILE} is not in "
                               f"({what}, offset) order", "unsorted")
        over = np.flatnonzero((items[1:] == items[:-1]) & (offsets[1:] > offsets[:-1]) &
                              (offsets[1:] < end[:-1])) + 1
        if over.size:
            add(over, lambda i: f"the media span at offset {offsets[i]:,} of {what} {g + items[i]} starts inside "
                                f"the one before it (tokens [{offsets[i - 1]:,}, {end[i - 1]:,})): the spans "
                                "overlap", "overlap")
    return out


# ------------------------------------------------------------------------- packed rows
def readable_rows(shard: Shard, row_len: int) -> int:
    """Rows whose tokens (and mask) are all there and that have an index record."""
    rows = shard.num_tokens // row_len
    if shard.mask is not None:
        rows = min(rows, int(shard.mask.shape[0]) // row_len)
    return min(rows, shard.num_items)


def check_rows(shard: Shard, row_len: int) -> list[Problem]:
    """Whole rows of ``row_len`` tokens, one record (r * row_len, row_len) per row in
    ``episodes.idx``."""
    out = []
    n, ntok = shard.num_items, shard.num_tokens
    if ntok % row_len:
        out.append(Problem("rows", shard.file(TOKENS_FILE), "", f"{ntok:,} tokens are not whole rows of {row_len} "
                           "(packing.row_len): the file is truncated or from another packing", REPACK, shard.split,
                           byte=ntok // row_len * row_len * shard.token_dtype.itemsize))
    if n != ntok // row_len:
        out.append(Problem("rows", shard.file(EPISODES_FILE), "", f"{n:,} row records for the {ntok // row_len:,} "
                           f"rows of {TOKENS_FILE}: there must be one per row", REPACK, shard.split))
    ep = shard.index
    want = np.arange(n, dtype=np.uint64) * np.uint64(row_len)
    bad = np.flatnonzero((ep[:, 0] != want) | (ep[:, 1] != row_len))
    if bad.size:
        i = int(bad[0])
        out.append(Problem("rows", shard.file(EPISODES_FILE), message=f"row {shard.first_gid + i} is recorded as "
                           f"tokens [{int(ep[i, 0]):,}, +{int(ep[i, 1]):,}), not [{i * row_len:,}, +{row_len}): rows "
                           f"must be consecutive blocks of row_len{more_like_it(bad.size, 'rows')}", fix=REPACK,
                           **shard.at(i)))
    return out


def check_segments(shard: Shard, row_len: int) -> list[Problem]:
    """Segments sorted, inside their row, tiling it from offset 0; every row has one."""
    if shard.segments is None:
        return []
    seg = decode_segments(shard.segments)
    out = []
    f = shard.file(SEGMENTS_FILE)
    nrows = shard.num_items
    row, off, length, pre = seg.row, seg.offset, seg.length, seg.prefix

    def add(i: int, message: str, n: int, code: str) -> None:
        out.append(Problem("segments", f, message=message + more_like_it(n, "segments"), fix=REPACK, code=code,
                           **shard.at_row(min(int(row[i]), max(nrows - 1, 0)), i)))

    g = shard.first_gid
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
    if out:
        return out
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
                           **shard.at_row(int(empty[0]))))
    return out


# ------------------------------------------------------------------------- counts
def _measure(shard: Shard, trained: int | None, packed: bool) -> dict:
    if packed:
        have = {"rows": shard.num_items}
        if shard.segments is not None:
            have["segments"] = int(shard.segments.shape[0])
            have["tokens"] = int(np.asarray(shard.segments[:, 2]).sum())  # real tokens, padding excluded
    else:
        have = {"episodes": shard.num_items, "tokens": shard.num_tokens}
    if trained is not None:
        have["trained_tokens"] = trained
    return have


def check_counts(meta: dict, shards: list[Shard], *, packed: bool = False,
                 trained: list[int | None] | None = None) -> list[Problem]:
    """Episodes (packed: rows and segments), tokens (packed: real tokens) and, when
    ``trained`` gives each shard's trained-token count (a full read of the mask:
    ``verify`` measures it), trained tokens, per shard, per split and in all, equal the
    metadata."""
    out = []
    found = []
    for k, shard in enumerate(shards):
        have = _measure(shard, None if trained is None else trained[k], packed)
        found.append((shard, have))
        rec = shard_record(meta, shard.split, shard.name) or {}
        for what, a in have.items():
            b = rec.get(what)
            if isinstance(b, int) and a != b:
                out.append(Problem("counts", shard.rel, "", f"{shard.rel} holds {a:,} {what.replace('_', ' ')}; "
                                   f"{METADATA_FILE} recorded {b:,}", "the shard changed after it was written: "
                                   "restore it, or " + shard.recreate, shard.split))
    total = 0
    for split, rec in (meta.get("splits") or {}).items():
        mine = [have for shard, have in found if shard.split == split]
        for what in ("rows", "segments", "episodes", "tokens", "trained_tokens"):
            b = (rec or {}).get(what)
            if not mine or not isinstance(b, int) or any(what not in h for h in mine):
                continue
            a = sum(h[what] for h in mine)
            if a != b:
                out.append(Problem("counts", METADATA_FILE, f"splits.{split}.{what}", f"split {split} holds {a:,} "
                                   f"{what.replace('_', ' ')} in {len(mine)} shard(s); {METADATA_FILE} recorded "
                                   f"{b:,}", "the metadata or the shards were changed after they were written: "
                                   "restore the dataset, or " + (REPACK if packed else RECREATE), split))
        total += sum(h.get("episodes", 0) for h in mine)
    rec_total = (meta.get("counts") or {}).get("episodes")
    if not packed and isinstance(rec_total, int) and shards and rec_total != total:
        out.append(Problem("counts", METADATA_FILE, "counts.episodes", f"the splits hold {total:,} episodes in all; "
                           f"{METADATA_FILE} recorded {rec_total:,}", "the metadata or the shards were changed "
                           "after prepare: restore the dataset, or " + RECREATE))
    return out

