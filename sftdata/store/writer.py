"""Atomic dataset writing: a temporary folder beside the target, renamed on commit."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from ..errors import OutputExistsError
from ..util.hashing import sha256_file
from ..util.oserrors import naming
from .format import (
    COLUMNS_FILE,
    DEFAULT_SHARD_TOKENS,
    ENTRIES_PER_ROW,
    EPISODES_FILE,
    FORMAT_NAME,
    IDX_DTYPE,
    KIND_EPISODES,
    KIND_KTO,
    KIND_PROMPTS,
    LABEL_DTYPE,
    LABELS_FILE,
    LAST_REPLY_DTYPE,
    LAST_REPLY_FILE,
    LAST_REPLY_KEY,
    MASK_DTYPE,
    MASK_FILE,
    METADATA_CHECKSUM,
    METADATA_CHECKSUM_VERSION,
    METADATA_FILE,
    SEGMENTS_FILE,
    SOURCES_FILE,
    TOKENS_FILE,
    dumps_json,
    flagged_count,
    format_version_for,
    has_last_reply_flags,
    metadata_sha256,
    row_shard_files,
    shard_name,
)
from .fsops import OUTPUT_DIR_FIX, exchange, make_folder, refuse_link, rename_noreplace
from .leftovers import remove_replaced, sweep
from .location import local_path, remote_url
from .lock import WriterLock, make_staging, release_staging, replaced_name, target_of, write_folder_record
from .manifest import check_replaceable, named, signature, survey
from .object_commit import ObjectCommit
from .object_upload import DirectUpload
from .objects import upload_home

log = logging.getLogger("sftdata.store")


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

    def as_dict(self) -> dict:
        flagged = {LAST_REPLY_KEY: self.flagged} if self.flagged else {}  # absent: none (as in older datasets)
        return {"name": self.name, "episodes": self.episodes, "tokens": self.tokens,
                "trained_tokens": self.trained_tokens, "files": self.files, **flagged, **self.stats.as_dict()}


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

    def __init__(self, root: Path, split: str, token_dtype: np.dtype, capacity: int):
        self.dir = root / split
        self.split = split
        self.token_dtype = np.dtype(token_dtype)
        self.capacity = int(capacity)
        self.shards: list = []
        self._files: dict[str, _HashedFile] | None = None
        self._filled = 0  # tokens of capacity the open shard holds
        self._flags: list[np.ndarray] = []  # the open shard's "last reply only" flags, one per item

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

    def _close_shard(self) -> None:
        if self._files is not None:
            files = {fn: f.close() for fn, f in self._files.items()}
            if any(f.any() for f in self._flags):  # only a shard holding a flagged item has the file
                f = _HashedFile(self.dir / shard_name(len(self.shards) - 1) / LAST_REPLY_FILE)
                f.write(np.ascontiguousarray(np.concatenate(self._flags), dtype=LAST_REPLY_DTYPE))
                files[LAST_REPLY_FILE] = f.close()
            self._finish_record(files)
            self._files, self._flags = None, []

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
    """Appends episodes to a split's shards of up to ``shard_tokens`` tokens each."""

    FILES = (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SOURCES_FILE)

    def __init__(self, root: Path, split: str, token_dtype: np.dtype, shard_tokens: int):
        super().__init__(root, split, token_dtype, shard_tokens)
        self.shard_tokens = self.capacity

    def _new_record(self, name: str) -> ShardInfo:
        return ShardInfo(name, 0, 0, 0)

    def _finish_record(self, files: dict) -> None:
        self.shards[-1].files = files

    def add_many(self, ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray, sources: np.ndarray,
                 last_only: np.ndarray | None = None) -> None:
        """Append episodes given as one concatenated ids/mask array and their lengths
        (``last_only``: each episode's flag, ``format.LAST_REPLY_FILE``; None: all 0)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        sources = np.asarray(sources, dtype=np.int64)
        flags = np.zeros(lengths.shape, LAST_REPLY_DTYPE) if last_only is None else \
            np.asarray(last_only, dtype=LAST_REPLY_DTYPE)
        if ids.shape != mask.shape or int(lengths.sum()) != ids.shape[0] or sources.shape != lengths.shape \
                or flags.shape != lengths.shape:
            raise ValueError("ids, mask, lengths, sources and last-reply flags disagree in size")
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        for i, j in self._runs(lengths):
            a, b = int(bounds[i]), int(bounds[j])
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
            "shards": shards,
        }


def _swept(target: Path, lock: WriterLock) -> str | None:
    """What runs to ``target`` that died left beside it, removed under ``lock`` (held);
    the note that says so, or None when nothing was there."""
    swept = sweep(target, lock.previous, lock.uid)
    for name in swept:
        lock.forget_folder(name)
    if not swept:
        return None
    return f"removed {len(swept)} stale staging folder(s) of {target} left by runs that died: {named(swept)}"


def sweep_beside(target: str | Path) -> list[str]:
    """For a run that finds ``target`` up to date and writes nothing: what runs to it that
    died left beside it (a killed run's staging folder, a replaced dataset) removed all the
    same, as a writing run does on its way in: only what is proved sftdata's (an owner
    record, a dead run's journal) and whose owner is dead. Nothing is done while another
    run writes the target (it holds the lock), nor where the lock cannot be taken (a
    folder this user cannot write: an up-to-date run needs no write). Returns the notes
    (each also logged as a warning)."""
    if remote_url(target) is not None:
        return []
    target = local_path(target)
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    if not any(target_of(n) == target.name for n in names):
        return []  # nothing a run could have left: not even the lock is taken
    try:
        with WriterLock(target) as lock:
            note = _swept(target, lock)
    except (OutputExistsError, OSError):
        return []
    if note is None:
        return []
    log.warning(note)
    return [note]


class DatasetWriter:
    """Context manager that builds a dataset in a staging folder beside the target and
    renames it into place on ``commit``. Leaving the block without ``commit`` (an
    exception, Ctrl-C) removes the staging folder; the target is untouched.

    Safety, whatever the flags:
    - one writer per target (:class:`WriterLock`; ``wait`` waits for the other one);
    - nothing is written through a link: a target that is a symbolic link is refused up
      front, naming it and what it points to; every name created beside it is new
      (:mod:`.fsops`), and every folder created there is journaled in the lock first, then
      carries its owner record (:mod:`.lock`), so a run killed at any instant leaves
      nothing that ``sftdata clean`` cannot prove sftdata's and remove;
    - ``overwrite`` replaces only an empty folder or a dataset holding nothing but the
      files its metadata lists: the new one is swapped in in one step (the target always
      holds a whole dataset), and the replaced one is removed from the staging folder's
      name, the files its metadata lists first and the metadata last;
    - a target that appeared or changed while the run was writing is left alone: the
      finished dataset is kept beside it, in a folder the error names;
    - stale staging folders of this target (their owner process is dead) are removed,
      and said so in ``notes``.

    An object-store target (``s3://bucket/sft``, any fsspec URL but ``file://``) is built
    the same way in a local staging folder (``objects.upload_home``), then uploaded with
    its metadata last (:mod:`.object_commit`: lock object, checks, commit order).
    """

    def __init__(self, target: str | Path, *, overwrite: bool = False, wait: bool = False):
        self.url = remote_url(target)
        self.remote = ObjectCommit(self.url, overwrite=overwrite, wait=wait) if self.url else None
        # a local target; for a URL, the local place its staging folder is made beside
        self.target = local_path(target) if self.url is None else upload_home(self.url)
        self.overwrite = overwrite
        self.wait = wait
        self.tmp: Path | None = None
        self.notes: list[str] = []  # what was done beside the dataset, for the summary
        self._committed = False
        self._lock: WriterLock | None = None
        self._before: tuple | None = None

    def __enter__(self) -> DatasetWriter:
        if self.remote is None:
            return self._enter()
        self.remote.begin()  # the lock object, and the target's checks
        for note in self.remote.notes:
            self._note(note)
        try:
            return self._enter()
        except BaseException:
            self.remote.abort()
            raise

    def _enter(self) -> DatasetWriter:
        refuse_link(self.target, OUTPUT_DIR_FIX)
        if self.target.exists() and not self.target.is_dir():
            raise OutputExistsError(f"{self.target} exists and is not a folder; remove it or choose "
                                    f"another --output-dir")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._lock = WriterLock(self.target, wait=self.wait).__enter__()
        try:
            refuse_link(self.target, OUTPUT_DIR_FIX)
            if self.target.exists() and not self.overwrite:
                raise OutputExistsError(f"{self.target} already exists; pass --overwrite to replace it, "
                                        f"or choose another --output-dir")
            if self.target.exists():
                check_replaceable(self.target)
            self._sweep()
            self._before = signature(self.target)
            self.tmp = make_staging(self._lock)
        except BaseException:
            self._release()
            raise
        return self

    def _sweep(self) -> None:
        """Remove what runs to this target that died left beside it (stale staging folders,
        replaced datasets), proved sftdata's by their records or the dead run's journal."""
        note = _swept(self.target, self._lock)
        if note:
            self._note(note)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if not self._committed and self.tmp is not None and os.path.lexists(self.tmp):
                shutil.rmtree(self.tmp, ignore_errors=True)  # the lock's journal keeps it proved if this fails
        finally:
            try:
                if self.remote is not None:
                    self.remote.abort()
            finally:
                self._release()

    def _note(self, message: str) -> None:
        """Something done beside the dataset: kept for the caller, and logged (the CLI
        prints the library's warnings as one ``warning:`` line on stderr)."""
        self.notes.append(message)
        log.warning(message)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None

    @property
    def path(self) -> Path:
        if self.tmp is None:
            raise RuntimeError("use DatasetWriter as a context manager")
        return self.tmp

    def split(self, name: str, token_dtype: np.dtype, shard_tokens: int = DEFAULT_SHARD_TOKENS) -> SplitWriter:
        return SplitWriter(self.path, name, token_dtype, shard_tokens)

    def packed_split(self, name: str, token_dtype: np.dtype, row_len: int,
                     shard_tokens: int = DEFAULT_SHARD_TOKENS) -> PackedSplitWriter:
        return PackedSplitWriter(self.path, name, token_dtype, row_len, shard_tokens)

    def row_split(self, name: str, kind: str, token_dtype: np.dtype,
                  shard_tokens: int = DEFAULT_SHARD_TOKENS) -> RowSplitWriter:
        return RowSplitWriter(self.path, name, kind, token_dtype, shard_tokens)

    def direct_upload(self, planned: list[str]) -> DirectUpload | None:
        """An object-store target: let the tasks put the files ``planned`` (paths in the
        dataset) straight into it (``object_upload``); ``commit`` then uploads only the
        rest. None for a local target (the tasks write into ``path``)."""
        return None if self.remote is None else self.remote.open_direct(planned)

    def write_json(self, relname: str, obj) -> None:
        with naming(self.path / relname):
            (self.path / relname).write_bytes(dumps_json(obj))

    def commit(self, metadata: dict) -> Path:
        """Write ``dataset_metadata.json`` (with sha256 of the top-level files, and of
        itself: ``METADATA_CHECKSUM``) last, then move the folder into place: renamed to a
        missing target; swapped with the dataset it replaces in one step, which is then
        removed from the staging folder's name, manifest last."""
        release_staging(self.path)
        files = {}
        for p in sorted(self.path.iterdir()):
            if p.is_file() and p.name != METADATA_FILE:
                files[p.name] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
        # 2 for pairs, kto, prompts; 3 where an episode is flagged "last reply only"
        version = format_version_for(metadata.get("kind", KIND_EPISODES), has_last_reply_flags(metadata))
        meta = {"format": FORMAT_NAME, "format_version": version, **metadata, "files": files}
        meta = orjson.loads(dumps_json(meta))  # hashed as a reader parses it (numpy values become plain)
        meta[METADATA_CHECKSUM] = {"version": METADATA_CHECKSUM_VERSION, "sha256": metadata_sha256(meta)}
        with naming(self.path / METADATA_FILE):
            (self.path / METADATA_FILE).write_bytes(dumps_json(meta))
        if self.remote is not None:
            self.remote.upload(self.path)  # every file, then the metadata: the commit
            shutil.rmtree(self.path, ignore_errors=True)
            self._committed = True
            return self.target
        if signature(self.target) != self._before:
            self._keep_beside(self._before is None)
        old = None
        if self._before is not None:
            old = self._swap_in()
        else:
            try:
                rename_noreplace(self.path, self.target)
            except FileExistsError:  # it appeared after the signature was taken
                self._keep_beside(True)
        self._committed = True
        if old is not None:
            self._remove_replaced(old)
        return self.target

    def _keep_beside(self, appeared: bool) -> None:
        kept = _free_rename(self.path, self.target.parent,
                            f"{self.target.name}.sftdata-new-{time.strftime('%Y%m%d-%H%M%S')}")
        self._committed = True
        raise OutputExistsError(
            f"{self.target} {'appeared' if appeared else 'changed'} while this run was writing it, so it was left "
            f"as it is. The finished dataset is in {kept}: compare the two, then move it into place yourself (or "
            f"run again with another --output-dir)")

    def _swap_in(self) -> Path:
        """Put the new dataset at the target and return where the replaced one now is: the
        staging folder's name (swapped in one step), or, where the system cannot swap, a
        journaled ``.NAME.old-RANDOM`` (then the target is missing for an instant)."""
        self._lock.note_folder(self.path.name, "old")  # what it holds from the swap on
        if exchange(self.path, self.target):
            return self.path
        self._lock.note_folder(self.path.name, "new")  # no swap here: it still holds the new dataset
        old = None
        for _ in range(100):
            name = replaced_name(self.target.name)
            if os.path.lexists(self.target.parent / name):
                continue
            self._lock.note_folder(name, "old")
            try:
                rename_noreplace(self.target, self.target.parent / name)
            except FileExistsError:
                self._lock.forget_folder(name)
                continue
            old = self.target.parent / name
            break
        if old is None:
            raise OutputExistsError(f"no free name beside {self.target} to move the replaced dataset to; remove the "
                                    f".{self.target.name}.old-* entries sftdata did not make")
        try:
            rename_noreplace(self.path, self.target)
        except BaseException:  # the new dataset did not arrive: the old one goes back
            rename_noreplace(old, self.target)
            raise
        return old

    def _remove_replaced(self, old: Path) -> None:
        """Remove the replaced dataset at ``old`` (sftdata's: journaled, then with its owner
        record), manifest last. What is not its own keeps it, visibly beside the target. The
        new dataset is committed whatever happens here: a failure is a note, never an error."""
        try:
            s = survey(old) if old.is_dir() and not old.is_symlink() else None
            if s is None or s.foreign or not (s.is_dataset or s.empty):
                kept = _free_rename(old, self.target.parent,
                                    f"{self.target.name}.sftdata-old-{time.strftime('%Y%m%d-%H%M%S')}")
                self._note(f"the replaced dataset held files sftdata did not write "
                           f"({named(s.foreign) if s is not None else 'it is not a folder'}); they are kept in {kept}")
                return
            write_folder_record(old, self.target.name, "replaced")
            left = remove_replaced(old)
            if left:
                self._note(f"the replaced dataset in {old} could not be removed whole (left: {named(left)}); "
                           f"`sftdata clean {self.target.parent}` removes what is sftdata's")
        except OSError as e:
            self._note(f"the replaced dataset in {old} could not be removed ({e.strerror or e}); "
                       f"`sftdata clean {self.target.parent}` removes it")


def _free_rename(src: Path, folder: Path, name: str) -> Path:
    """Rename ``src`` to ``folder/name``, or ``name-2``, ``name-3``, ... whichever is free
    (nothing there is ever replaced)."""
    k = 1
    while True:
        dest = folder / (name if k == 1 else f"{name}-{k}")
        try:
            rename_noreplace(src, dest)
            return dest
        except FileExistsError:
            k += 1


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
