"""Shards on disk: one shard folder memory-mapped, with what its files alone can say is
wrong with it (``Shard``, ``size_problems``), and the shards of one split seen as one
sequence of items with global ids (``Split``): the episodes of an episodes dataset, the
rows of a packed one (``episodes.idx`` indexes either), and the segments of a packed
split's rows.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from ..packing.layout import Segments
from ..storage import METADATA_FILE
from ..util.ranges import read_range
from .format import (
    CLIP,
    EPISODE_RECORD_BYTES,
    EPISODES_FILE,
    IDX_DTYPE,
    LABEL_DTYPE,
    LABELS_FILE,
    LAST_REPLY_DTYPE,
    LAST_REPLY_FILE,
    MASK_FILE,
    RECREATE,
    REPACK,
    SEGMENT_FIELDS,
    SEGMENT_RECORD_BYTES,
    SEGMENTS_FILE,
    SOURCES_FILE,
    TOKENS_FILE,
    Problem,
    decode_segments,
    mask_dtype_for,
)


def map_values(path: Path, dtype) -> np.ndarray | None:
    """Read-only map of the whole values in ``path``; None when the file is missing.
    A partial value at the end is left out (``size_problems`` reports it); an empty
    file gives an empty array (memmap refuses size 0)."""
    dtype = np.dtype(dtype)
    try:
        n = path.stat().st_size // dtype.itemsize
    except FileNotFoundError:
        return None
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.empty(0, dtype)


class Shard:
    """One shard folder (or an older flat layout's split folder), memory-mapped.

    Mapping never fails on a damaged shard: a missing file leaves its array None
    (``index`` empty), a partial value at a file's end is left out; the reader's
    checks say what is wrong. ``index`` holds the (start, length) pairs of
    ``episodes.idx``: one per item, an episode or (``packed``) a row. ``split``,
    ``first_gid`` (global id of its first item) and ``rel`` (folder relative to the
    dataset) place it in its dataset.
    Pickles by path (cheap to send to workers) and reopens strictly.
    """

    def __init__(self, path: Path, token_dtype, name: str | None = None, *, root: Path | None = None,
                 split: str | None = None, first_gid: int = 0, packed: bool = False, entries: int = 1):
        self.path = Path(path)
        self.name = name or self.path.name
        self.token_dtype = np.dtype(token_dtype)
        self.root = Path(root) if root is not None else self.path.parent.parent
        self.split = split if split is not None else self.path.parent.name
        self.first_gid = int(first_gid)
        self.packed = packed
        self.entries = int(entries)  # index entries per row: 1, or a pair dataset's (format.ENTRIES_PER_ROW)
        self._map()

    def _map(self) -> None:
        p = self.path
        self.rel = self.path.relative_to(self.root).as_posix()
        self.tokens = map_values(p / TOKENS_FILE, self.token_dtype)
        idx = map_values(p / EPISODES_FILE, IDX_DTYPE)
        self.index = np.empty((0, 2), IDX_DTYPE) if idx is None else idx[:idx.shape[0] // 2 * 2].reshape(-1, 2)
        mp = p / MASK_FILE
        self.mask = map_values(mp, mask_dtype_for(mp.stat().st_size, self.num_tokens)) if mp.is_file() else None
        self.sources = map_values(p / SOURCES_FILE, IDX_DTYPE)
        self.labels = map_values(p / LABELS_FILE, LABEL_DTYPE) if self.entries > 1 else None  # kto rows
        seg, k = map_values(p / SEGMENTS_FILE, IDX_DTYPE), len(SEGMENT_FIELDS)
        self.segments = None if seg is None else seg[:seg.shape[0] // k * k].reshape(-1, k)
        self.last_reply = map_values(p / LAST_REPLY_FILE, LAST_REPLY_DTYPE)  # None: no item flagged
        self.media_table = None  # its media table once read (store.media_table.shard_media; datasets with media)

    def last_only(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """The "last reply only" flag (bool) of items ``[first, stop)``: episodes, or a
        packed shard's segments (``format.LAST_REPLY_FILE``); all False without the file."""
        n = (self.num_items if self.segments is None else self.segments.shape[0]) if stop is None else stop
        out = np.zeros(max(n - first, 0), dtype=bool)
        if self.last_reply is not None:  # a file of the wrong size (``size_problems``): what it holds, else 0
            got = np.asarray(self.last_reply[first:n]) != 0
            out[:got.shape[0]] = got
        return out

    @property
    def num_items(self) -> int:
        """Episodes, or rows of a packed shard."""
        return int(self.index.shape[0])

    @property
    def episodes(self) -> np.ndarray:
        """Older name of ``index`` (a packed shard's items are rows)."""
        self._older_name("episodes", "index")
        return self.index

    @property
    def num_episodes(self) -> int:
        """Older name of ``num_items`` (a packed shard's items are rows)."""
        self._older_name("num_episodes", "num_items")
        return self.num_items

    def _older_name(self, old: str, new: str) -> None:
        if self.packed:
            warnings.warn(f"shard {self.rel} is packed: its items are rows; Shard.{old} is the older name, "
                          f"use Shard.{new}", DeprecationWarning, stacklevel=3)

    @property
    def num_tokens(self) -> int:
        return 0 if self.tokens is None else int(self.tokens.shape[0])

    @property
    def mask_dtype(self) -> np.dtype | None:
        return None if self.mask is None else self.mask.dtype

    @property
    def data_bytes(self) -> int:
        """Bytes of token and mask data (what a full read of the shard reads)."""
        return sum(int(a.nbytes) for a in (self.tokens, self.mask) if a is not None)

    @property
    def recreate(self) -> str:
        """How to make this shard again (the fix of most problems)."""
        return REPACK if self.packed else RECREATE

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens and mask ``[start, stop)`` read with plain file reads into fresh arrays.

        For streaming a whole shard in bounded memory: pages touched through the
        memmap stay resident and count in the process's RSS, file reads do not."""
        mask = None if self.mask is None else read_range(self.mask, start, stop)
        return read_range(self.tokens, start, stop), mask

    # -- where a problem is, for Problem records
    def file(self, fn: str) -> str:
        return f"{self.rel}/{fn}"

    def at(self, i: int, fn: str = EPISODES_FILE, byte: int | None = None) -> dict:
        """Problem location fields for local item ``i``, an episode or (packed) a row (byte: of
        its index record unless given). The ``episode`` field holds the global id of either."""
        gid = self.first_gid + int(i)
        byte = EPISODE_RECORD_BYTES * int(i) if byte is None else int(byte)
        what = "row" if self.packed else "episode"
        return {"where": f"{what} {gid} of {self.split}, byte {byte:,} of {fn}", "split": self.split,
                "episode": gid, "byte": byte}

    def at_row(self, r: int, seg: int | None = None) -> dict:
        """Problem location fields for local row ``r`` of a packed shard (and segment ``seg``)."""
        g = self.first_gid + int(r)
        if seg is None:
            return {"where": f"row {g} of {self.split}", "split": self.split, "episode": g}
        byte = SEGMENT_RECORD_BYTES * seg
        return {"where": f"row {g} of {self.split}, segment {seg}, byte {byte:,} of {SEGMENTS_FILE}",
                "split": self.split, "episode": g, "byte": byte}

    def __getstate__(self):
        return {"path": str(self.path), "token_dtype": self.token_dtype.str, "name": self.name,
                "root": str(self.root), "split": self.split, "first_gid": self.first_gid, "packed": self.packed,
                "entries": self.entries}

    def __setstate__(self, state):
        self.path, self.root = Path(state["path"]), Path(state["root"])
        self.name, self.split, self.first_gid, self.packed = (state[k] for k in ("name", "split", "first_gid", "packed"))
        self.token_dtype = np.dtype(state["token_dtype"])
        self.entries = int(state.get("entries", 1))
        self._map()
        problems = missing_files(self, (TOKENS_FILE, EPISODES_FILE)) + size_problems(self)
        if problems:  # changed since it was opened
            raise DatasetError(f"{self.root}: {problems[0]}. Run `sftdata verify {self.root}` for the full report")


def missing_files(shard: Shard, names) -> list[Problem]:
    """A ``files`` problem for each of ``names`` the shard folder lacks."""
    return [Problem("files", shard.file(fn), "", f"{shard.file(fn)} is missing",
                    "restore the file from a good copy of the dataset, or " + shard.recreate)
            for fn in dict.fromkeys(names) if not (shard.path / fn).is_file()]


def size_problems(shard: Shard, record: dict | None = None) -> list[Problem]:
    """Whole values in every file, tokens/mask/sources counts agree, and each file's size
    equals the one the metadata recorded for it (``record``: the shard's entry)."""
    out = []
    d, itemsize, fix = shard.path, shard.token_dtype.itemsize, shard.recreate

    def size(fn):
        return (d / fn).stat().st_size if (d / fn).is_file() else None

    ts, ms, es = size(TOKENS_FILE), size(MASK_FILE), size(EPISODES_FILE)
    if ts is not None and ts % itemsize:
        out.append(Problem("sizes", shard.file(TOKENS_FILE), "", f"{ts:,} bytes is not a whole number of "
                           f"{shard.token_dtype.name} tokens ({itemsize} bytes each): the file is truncated "
                           "(or the token dtype is wrong)", fix, shard.split, byte=ts - ts % itemsize))
    n = shard.num_tokens
    if ms is not None and shard.tokens is not None and ms not in (n, 4 * n):
        out.append(Problem("sizes", shard.file(MASK_FILE), "", f"{ms:,} mask bytes for the {n:,} tokens of "
                           f"{TOKENS_FILE}: tokens and mask differ in count (one is truncated, or they come from "
                           "different shards)", fix, shard.split))
    if es is not None and es % EPISODE_RECORD_BYTES:
        out.append(Problem("sizes", shard.file(EPISODES_FILE), "", f"{es:,} bytes is not a multiple of "
                           f"{EPISODE_RECORD_BYTES} (uint64 start, length pairs): the index is truncated", fix,
                           shard.split, byte=es - es % EPISODE_RECORD_BYTES))
    gs, k = size(SEGMENTS_FILE), len(SEGMENT_FIELDS)
    if gs is not None and gs % SEGMENT_RECORD_BYTES:
        out.append(Problem("sizes", shard.file(SEGMENTS_FILE), "", f"{gs:,} bytes is not a multiple of "
                           f"{SEGMENT_RECORD_BYTES} ({k} uint64 per segment): the index is truncated", REPACK,
                           shard.split, byte=gs - gs % SEGMENT_RECORD_BYTES))
    per = shard.entries
    if per > 1 and shard.num_items % per:
        out.append(Problem("sizes", shard.file(EPISODES_FILE), "", f"{shard.num_items:,} index entries are not "
                           f"whole rows of {per} (a row never spans shards): the index is truncated", fix,
                           shard.split, code="partial_row"))
    if shard.sources is not None and shard.sources.shape[0] != shard.num_items // per:
        what = "episodes" if per == 1 else f"rows ({per} entries each)"
        out.append(Problem("sizes", shard.file(SOURCES_FILE), "", f"{shard.sources.shape[0]:,} record numbers for "
                           f"{shard.num_items // per:,} {what}: there must be exactly one per "
                           f"{'episode' if per == 1 else 'row'}", fix, shard.split))
    if shard.labels is not None and shard.labels.shape[0] != shard.num_items // per:
        out.append(Problem("sizes", shard.file(LABELS_FILE), "", f"{shard.labels.shape[0]:,} labels for "
                           f"{shard.num_items // per:,} rows: there must be exactly one per row", fix, shard.split))
    if shard.last_reply is not None:
        n, what = (shard.segments.shape[0], "segments") if shard.segments is not None else \
            (shard.num_items, "episodes")
        if shard.last_reply.shape[0] != n:
            out.append(Problem("sizes", shard.file(LAST_REPLY_FILE), "", f"{shard.last_reply.shape[0]:,} last-reply "
                               f"flags for {n:,} {what}: there must be exactly one per item", fix, shard.split))
    recorded = (record or {}).get("files") or {}
    off = [(fn, size(fn), r["bytes"]) for fn, r in recorded.items()
           if isinstance(r, dict) and size(fn) is not None and r.get("bytes") is not None and size(fn) != r["bytes"]]
    if len(recorded) >= 2 and len(off) == len(recorded):
        out.append(Problem("sizes", shard.rel, "", f"every file of {shard.rel} differs in size from what "
                           f"{METADATA_FILE} recorded ({', '.join(f'{fn} {a:,} vs {b:,} bytes' for fn, a, b in off)})"
                           ": the shard was replaced, e.g. by a shard of another dataset",
                           "restore this shard from this dataset's copy, or " + fix, shard.split))
    else:
        for fn, a, b in off:
            how = "truncated" if a < b else "longer than written"
            out.append(Problem("sizes", shard.file(fn), "", f"{a:,} bytes; {METADATA_FILE} recorded {b:,}: the file "
                               f"is {how}", "restore the file from a good copy, or " + fix, shard.split,
                               byte=min(a, b)))
    return out


class Split:
    """The shards of one split seen as one sequence of items with global ids.

    An item is an episode, or a row of a packed split (``packed``). Code that works on
    either kind says ``num_items`` / ``item(i)`` / ``item_offsets``; code for one kind
    says ``num_episodes`` / ``episode(i)`` or ``num_rows`` / ``row(i)``. The episode
    names on a packed split are the older spelling: they still work, with a
    ``DeprecationWarning``; the row names on an episodes split raise ``DatasetError``.
    """

    def __init__(self, name: str, shards: list[Shard], packed: bool = False):
        self.name = name
        self.shards = shards
        self.packed = packed
        counts = [s.num_items for s in shards]
        self.item_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_items = int(self.item_offsets[-1])
        if shards:  # a damaged value past 2**62 clipped: int64 would wrap it negative
            self.starts = np.minimum(np.concatenate([s.index[:, 0] for s in shards]), CLIP).astype(np.int64)
            self.lengths = np.minimum(np.concatenate([s.index[:, 1] for s in shards]), CLIP).astype(np.int64)
        else:
            self.starts = np.empty(0, np.int64)
            self.lengths = np.empty(0, np.int64)
        self.has_mask = bool(shards) and all(s.mask is not None for s in shards)
        self.num_tokens = sum(s.num_tokens for s in shards)

    @property
    def what(self) -> str:
        """What one item is: "row" or "episode"."""
        return "row" if self.packed else "episode"

    @property
    def sources(self) -> np.ndarray | None:
        """Input record number of every episode (global order), or None when not stored."""
        if not self.shards or any(s.sources is None for s in self.shards):
            return None
        return np.concatenate([np.asarray(s.sources, dtype=np.int64) for s in self.shards])

    @property
    def flagged(self) -> bool:
        """Whether a shard holds items flagged "last reply only" (``format.LAST_REPLY_FILE``)."""
        return any(s.last_reply is not None and bool(np.any(s.last_reply)) for s in self.shards)

    def last_only_of(self, episodes) -> np.ndarray:
        """The "last reply only" flag (bool) of each of ``episodes`` (global ids)."""
        episodes = np.asarray(episodes, dtype=np.int64)
        out = np.zeros(episodes.shape, dtype=bool)
        shard = self.shard_of(episodes)
        for si in np.unique(shard).tolist():
            s = self.shards[si]
            if s.last_reply is not None:
                sel = shard == si
                out[sel] = s.last_only()[episodes[sel] - self.item_offsets[si]]
        return out

    def shard_of(self, global_ids) -> np.ndarray:
        """Index of the shard holding each global item id."""
        return np.searchsorted(self.item_offsets, np.asarray(global_ids), side="right") - 1

    def locate(self, global_id: int) -> tuple[Shard, int]:
        gid = int(global_id)
        if not 0 <= gid < self.num_items:
            raise DatasetError(f"{self.what} {gid} does not exist in split {self.name!r}, which has "
                               f"{self.num_items} {self.what}s (ids 0..{self.num_items - 1})")
        si = int(self.shard_of(gid))
        return self.shards[si], gid - int(self.item_offsets[si])

    def item(self, global_id: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and mask, or None) of one item, at most ``limit`` tokens; views, no copy."""
        shard, local = self.locate(global_id)
        start, length = (int(v) for v in shard.index[local])
        n = length if limit is None else min(length, limit)
        toks = shard.tokens[start:start + n]
        mask = shard.mask[start:start + n] if shard.mask is not None else None
        return toks, mask

    # -- one kind's names
    @property
    def num_rows(self) -> int:
        """Rows of a packed split."""
        self._must_be_packed("num_rows")
        return self.num_items

    def row(self, global_id: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and mask, or None) of one row of a packed split; views, no copy."""
        self._must_be_packed("row(i)")
        return self.item(global_id)

    @property
    def num_episodes(self) -> int:
        """Episodes of an episodes split."""
        self._rows_named_episodes("num_episodes", "num_rows")
        return self.num_items

    def episode(self, global_id: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and mask, or None) of one episode, at most ``limit`` tokens; views, no copy."""
        self._rows_named_episodes("episode(i)", "row(i)")
        return self.item(global_id, limit)

    @property
    def episode_offsets(self) -> np.ndarray:
        """Older name of ``item_offsets``."""
        self._rows_named_episodes("episode_offsets", "item_offsets")
        return self.item_offsets

    def _must_be_packed(self, name: str) -> None:
        if not self.packed:
            raise DatasetError(f"split {self.name!r} holds episodes, not packed rows: use Split.num_episodes / "
                               f"Split.episode(i) (or num_items / item(i)) instead of Split.{name}")

    def _rows_named_episodes(self, old: str, new: str) -> None:
        if self.packed:
            warnings.warn(f"split {self.name!r} is packed: its items are rows; Split.{old} is the older name, "
                          f"use Split.{new}", DeprecationWarning, stacklevel=3)


def split_segment_flags(split: Split) -> np.ndarray:
    """The "last reply only" flag (bool) of every segment of a packed split, in the order
    of ``split_segments`` (``format.LAST_REPLY_FILE``; all False where a shard has none)."""
    return np.concatenate([sh.last_only() for sh in split.shards] or [np.zeros(0, bool)])


def split_segments(split: Split) -> Segments:
    """All segments of a packed split, with global row ids."""
    parts = []
    for si, sh in enumerate(split.shards):
        if sh.segments is None:
            raise DatasetError(f"{sh.path / SEGMENTS_FILE} is missing; the packed dataset is incomplete. "
                               f"Re-create it with `sftdata pack`")
        seg = decode_segments(sh.segments)
        parts.append(replace(seg, row=seg.row + int(split.item_offsets[si])))
    return Segments.concat(parts)
