"""Writing a dataset to object storage, where there is no atomic rename and no flock.

``DatasetWriter`` builds the dataset in a local staging folder exactly as for a local
target (same checks, same bytes); then, for an ``s3://`` (``gs://``, any fsspec) target:

1. **One writer per target**: the lock object ``bucket/sft/.v3.sftdata-lock`` (beside the
   prefix) is created with a conditional put (``If-None-Match: *``; fsspec's ``xb``
   mode) before anything else, and holds the writer's host, pid and start time. A second
   writer is refused, told who holds it (``--wait`` waits). A lock whose owner is a dead
   process of this host is stale and taken over; one from another host is never
   presumed dead. A store without conditional puts gets a check-then-put, which two
   writers starting in the same instant can both pass: the one limit left.
2. **The target is checked** as a local folder is (``manifest``): empty, or with
   ``--overwrite`` an sftdata dataset holding nothing but the objects its metadata lists.
   Objects a dead writer's lock lists (its partial upload) are sftdata's and removed.
3. **Upload**: with ``open_direct``, the tasks that write the final shards put them
   themselves (``object_upload``), once the lock records them; the coordinator then
   uploads only the rest. Otherwise the lock records the objects this run will write; then every file but
   ``dataset_metadata.json``; then ``dataset_metadata.json`` LAST: its presence commits
   the dataset, and readers refuse a prefix without it (``object_cache``).
4. ``--overwrite``: the old dataset's ``dataset_metadata.json`` is deleted *before* the
   first upload, so no reader ever pairs the old metadata with a new file; the old
   dataset's other listed objects that the new one does not reuse are deleted *after*
   the commit. Between the two the target is no dataset at all (readers refuse it), and a
   run that fails there takes the old dataset with it: object stores cannot swap two
   versions in place as a rename does. Nothing the old metadata does not list is touched.
5. A run that fails before its commit removes the objects it uploaded (and, when it was
   replacing a dataset whose metadata it had deleted, that dataset's listed objects); a
   run killed outright leaves its lock object naming them, and the next run to the
   target removes them.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson

from ..errors import DatasetError, OutputExistsError
from .lock import owner_alive, owner_record
from .manifest import METADATA_FILE, manifest_of, named, read_json
from .object_upload import DirectUpload
from .objects import credentials_error, identity, list_objects, lock_key, remote_fs

log = logging.getLogger("sftdata.store")

WAIT_POLL_S = 2.0
UPLOAD_BATCH = 16  # files put at once (an async store runs them concurrently)


class ObjectLock:
    """The lock object of one target; ``acquire`` refuses (or waits) while another owns it."""

    def __init__(self, fs, root: str, url: str):
        self.fs, self.key, self.url = fs, lock_key(root), url
        self.held = False
        self.record = owner_record()
        self.taken_over: dict | None = None  # the dead writer's record, when its lock was stale

    @property
    def where(self) -> str:
        return self.fs.unstrip_protocol(self.key)

    def acquire(self, wait: bool) -> None:
        said = False
        while not self._create():
            holder = self._read()
            if holder == {}:  # released meanwhile: try again
                continue
            if holder is not None and not owner_alive(holder):
                self.fs.rm_file(self.key)  # its owner is dead: ours now (if no one else is faster)
                self.taken_over = holder
                continue
            who = _holder(holder)
            if not wait:
                raise OutputExistsError(
                    f"another sftdata ({who}) is writing {self.url}; wait for it to finish, pass --wait to wait, or "
                    f"choose another --output-dir. If that run is dead (it ran on another machine), remove "
                    f"{self.where} and what it lists")
            if not said:
                log.warning(f"another sftdata ({who}) is writing {self.url}; waiting for it to finish (--wait)")
                said = True
            time.sleep(WAIT_POLL_S)
        self.held = True

    def _create(self) -> bool:
        data = orjson.dumps(self.record)
        try:
            with self.fs.open(self.key, "xb") as f:  # a conditional put: fails if it exists
                f.write(data)
            return True
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError, TypeError):  # no exclusive create on this store
            if self.fs.exists(self.key):
                return False
            self.fs.pipe_file(self.key, data)
            return True

    def _read(self) -> dict | None:
        try:
            rec = orjson.loads(self.fs.cat_file(self.key))
        except FileNotFoundError:
            return {}  # released meanwhile: try again
        except (orjson.JSONDecodeError, OSError):
            return None
        return rec if isinstance(rec, dict) else None

    def note(self, **fields) -> None:
        """Record more in the lock object (what this run is about to write)."""
        self.record.update(fields)
        self.fs.pipe_file(self.key, orjson.dumps(self.record))

    def release(self) -> None:
        if self.held:
            try:
                self.fs.rm_file(self.key)
            except FileNotFoundError:
                pass
            self.held = False


def _holder(rec: dict | None) -> str:
    try:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec["created"]))
        return f"host {rec['host']}, pid {rec['pid']}, started {started}"
    except Exception:  # noqa: BLE001 - a record we cannot read: say less, not fail
        return "another process"


class ObjectCommit:
    """The object-store side of ``DatasetWriter`` for a URL target (steps in the module doc)."""

    def __init__(self, url: str, *, overwrite: bool, wait: bool):
        self.url, self.overwrite, self.wait = url, overwrite, wait
        self.fs, self.root = remote_fs(url, "writing", DatasetError)
        self.lock = ObjectLock(self.fs, self.root, url)
        self.notes: list[str] = []
        self.old: list[str] = []  # the replaced dataset's objects (its metadata last)
        self.uploaded: list[str] = []
        self.old_meta_deleted = False
        self.committed = False
        self._before: dict | None = None
        self.direct: list[str] = []  # the objects the tasks put themselves (``open_direct``)

    def key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def begin(self) -> None:
        """Take the lock and check the target; raises ``OutputExistsError`` when it may not be written."""
        try:
            self.lock.acquire(self.wait)  # the first request: no credentials is one line here
        except Exception as e:
            err = credentials_error(self.url, e, DatasetError)
            if err is None:
                raise
            raise err from None
        try:
            self._check()
        except BaseException:
            self.lock.release()
            raise

    def _check(self) -> None:
        objects = list_objects(self.fs, self.root)
        dead = self.lock.taken_over or {}
        partial = set(dead.get("writing") or ()) & set(objects)
        if partial:  # a dead run's objects: sftdata's, and no dataset without its metadata
            listed = self._listed(objects)
            if listed is None:
                self._remove(sorted(partial))
                self.notes.append(f"removed {len(partial)} object(s) of {self.url} left by a run that died before "
                                  f"its commit (pid {dead.get('pid')}): {named(sorted(partial))}")
                objects = list_objects(self.fs, self.root)
        if objects and not self.overwrite:
            raise OutputExistsError(f"{self.url} already exists ({len(objects)} object(s)); pass --overwrite to "
                                    f"replace it, or choose another --output-dir")
        if objects:
            listed = self._listed(objects)
            foreign = [o for o in objects if listed is None or o not in listed]
            if listed is None:
                why = (f"no {METADATA_FILE}" if METADATA_FILE not in objects else
                       f"its {METADATA_FILE} is not an sftdata dataset's, or lists objects that are missing")
                raise OutputExistsError(
                    f"{self.url} is not an sftdata dataset ({why}): --overwrite replaces only a dataset, never other "
                    f"objects (they would be deleted). It holds: {named(foreign)}. Choose another --output-dir, or "
                    f"remove them yourself")
            if foreign:
                raise OutputExistsError(
                    f"{self.url} holds objects sftdata did not write: {named(foreign)}. --overwrite removes only a "
                    f"dataset's own objects; move those away (or choose another --output-dir) and run again")
            self.old = sorted(listed, key=lambda o: o == METADATA_FILE)
        self._before = {k: identity(v) for k, v in objects.items()}

    def _listed(self, objects: dict) -> set[str] | None:
        """The objects the target's metadata lists, when it is an sftdata dataset whose
        listed objects are all there; else None."""
        if METADATA_FILE not in objects:
            return None
        try:
            raw = self.fs.cat_file(self.key(METADATA_FILE))
            listed = manifest_of(orjson.loads(raw))
        except (OSError, orjson.JSONDecodeError):
            return None
        if listed is None or any(f not in objects for f in listed[0]):
            return None
        return set(listed[0])

    def _unchanged(self) -> None:
        """Refuse a target that changed since ``begin`` (the objects the tasks put, and the
        old metadata this run deleted, aside)."""
        direct = set(self.direct)
        now = {k: identity(v) for k, v in list_objects(self.fs, self.root).items() if k not in direct}
        before = {k: v for k, v in (self._before or {}).items()
                  if k not in direct and not (self.old_meta_deleted and k == METADATA_FILE)}
        if now != before:
            raise OutputExistsError(
                f"{self.url} {'changed' if self._before else 'appeared'} while this run was writing it, so nothing "
                f"more was uploaded and it was left as it is; run again (with --overwrite to replace it)")

    def _start_writing(self, files: list[str]) -> None:
        """Before the first object is put: the lock object lists every object this run may
        write, and an old dataset's metadata is deleted (from here it is no dataset: no
        reader pairs its metadata with a new file)."""
        self.lock.note(writing=sorted(set(files) | set(self.direct) | set(self.old) | {METADATA_FILE}))
        if self.old and not self.old_meta_deleted:
            self.fs.rm_file(self.key(METADATA_FILE))
            self.old_meta_deleted = True

    def open_direct(self, planned: list[str]) -> DirectUpload:
        """Let the tasks put the objects ``planned`` (paths relative to the dataset)
        themselves (``object_upload``): the target checked, the lock object listing them,
        an old dataset's metadata deleted, before the first task puts one. A later call
        names objects the tasks have put besides (a shard's ``last_reply.bin``, written only
        where the shard holds a flagged episode): they join the run's, unchecked."""
        if not self.direct:
            self._unchanged()
        self.direct = sorted(set(self.direct) | set(planned))
        self._start_writing([])
        return DirectUpload(self.url)

    def upload(self, staging: Path) -> None:
        """Upload the finished dataset in ``staging``, ``dataset_metadata.json`` last; the
        objects the tasks put (``open_direct``) are not uploaded again, and must be there."""
        self._unchanged()
        files = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
        files = [f for f in files if f != METADATA_FILE and f not in set(self.direct)]
        read_json(staging / METADATA_FILE)  # the commit object is whole before anything is sent
        if self.direct:
            there = set(list_objects(self.fs, self.root))
            missing = [o for o in self.direct if o not in there]
            if missing:
                raise DatasetError(f"{self.url}: {len(missing)} object(s) the tasks put are missing ({named(missing)}); "
                                   f"nothing was committed; run again")
        self._start_writing(files)
        for i in range(0, len(files), UPLOAD_BATCH):
            batch = files[i:i + UPLOAD_BATCH]
            put_files(self.fs, [str(staging / f) for f in batch], [self.key(f) for f in batch])
            self.uploaded += batch
        put_commit(self.fs, str(staging / METADATA_FILE), self.key(METADATA_FILE))
        self.committed = True
        new = set(files) | set(self.direct)
        stale = [o for o in self.old if o not in new and o != METADATA_FILE]
        self._remove(stale)  # the replaced dataset's objects the new one does not reuse
        self.lock.release()

    def abort(self) -> None:
        """A run that stops before its commit: remove what it uploaded (and the replaced
        dataset's objects once its metadata is gone), release the lock."""
        if self.committed or not self.lock.held:
            self.lock.release()
            return
        gone = set(self.uploaded) | (set(self.old) if self.old_meta_deleted else set())
        if self.direct:  # what the tasks put (those that stopped before their upload put nothing)
            gone |= set(self.direct) & set(list_objects(self.fs, self.root))
        gone = sorted(gone)
        try:
            self._remove(gone)
        finally:
            self.lock.release()
        if self.old_meta_deleted:
            log.warning(f"{self.url}: the run stopped after it had removed the replaced dataset's "
                        f"{METADATA_FILE}; that dataset's objects were removed too, and nothing is left there")

    def _remove(self, rels: list[str]) -> None:
        if rels:
            self.fs.rm([self.key(r) for r in rels])


def put_files(fs, local: list[str], remote: list[str]) -> None:
    """Upload ``local`` files to ``remote`` keys (concurrently on an async store)."""
    fs.put(local, remote)


def put_commit(fs, local: str, remote: str) -> None:
    """Upload the commit object, the last one (a separate step: tests stop a run here)."""
    fs.put_file(local, remote)
