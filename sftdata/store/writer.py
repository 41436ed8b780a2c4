"""Atomic dataset writing: a temporary folder beside the target, renamed on commit."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import orjson

from ..errors import OutputExistsError
from ..storage import FORMAT_NAME, METADATA_FILE
from ..storage.fsops import OUTPUT_DIR_FIX, exchange, refuse_link, rename_noreplace
from ..storage.leftovers import remove_replaced, sweep
from ..storage.location import local_path, remote_url
from ..storage.lock import WriterLock, make_staging, release_staging, replaced_name, target_of, write_folder_record
from ..storage.manifest import check_replaceable, named, signature, survey
from ..storage.object_commit import ObjectCommit
from ..storage.object_upload import DirectUpload
from ..storage.objects import upload_home
from ..util.hashing import sha256_file
from ..util.oserrors import naming
from .format import (
    DEFAULT_SHARD_TOKENS,
    KIND_EPISODES,
    METADATA_CHECKSUM,
    METADATA_CHECKSUM_VERSION,
    dumps_json,
    format_version_for,
    has_last_reply_flags,
    has_media,
    metadata_sha256,
)
from .split_writer import PackedSplitWriter, RowSplitWriter, SplitWriter

log = logging.getLogger("sftdata.store")


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
        version = format_version_for(metadata.get("kind", KIND_EPISODES), has_last_reply_flags(metadata),
                                     has_media(metadata))
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


