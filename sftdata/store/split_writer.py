"""A split's shards written: tokens, mask, the index and the sources of each shard, hashed as
they are written (``SplitWriter``: episodes; ``PackedSplitWriter``: packed rows and their
segments; ``RowSplitWriter``: rows of entries, pairs, KTO or prompts). ``DatasetWriter``
(``writer``) opens them in its staging folder and commits what they return."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from ..media.item import IMAGE
from ..storage.fsops import make_folder
from ..util.oserrors import naming
from .format import (
    COLUMNS_FILE,
    ENTRIES_PER_ROW,
    EPISODES_FILE,
    IDX_DTYPE,
    KIND_KTO,
    KIND_PROMPTS,
    LABEL_DTYPE,
    LABELS_FILE,
    LAST_REPLY_DTYPE,
    LAST_REPLY_FILE,
    LAST_REPLY_KEY,
    MASK_DTYPE,
    MASK_FILE,
    MEDIA_FILE,
    MEDIA_KEY,
    SEGMENTS_FILE,
    SOURCES_FILE,
    TOKENS_FILE,
    flagged_count,
    media_count,
    row_shard_files,
    shard_name,
)


class _HashedFile:
    """A binary file written sequentially whose sha256 and size are known on close. An
    error writing it (a full disk, a file-size limit) names it."""

    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "xb")  # a new file in the run's own staging folder
        self._h = hashlib.sha256()
        self.bytes = 0

    def write(self, data) -> None:
        mv = memoryview(data).cast("B")
        with naming(self.path):
            self._f.write(mv)
        self._h.update(mv)
        self.bytes += mv.nbytes

    def close(self) -> dict:
        with naming(self.path):
            self._f.close()
        return {"bytes": self.bytes, "sha256": self._h.hexdigest()}


@dataclass
class ShardInfo:
    name: str
    episodes: int
    tokens: int
    trained_tokens: int
    files: dict = field(default_factory=dict)
    stats: ValueStats = field(default_factory=lambda: ValueStats())
    flagged: int = 0  # episodes flagged "last reply only" (format.LAST_REPLY_FILE)
    media: dict | None = None  # its media items' counts (format.MEDIA_FILE): items, images, videos, tokens

    def as_dict(self) -> dict:
        flagged = {LAST_REPLY_KEY: self.flagged} if self.flagged else {}  # absent: none (as in older datasets)
        media = {MEDIA_KEY: self.media} if self.media else {}  # absent: none (a dataset without media)
        return {"name": self.name, "episodes": self.episodes, "tokens": self.tokens,
                "trained_tokens": self.trained_tokens, "files": self.files, **flagged, **media,
                **self.stats.as_dict()}


@dataclass
class ValueStats:
    """The smallest and largest token id and mask value written to a shard, recorded in
    the metadata so a reader can refuse ids past the vocabulary, or mask values other
    than 0/1, without reading the data."""
    token_min: int | None = None
    token_max: int | None = None
    mask_min: int | None = None
    mask_max: int | None = None

    def add(self, ids: np.ndarray, mask: np.ndarray) -> None:
        if ids.size == 0:
            return
        lo, hi, mlo, mhi = int(ids.min()), int(ids.max()), int(mask.min()), int(mask.max())
        if self.token_min is None:
            self.token_min, self.token_max, self.mask_min, self.mask_max = lo, hi, mlo, mhi
        else:
            self.token_min, self.token_max = min(self.token_min, lo), max(self.token_max, hi)
            self.mask_min, self.mask_max = min(self.mask_min, mlo), max(self.mask_max, mhi)

    def as_dict(self) -> dict:
        if self.token_min is None:
            return {}
        return {"token_id_range": [self.token_min, self.token_max], "mask_value_range": [self.mask_min, self.mask_max]}


def _fit(bounds: np.ndarray, i: int, room: int) -> int:
    """The end ``j`` of the items ``[i, j)`` that fit in ``room`` tokens, at least one
    (``bounds``: 0, then the cumulative tokens of the items)."""
    return max(i + 1, int(np.searchsorted(bounds, bounds[i] + room, side="right")) - 1)


def shard_starts(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """The first item of each shard the rolling rule opens for items of ``lengths``
    appended in order, however they are appended: what a coordinator plans shards with
    before any is written (``prepare.plan``)::

        shard_starts([3, 3, 3, 9, 1], 6) -> [0, 2, 3, 4]      (3+3 | 3 | 9 | 1)
    """
    bounds = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    out, i, n = [], 0, bounds.shape[0] - 1
    while i < n:
        out.append(i)
        i = _fit(bounds, i, capacity)
    return np.asarray(out, dtype=np.int64)


class _ShardedSplit:
    """What both split writers share: a split's shards, opened in name order, each with its
    files written through ``_HashedFile``, and the one rolling rule. An item (an episode, a
    packed row) never spans shards: a new shard starts when the next item would push the
    current one past ``capacity`` tokens, and a shard holds at least one item. An empty
    split still gets one (empty) shard, so readers find it."""

    FILES: tuple[str, ...] = ()

    def __init__(self, root: Path, split: str, token_dtype: np.dtype, capacity: int, media: bool = False):
        self.dir = root / split
        self.media = media  # every shard holds a media table and its counts (a dataset of a vision model's)
        self.split = split
        self.token_dtype = np.dtype(token_dtype)
        self.capacity = int(capacity)
        self.shards: list = []
        self._files: dict[str, _HashedFile] | None = None
        self._filled = 0  # tokens of capacity the open shard holds
        self._flags: list[np.ndarray] = []  # the open shard's "last reply only" flags, one per item
        self._media: list[bytes] = []  # the open shard's media table lines (format.MEDIA_FILE)
        self._media_counts = empty_media()

    def _new_record(self, name: str):
        raise NotImplementedError

    def _finish_record(self, files: dict) -> None:
        raise NotImplementedError

    def _open_shard(self) -> None:
        self._close_shard()
        name = shard_name(len(self.shards))
        if not self.shards:  # the split's folder, never its parents: a removed staging area stays removed
            make_folder(self.dir)
        d = self.dir / name
        d.mkdir()
        self._files = {fn: _HashedFile(d / fn) for fn in self.FILES}
        self.shards.append(self._new_record(name))
        self._filled = 0
        self._flags = []
        self._media, self._media_counts = [], empty_media()

    def _close_shard(self) -> None:
        if self._files is not None:
            files = {fn: f.close() for fn, f in self._files.items()}
            if any(f.any() for f in self._flags):  # only a shard holding a flagged item has the file
                f = _HashedFile(self.dir / shard_name(len(self.shards) - 1) / LAST_REPLY_FILE)
                f.write(np.ascontiguousarray(np.concatenate(self._flags), dtype=LAST_REPLY_DTYPE))
                files[LAST_REPLY_FILE] = f.close()
            if self._media or self.media:  # a shard of a vision model's dataset, or one holding a media item
                f = _HashedFile(self.dir / shard_name(len(self.shards) - 1) / MEDIA_FILE)
                f.write(b"".join(self._media))
                files[MEDIA_FILE] = f.close()
                self._media_done(self._media_counts)
            self._finish_record(files)
            self._files, self._flags, self._media = None, [], []

    def _media_done(self, counts: dict) -> None:
        """Record the closed shard's media counts (a writer of media items says where)."""
        raise ValueError("this split writer takes no media")

    def _add_media(self, media, first: int) -> None:
        """The media table lines of items whose spans are ``media`` (a sequence of tuples of
        ``MediaSpan``, one per item, None: none), the first being the open shard's item ``first``."""
        if media is None:
            return
        c = self._media_counts
        for k, spans in enumerate(media):
            for sp in sorted(spans, key=lambda s: s.offset):
                self._media.append(orjson.dumps(sp.row(first + k)) + b"\n")
                c["items"] += 1
                c["images" if sp.item.kind == IMAGE else "videos"] += 1
                c["tokens"] += sp.item.count.tokens

    def _add_flags(self, flags: np.ndarray | None, n: int) -> int:
        """Keep the "last reply only" flags of ``n`` items of the open shard (None: all 0);
        returns how many are set."""
        flags = np.zeros(n, LAST_REPLY_DTYPE) if flags is None else np.asarray(flags, dtype=LAST_REPLY_DTYPE)
        if flags.shape != (n,):
            raise ValueError(f"{flags.shape} last-reply flags for {n} items")
        self._flags.append(flags)
        return int(np.count_nonzero(flags))

    def _runs(self, lengths: np.ndarray) -> Iterator[tuple[int, int]]:
        """The items ``[i, j)`` to write into the open shard, run by run, opening a new
        shard where the rolling rule says (``lengths``: each item's tokens of capacity)."""
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        i, n = 0, len(lengths)
        while i < n:
            if self._files is None or (self._filled > 0 and self._filled + lengths[i] > self.capacity):
                self._open_shard()
            j = _fit(bounds, i, self.capacity - self._filled)
            self._filled += int(bounds[j] - bounds[i])
            yield i, j
            i = j

    def _close_all(self) -> None:
        self._close_shard()
        if not self.shards:
            self._open_shard()
            self._close_shard()


class SplitWriter(_ShardedSplit):
    """Appends episodes to a split's shards of up to ``shard_tokens`` tokens each; with
    ``media`` (a dataset prepared for a vision model's processor) every shard holds a media
    table (``format.MEDIA_FILE``, empty where it holds no item) and its counts; without, only
    a shard given a media span has one (a staging shard)."""

    FILES = (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SOURCES_FILE)

    def __init__(self, root: Path, split: str, token_dtype: np.dtype, shard_tokens: int, media: bool = False):
        super().__init__(root, split, token_dtype, shard_tokens, media)
        self.shard_tokens = self.capacity

    def _new_record(self, name: str) -> ShardInfo:
        return ShardInfo(name, 0, 0, 0)

    def _finish_record(self, files: dict) -> None:
        self.shards[-1].files = files

    def _media_done(self, counts: dict) -> None:
        self.shards[-1].media = dict(counts)

    def add_many(self, ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray, sources: np.ndarray,
                 last_only: np.ndarray | None = None, media: list | None = None) -> None:
        """Append episodes given as one concatenated ids/mask array and their lengths
        (``last_only``: each episode's flag, ``format.LAST_REPLY_FILE``; None: all 0;
        ``media``: each episode's media spans, a tuple of ``MediaSpan``, ``format.MEDIA_FILE``;
        None: none)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        sources = np.asarray(sources, dtype=np.int64)
        flags = np.zeros(lengths.shape, LAST_REPLY_DTYPE) if last_only is None else \
            np.asarray(last_only, dtype=LAST_REPLY_DTYPE)
        if ids.shape != mask.shape or int(lengths.sum()) != ids.shape[0] or sources.shape != lengths.shape \
                or flags.shape != lengths.shape or (media is not None and len(media) != lengths.shape[0]):
            raise ValueError("ids, mask, lengths, sources, last-reply flags and media spans disagree in size")
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        for i, j in self._runs(lengths):
            a, b = int(bounds[i]), int(bounds[j])
            self._add_media(None if media is None else media[i:j], self.shards[-1].episodes)
            self._write(ids[a:b], mask[a:b], lengths[i:j], sources[i:j], flags[i:j])

    def _write(self, ids, mask, lengths, sources, flags) -> None:
        cur, f = self.shards[-1], self._files
        cur.flagged += self._add_flags(flags, len(lengths))
        starts = cur.tokens + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        idx = np.empty((len(lengths), 2), dtype=IDX_DTYPE)
        idx[:, 0] = starts
        idx[:, 1] = lengths
        f[TOKENS_FILE].write(np.ascontiguousarray(ids, dtype=self.token_dtype))
        f[MASK_FILE].write(np.ascontiguousarray(mask, dtype=MASK_DTYPE))
        f[EPISODES_FILE].write(idx)
        f[SOURCES_FILE].write(np.ascontiguousarray(sources, dtype=IDX_DTYPE))
        cur.tokens += int(lengths.sum())
        cur.episodes += len(lengths)
        cur.trained_tokens += int(np.count_nonzero(mask))
        cur.stats.add(ids, mask)

    def close(self) -> dict:
        self._close_all()
        shards = [s.as_dict() for s in self.shards]
        return {
            "episodes": sum(s.episodes for s in self.shards),
            "tokens": sum(s.tokens for s in self.shards),
            "trained_tokens": sum(s.trained_tokens for s in self.shards),
            **flagged_count(shards),
            **media_count(shards),
            "shards": shards,
        }


def empty_media() -> dict:
    """The media counts of a shard, a split or a dataset holding none."""
    return {"items": 0, "images": 0, "videos": 0, "tokens": 0}


class PackedSplitWriter(_ShardedSplit):
    """Appends packed rows to a split's shards, ``shard_tokens // row_len`` rows per shard."""

    FILES = (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SEGMENTS_FILE)

    def __init__(self, root: Path, split: str, token_dtype: np.dtype, row_len: int, shard_tokens: int):
        self.row_len = int(row_len)
        self.rows_per_shard = max(1, int(shard_tokens) // self.row_len)
        super().__init__(root, split, token_dtype, self.rows_per_shard * self.row_len)

    def _new_record(self, name: str) -> dict:
        self._stats = ValueStats()
        return {"name": name, "rows": 0, "segments": 0, "tokens": 0, "trained_tokens": 0}

    def _finish_record(self, files: dict) -> None:
        self.shards[-1]["files"] = files
        self.shards[-1].update(self._stats.as_dict())

    def add_rows(self, tokens: np.ndarray, mask: np.ndarray, segments: np.ndarray,
                 last_only: np.ndarray | None = None) -> None:
        """Append rows ``tokens``/``mask`` (k, row_len) and their segments: an (s, 7)
        int64 array in ``SEGMENT_FIELDS`` order whose ``row`` is 0..k-1 (these rows),
        sorted by (row, offset); ``source`` -1 = unknown. ``last_only``: each segment's
        "last reply only" flag, its episode's (``format.LAST_REPLY_FILE``; None: all 0)."""
        k = tokens.shape[0]
        if tokens.shape != (k, self.row_len) or mask.shape != tokens.shape:
            raise ValueError(f"rows must be (k, {self.row_len}); got tokens {tokens.shape}, mask {mask.shape}")
        segments = np.asarray(segments, dtype=np.int64)
        flags = np.zeros(segments.shape[0], LAST_REPLY_DTYPE) if last_only is None else \
            np.asarray(last_only, dtype=LAST_REPLY_DTYPE)
        for i, j in self._runs(np.full(k, self.row_len, dtype=np.int64)):
            cur = self.shards[-1]
            a, b = np.searchsorted(segments[:, 0], [i, j], side="left")
            seg = segments[a:b].copy()
            seg[:, 0] += cur["rows"] - i
            real = int(seg[:, 2].sum())
            f = self._files
            idx = np.empty((j - i, 2), dtype=IDX_DTYPE)
            idx[:, 0] = (cur["rows"] + np.arange(j - i)) * self.row_len
            idx[:, 1] = self.row_len
            f[TOKENS_FILE].write(np.ascontiguousarray(tokens[i:j], dtype=self.token_dtype))
            f[MASK_FILE].write(np.ascontiguousarray(mask[i:j], dtype=MASK_DTYPE))
            f[EPISODES_FILE].write(idx)
            f[SEGMENTS_FILE].write(np.ascontiguousarray(seg).astype(IDX_DTYPE))  # -1 -> NO_SOURCE
            flagged = self._add_flags(flags[a:b], int(b - a))
            if flagged:
                cur[LAST_REPLY_KEY] = cur.get(LAST_REPLY_KEY, 0) + flagged
            cur["rows"] += j - i
            cur["segments"] += b - a
            cur["tokens"] += real
            cur["trained_tokens"] += int(np.count_nonzero(mask[i:j]))
            self._stats.add(tokens[i:j], mask[i:j])

    def close(self) -> dict:
        self._close_all()
        return {
            "rows": sum(s["rows"] for s in self.shards),
            "row_len": self.row_len,
            "segments": sum(s["segments"] for s in self.shards),
            "tokens": sum(s["tokens"] for s in self.shards),
            "trained_tokens": sum(s["trained_tokens"] for s in self.shards),
            **flagged_count(self.shards),
            "shards": self.shards,
        }


class RowSplitWriter(_ShardedSplit):
    """Appends rows of a row kind (``pairs``: prompt, chosen, rejected; ``kto``: prompt,
    completion, plus a label; ``prompts``: the prompt, plus its columns) to a split's
    shards: each row's ``ENTRIES_PER_ROW`` episodes laid contiguously, one ``sources.idx``
    entry per row, and a row never spans shards."""

    def __init__(self, root: Path, split: str, kind: str, token_dtype: np.dtype, shard_tokens: int):
        self.kind = kind
        self.per_row = ENTRIES_PER_ROW[kind]
        self.FILES = row_shard_files(kind)
        self.rows = 0  # rows written to the split so far (the row id of columns.jsonl)
        super().__init__(root, split, token_dtype, shard_tokens)

    def _new_record(self, name: str) -> dict:
        self._stats = ValueStats()
        return {"name": name, "rows": 0, "episodes": 0, "tokens": 0, "trained_tokens": 0}

    def _finish_record(self, files: dict) -> None:
        self.shards[-1]["files"] = files
        self.shards[-1].update(self._stats.as_dict())

    def add_rows(self, ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray, sources: np.ndarray,
                 labels: np.ndarray | None = None, columns: list[bytes] | None = None) -> None:
        """Append rows given as one concatenated ids/mask array, each episode's length
        (``per_row`` per row), each row's input record (``sources``), and per row its
        label (kto) or the body of its ``columns.jsonl`` line (prompts: the JSON object
        of ``columns``, bytes)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        sources = np.asarray(sources, dtype=np.int64)
        n = sources.shape[0]
        if ids.shape != mask.shape or int(lengths.sum()) != ids.shape[0] or lengths.shape != (n * self.per_row,):
            raise ValueError("ids, mask, lengths and sources disagree in size")
        if (self.kind == KIND_KTO) != (labels is not None) or (self.kind == KIND_PROMPTS) != (columns is not None):
            raise ValueError(f"a {self.kind} split takes {'labels' if self.kind == KIND_KTO else 'columns'}")
        ep_bounds = np.concatenate([[0], np.cumsum(lengths)])
        row_len = lengths.reshape(n, self.per_row).sum(axis=1)
        for i, j in self._runs(row_len):
            a, b = int(ep_bounds[i * self.per_row]), int(ep_bounds[j * self.per_row])
            cur, f = self.shards[-1], self._files
            lens = lengths[i * self.per_row:j * self.per_row]
            idx = np.empty((lens.shape[0], 2), dtype=IDX_DTYPE)
            idx[:, 0] = cur["tokens"] + np.concatenate([[0], np.cumsum(lens)[:-1]])
            idx[:, 1] = lens
            f[TOKENS_FILE].write(np.ascontiguousarray(ids[a:b], dtype=self.token_dtype))
            f[MASK_FILE].write(np.ascontiguousarray(mask[a:b], dtype=MASK_DTYPE))
            f[EPISODES_FILE].write(idx)
            f[SOURCES_FILE].write(np.ascontiguousarray(sources[i:j], dtype=IDX_DTYPE))
            if labels is not None:
                f[LABELS_FILE].write(np.ascontiguousarray(labels[i:j], dtype=LABEL_DTYPE))
            if columns is not None:
                f[COLUMNS_FILE].write(b"".join(
                    b'{"row": %d, "record": %d, "columns": %s}\n' % (self.rows + k - i, int(sources[k]), columns[k])
                    for k in range(i, j)))
            cur["rows"] += j - i
            cur["episodes"] += lens.shape[0]
            cur["tokens"] += b - a
            cur["trained_tokens"] += int(np.count_nonzero(mask[a:b]))
            self._stats.add(ids[a:b], mask[a:b])
            self.rows += j - i

    def close(self) -> dict:
        self._close_all()
        return {
            "rows": sum(s["rows"] for s in self.shards),
            "episodes": sum(s["episodes"] for s in self.shards),
            "tokens": sum(s["tokens"] for s in self.shards),
            "trained_tokens": sum(s["trained_tokens"] for s in self.shards),
            **flagged_count(self.shards),
            "shards": self.shards,
        }
