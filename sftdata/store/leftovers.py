"""What sftdata runs that died leave below a folder, and removing it (``sftdata clean``).

Three kinds of leftovers, all named by sftdata and beside a dataset folder ``NAME``:

* staging folders ``.NAME.tmp-PID-RANDOM`` (a dataset being built; ``lock``);
* lock files ``.NAME.sftdata-lock`` (the writer lock; the OS releases the lock when its
  process dies, the file stays);
* replaced datasets ``.NAME.old-RANDOM``: ``--overwrite`` moves the old dataset there
  for the moment the new one is renamed into place, then removes it; a run killed in
  that moment leaves it. It is stale once no writer holds NAME's lock and a complete
  dataset stands at NAME; when NAME is missing (the new one never arrived) it is kept,
  and the summary says to move it back. Removing it removes only the files its metadata
  lists, as ``--overwrite`` does.

A leftover is ``stale`` when its owner process is dead (its owner record names a pid of
this host that no longer runs, or runs a process started at another time), ``live`` when
its owner runs, and ``unknown`` when that cannot be told: an owner on another host, or a
staging folder without an owner record that holds anything sftdata does not write there.
Only stale ones are removed, each checked again just before; nothing else is touched,
and no symbolic link is followed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..errors import UsageError
from .lock import LOCK_SUFFIX, NO_OWNER_GRACE_S, REPLACED_INFIX, owner_state, staging_state, staging_target
from .manifest import remove_owned, survey


@dataclass
class Leftover:
    path: Path
    kind: str  # "staging" | "lock" | "replaced"
    target: Path  # the dataset folder it was for
    state: str  # "stale" | "live" | "unknown"
    owner: dict | None  # host, pid, start, created (None: no owner record)
    bytes: int
    removed: bool = False

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


def _read_record(path: Path) -> dict | None:
    try:
        data = path.read_bytes()[:4096]
        rec = orjson.loads(data) if data else None
    except (OSError, orjson.JSONDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def lock_state(path: Path) -> tuple[str, dict | None] | None:
    """The state of a lock file and its holder's record; None when the file is not one
    sftdata wrote (it holds an owner record, or nothing)."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 4096:
            return None
        empty = path.stat().st_size == 0
        young = time.time() - path.stat().st_mtime < NO_OWNER_GRACE_S
    except OSError:
        return None
    owner = _read_record(path)
    if owner is None:
        return None if not empty else ("live" if young else "stale", None)
    if not isinstance(owner.get("pid"), int):
        return None
    return owner_state(owner), owner


def replaced_target(name: str) -> str | None:
    """The target name of a replaced dataset's folder name (``.NAME.old-RANDOM``), else None."""
    head, sep, tail = name[1:].rpartition(REPLACED_INFIX)
    return head if name.startswith(".") and sep and head and tail.isalnum() else None


def replaced_state(path: Path, target: Path) -> str:
    """``live`` while a writer holds the target's lock, ``stale`` when none does and a
    complete dataset stands at the target, else ``unknown`` (the replacement never arrived:
    this may be the only copy)."""
    lock = target.parent / f".{target.name}{LOCK_SUFFIX}"
    found = lock_state(lock) if lock.exists() else None
    if found is not None and found[0] != "stale":
        return "live"
    if lock.exists() and found is None:
        return "unknown"
    return "stale" if target.is_dir() and not target.is_symlink() and survey(target).is_dataset else "unknown"


def find_leftovers(root: str | Path) -> list[Leftover]:
    """Every staging folder and lock file sftdata left below ``root`` (symbolic links are
    not followed, staging folders not entered), in path order."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder; give the folder to search for what sftdata left behind")
    out: list[Leftover] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: None):
        here = Path(dirpath)
        for name in list(dirnames):
            p = here / name
            if p.is_symlink():
                continue
            target = staging_target(name)
            if target is not None:
                dirnames.remove(name)  # its inside is the run's
                state, owner = staging_state(p)
                out.append(Leftover(p, "staging", here / target, state, owner, _size(p)))
            elif (target := replaced_target(name)) is not None:
                dirnames.remove(name)
                out.append(Leftover(p, "replaced", here / target, replaced_state(p, here / target), None, _size(p)))
        for name in filenames:
            if not (name.startswith(".") and name.endswith(LOCK_SUFFIX) and len(name) > len(LOCK_SUFFIX) + 1):
                continue
            p = here / name
            found = lock_state(p)
            if found is not None:
                out.append(Leftover(p, "lock", here / name[1:-len(LOCK_SUFFIX)], found[0], found[1],
                                    p.stat().st_size))
        dirnames.sort()
    return sorted(out, key=lambda x: str(x.path))


def _remove_lock(path: Path) -> bool:
    """Unlink a lock file nobody holds, while holding it (as a writer leaving does), so
    that a writer that opened it meanwhile notices and takes a fresh one."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # held: a live writer
    try:
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_leftover(x: Leftover) -> bool:
    """Remove ``x`` if it is still stale (checked again now); True when removed."""
    if x.kind == "staging":
        if x.path.is_symlink() or staging_state(x.path)[0] != "stale":
            return False
        shutil.rmtree(x.path, ignore_errors=True)
        return not x.path.exists()
    if x.kind == "replaced":
        if x.path.is_symlink() or replaced_state(x.path, x.target) != "stale":
            return False
        s = survey(x.path)
        return s.is_dataset and not remove_owned(s)  # anything not ours stays, with the folder
    found = lock_state(x.path)
    return found is not None and found[0] == "stale" and _remove_lock(x.path)


def clean(root: str | Path, remove: bool = False) -> CleanReport:
    """The leftovers below ``root``; with ``remove``, the stale ones are removed."""
    report = CleanReport(str(root), remove, find_leftovers(root))
    if remove:
        for x in report.leftovers:
            if x.state == "stale":
                x.removed = remove_leftover(x)
    return report
