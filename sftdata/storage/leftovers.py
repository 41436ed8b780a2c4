"""What sftdata runs that died leave below a folder, and removing it (``sftdata clean``, and
the next run to the same target).

Ownership is by record, never by name (``lock``): beside a dataset folder ``NAME``,

* a staging folder ``.NAME.tmp-PID-RANDOM`` is sftdata's when it holds an owner record
  (``.sftdata-staging.json``) of ``kind`` ``staging`` (a dataset being built) or
  ``replaced`` (the dataset ``--overwrite`` swapped out, being removed), or when the
  journal of a lock file sftdata left there names it (the instants before a folder's own
  record exists, or after it is released);
* a lock file ``.NAME.sftdata-lock`` is sftdata's when it is a plain file holding an owner
  record, or nothing (the OS releases the lock when its process dies; the file stays);
* where ``renameat2`` is missing, ``.NAME.old-RANDOM`` holds the replaced dataset, proved
  sftdata's the same way.

Anything else is the user's, whatever its name (``.exp.tmp-2024-05``, a backup
``.chat_sft.old-v1``, a folder left by an sftdata older than owner records): never
listed, never removed.

A leftover is ``stale`` when its owner process is dead (its record names a pid of this
host that no longer runs, or runs a process started at another time), ``live`` when its
owner runs, and ``unknown`` when that cannot be told (an owner on another host). A
replaced dataset is stale only once a complete dataset stands at ``NAME``; when ``NAME``
is missing it may be the only copy: ``unknown``, kept, and the summary says how to move
it back. Only stale ones are removed, each checked again just before; a staging folder
whole, a replaced dataset by its manifest (the files it lists, then their folders, then
the manifest itself, then the owner record: a half-removed one is recognised and
finished); a lock file last, once no folder its journal names is left. No symbolic link
is followed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DatasetError, UsageError
from .fsops import remove_listed
from .lock import (
    LOCK_SUFFIX,
    MAX_RECORD_BYTES,
    OWNER_FILE,
    folder_owner,
    journal_owns,
    owner_state,
    parse_record,
    target_of,
)
from .manifest import METADATA_FILE, manifest_of, read_json, survey, walk


@dataclass
class Leftover:
    path: Path
    kind: str  # "staging" | "lock" | "replaced"
    target: Path  # the dataset folder it was for
    state: str  # "stale" | "live" | "unknown"
    owner: dict | None  # host, pid, start, created (None: an empty lock file)
    bytes: int
    removed: bool = False
    lock_uid: int | None = None  # a lock: its file's owner (whose journal it is)

    def as_dict(self) -> dict:
        o = self.owner or {}
        created = o.get("created")
        return {"path": str(self.path), "kind": self.kind, "target": str(self.target), "state": self.state,
                "pid": o.get("pid"), "host": o.get("host"),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(created))
                if isinstance(created, (int, float)) else None,
                "bytes": self.bytes, "removed": self.removed}


@dataclass
class CleanReport:
    root: str
    remove: bool  # stale leftovers were removed (else only listed)
    leftovers: list[Leftover] = field(default_factory=list)

    def of_state(self, state: str) -> list[Leftover]:
        return [x for x in self.leftovers if x.state == state]

    @property
    def freed_bytes(self) -> int:
        return sum(x.bytes for x in self.leftovers if x.removed)

    def as_dict(self) -> dict:
        stale = self.of_state("stale")
        return {"dir": self.root, "removed": self.remove, "stale": len(stale),
                "stale_bytes": sum(x.bytes for x in stale), "freed_bytes": self.freed_bytes,
                "live": len(self.of_state("live")), "unknown": len(self.of_state("unknown")),
                "leftovers": [x.as_dict() for x in self.leftovers]}


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def lock_target(name: str) -> str | None:
    """The target name of a lock file's name (``.NAME.sftdata-lock``), else None."""
    ok = name.startswith(".") and name.endswith(LOCK_SUFFIX) and len(name) > len(LOCK_SUFFIX) + 1
    return name[1:-len(LOCK_SUFFIX)] if ok else None


def lock_state(path: Path) -> tuple[str, dict | None, int] | None:
    """The state of a lock file, its holder's record (None: empty) and the file's owner
    uid; None when the file is not one sftdata wrote (a link, not a plain file, other
    content). An empty one (its run died before writing its record) is stale when nobody
    holds it."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > MAX_RECORD_BYTES:
        return None
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:
            rec = parse_record(f.read(MAX_RECORD_BYTES))
    except OSError:
        return None
    if rec is None:
        return None
    if not rec:  # empty (or zeros): its run died before writing its record
        return ("live" if _held(path) else "stale"), None, st.st_uid
    return owner_state(rec), rec, st.st_uid


def _held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def complete(target: Path) -> bool:
    """Whether a whole dataset stands at ``target`` (a folder, not a link)."""
    return target.is_dir() and not target.is_symlink() and survey(target).is_dataset


def judge(kind: str, owner: dict | None, path: Path, target: Path) -> str:
    """The state of a staging or replaced folder whose owner record is ``owner``."""
    state = owner_state(owner) if owner is not None else "unknown"
    if kind == "replaced" and state == "stale":
        if not complete(target):
            return "unknown"  # the replacement never arrived: this may be the only copy
        if not os.path.isfile(path / METADATA_FILE) and set(os.listdir(path)) - {OWNER_FILE}:
            return "unknown"  # its own files are gone; what is left is not sftdata's
    return state


def classify(here: Path, name: str, journals: dict[str, tuple[str, Leftover]]) -> Leftover | None:
    """The leftover folder ``here/name`` when sftdata provably made it (its own owner record,
    or the journal of a lock in ``journals``: folder name -> (holds, that lock)); else None."""
    path = here / name
    target_name = target_of(name)
    if target_name is None or path.is_symlink():
        return None
    target = here / target_name
    rec = folder_owner(path, target_name)
    if rec is not None:
        kind = "replaced" if rec.get("kind") == "replaced" else "staging"
    elif name in journals:
        holds, lock = journals[name]
        rec, kind = lock.owner, ("replaced" if holds == "old" else "staging")
    else:
        return None
    return Leftover(path, kind, target, judge(kind, rec, path, target), rec, _size(path))


def journal_of(lock: Leftover) -> dict[str, tuple[str, Leftover]]:
    """The folders beside ``lock`` that its journal proves sftdata's: name -> (holds, lock)."""
    out = {}
    folders = (lock.owner or {}).get("folders")
    for name in folders if isinstance(folders, dict) else ():
        holds = journal_owns(lock.owner, lock.lock_uid, lock.path.parent / str(name))
        if holds is not None:
            out[str(name)] = (holds, lock)
    return out


def _lock_leftover(path: Path) -> Leftover | None:
    target = lock_target(path.name)
    found = lock_state(path) if target is not None else None
    if found is None:
        return None
    state, rec, uid = found
    return Leftover(path, "lock", path.parent / target, state, rec, path.lstat().st_size, lock_uid=uid)


def find_leftovers(root: str | Path) -> list[Leftover]:
    """Every staging folder, replaced dataset and lock file sftdata left below ``root``
    (symbolic links are not followed, sftdata's folders not entered), in path order."""
    root = Path(root)
    if root.is_symlink():
        raise UsageError(f"{root} is a symbolic link (to {os.readlink(root)}); sftdata never removes through a "
                         f"link: give the folder it points to")
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder; give the folder to search for what sftdata left behind")
    out: list[Leftover] = []
    for dirpath, dirnames, filenames in walk(root):
        here = Path(dirpath)
        journals: dict[str, tuple[str, Leftover]] = {}
        for name in sorted(filenames):
            lock = _lock_leftover(here / name)
            if lock is not None:
                out.append(lock)
                journals.update(journal_of(lock))
        for name in list(dirnames):
            x = classify(here, name, journals)
            if x is not None:
                dirnames.remove(name)  # its inside is the run's
                out.append(x)
        dirnames.sort()
    return sorted(out, key=lambda x: str(x.path))


def sweep(target: Path, lock_record: dict | None, lock_uid: int | None) -> list[str]:
    """Remove the stale folders sftdata left beside ``target`` (proved by their own records,
    or by ``lock_record``: the journal a dead writer left in the lock file of user
    ``lock_uid``, which this run now holds); returns their names."""
    lock = Leftover(target.parent / f".{target.name}{LOCK_SUFFIX}", "lock", target,
                    owner_state(lock_record) if lock_record else "unknown", lock_record, 0, lock_uid=lock_uid)
    journals = journal_of(lock)
    try:
        names = sorted(os.listdir(target.parent))
    except OSError:
        return []
    removed = []
    for name in names:
        x = classify(target.parent, name, journals) if target_of(name) == target.name else None
        if x is not None and x.state == "stale" and remove_leftover(x, journals):
            removed.append(name)
    return removed


def replaced_files(path: Path) -> tuple[list[str], list[str]]:
    """The files and folders a replaced dataset's manifest lists (nothing when it is gone,
    as it is once everything else was removed)."""
    if not (path / METADATA_FILE).is_file() or (path / METADATA_FILE).is_symlink():
        return [], []
    try:
        listed = manifest_of(read_json(path / METADATA_FILE))
    except (DatasetError, OSError):
        return [], []
    return listed if listed is not None else ([], [])


def remove_replaced(path: Path) -> list[str]:
    """Remove a replaced dataset sftdata owns at ``path``, whole or half-removed: the files
    its manifest lists, their folders, the manifest, then the owner record and the folder.
    Returns what is left: what sftdata did not write stays, with the folder and its record
    (so that ``clean`` goes on showing it)."""
    files, folders = replaced_files(path)
    left = remove_listed(path, files, folders, last=(METADATA_FILE,))
    if left == [OWNER_FILE]:
        left = remove_listed(path, [], [], last=(OWNER_FILE,))
    return left


def remove_leftover(x: Leftover, journals: dict[str, tuple[str, Leftover]] | None = None) -> bool:
    """Remove ``x`` if it is still stale (checked again now); True when removed."""
    if x.kind == "lock":
        return _remove_lock(x)
    again = classify(x.path.parent, x.path.name, journals or {})
    if again is None or again.kind != x.kind or again.state != "stale":
        return False
    if x.kind == "staging":
        shutil.rmtree(x.path, ignore_errors=True)  # never follows a link (fd-based)
        return not os.path.lexists(x.path)
    return not remove_replaced(x.path)


def _remove_lock(x: Leftover) -> bool:
    """Unlink a lock file nobody holds and whose journal names no folder that is left,
    while holding it (as a writer leaving does), so that a writer that opened it meanwhile
    notices and takes a fresh one."""
    try:
        fd = os.open(x.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # held: a live writer
    try:  # held by us now: stale when its record (if any) names a dead owner and no folder is left
        st = os.fstat(fd)
        rec = parse_record(os.pread(fd, MAX_RECORD_BYTES, 0)) if st.st_size <= MAX_RECORD_BYTES else None
        if rec is None or (rec and owner_state(rec) != "stale") or st.st_ino != os.lstat(x.path).st_ino:
            return False
        if journal_of(Leftover(x.path, "lock", x.target, "stale", rec or None, 0, lock_uid=st.st_uid)):
            return False
        os.unlink(x.path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def clean(root: str | Path, remove: bool = False) -> CleanReport:
    """The leftovers below ``root``; with ``remove``, the stale ones are removed (folders
    first, then the lock files whose journals named them)."""
    report = CleanReport(str(root), remove, find_leftovers(root))
    if remove:
        locks = [x for x in report.leftovers if x.kind == "lock"]
        journals: dict[Path, dict] = {}
        for lock in locks:
            journals.setdefault(lock.path.parent, {}).update(journal_of(lock))
        for x in report.leftovers:
            if x.state == "stale" and x.kind != "lock":
                x.removed = remove_leftover(x, journals.get(x.path.parent))
        for x in locks:
            if x.state == "stale":
                x.removed = remove_leftover(x)
    return report
