"""One writer per target, and owner records: how sftdata proves a folder beside a target is
its own. Ownership is by record, never by name: a folder named like sftdata's without a
record sftdata wrote is the user's, whatever its name.

- The writer lock is an advisory ``flock`` on ``.NAME.sftdata-lock`` beside the target:
  the operating system releases it when the process dies, whatever kills it. A second
  writer is refused at once (or waits, with ``wait=True``), told which process holds it.
  The lock file is opened without following a link (a link there is refused, naming it),
  must be a plain file sftdata wrote (empty, or an owner record) and is written in one
  ``pwrite`` of a padded record, so it always holds a whole record.
- The lock's record is also the writer's journal: before it creates a folder beside the
  target (its staging folder ``.NAME.tmp-PID-RANDOM``; where ``renameat2`` is missing, the
  replaced dataset's ``.NAME.old-RANDOM``) it writes that folder's name there. A run killed
  at any instant therefore leaves every folder it made provably its own: by the folder's
  own record, or, in the instants before that record exists, by the dead lock's journal.
- A staging folder holds ``.sftdata-staging.json``: host, pid, the process's start time,
  the target's name and ``kind`` (``staging`` while the dataset is built; ``replaced`` once
  ``--overwrite`` has swapped the old dataset into it, to be removed, manifest last). Its
  owner is dead (no such pid on this host, or the pid now belongs to a process started
  at another time): the next run to that target, or ``sftdata clean``, removes it. A live
  one is never touched.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import time
import uuid
from pathlib import Path

import orjson

from ..errors import OutputExistsError
from ..util.oserrors import naming
from .fsops import create_file, link_target

log = logging.getLogger("sftdata.store")

OWNER_FILE = ".sftdata-staging.json"
STAGING_INFIX = ".tmp-"
REPLACED_INFIX = ".old-"  # .NAME.old-RANDOM: the replaced dataset where the folders cannot be swapped
LOCK_SUFFIX = ".sftdata-lock"
RECORD_BYTES = 512  # a lock record is padded to a multiple of this: one pwrite replaces it whole
MAX_RECORD_BYTES = 1 << 20  # what is read of a record file (a bigger one is not sftdata's)
NAME_TRIES = 100  # new names tried for a folder sftdata creates, when the chosen one is taken


def process_start(pid: int) -> str | None:
    """An identity of process ``pid``'s start (its start time in clock ticks since boot,
    Linux), or None when there is no such process or the system does not tell."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat_line[stat_line.rindex(")") + 2:].split()[19]  # field 22: starttime


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def owner_record(**fields) -> dict:
    """This process's owner record: host, pid, start, created, and ``fields`` (``target``,
    ``kind``, ``folders``)."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": process_start(pid), "created": time.time(), **fields}


def is_owner_record(rec) -> bool:
    return isinstance(rec, dict) and isinstance(rec.get("pid"), int) and isinstance(rec.get("host"), str)


def owner_alive(owner: dict) -> bool:
    """Whether the process that wrote ``owner`` may still be running. A record from
    another host is always taken as alive: we cannot see its processes."""
    if owner.get("host") != socket.gethostname():
        return True
    pid = owner.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    start = owner.get("start")
    return start is None or process_start(pid) in (None, start)


def owner_state(owner: dict) -> str:
    """``live`` or ``stale`` for an owner record of this host; ``unknown`` for another
    host's (its processes cannot be seen from here)."""
    if owner.get("host") != socket.gethostname():
        return "unknown"
    return "live" if owner_alive(owner) else "stale"


def tag() -> str:
    """The random part of a name sftdata creates beside a target."""
    return uuid.uuid4().hex[:8]


def staging_name(target_name: str) -> str:
    return f".{target_name}{STAGING_INFIX}{os.getpid()}-{tag()}"


def replaced_name(target_name: str) -> str:
    return f".{target_name}{REPLACED_INFIX}{tag()}"


def target_of(name: str) -> str | None:
    """The target name of a staging (``.NAME.tmp-...``) or replaced (``.NAME.old-...``)
    folder's name, else None. A name alone proves nothing: see ``folder_owner``."""
    if not name.startswith("."):
        return None
    for infix in (STAGING_INFIX, REPLACED_INFIX):
        head, sep, tail = name[1:].rpartition(infix)
        if sep and head and tail:
            return head
    return None


BLANK = b" \t\r\n\0"  # a record's padding, and the zeros of a file grown just before a kill


def parse_record(data: bytes) -> dict | None:
    """The owner record in ``data`` (padding allowed), ``{}`` when it holds nothing but
    padding, None when it is anything else."""
    data = data.strip(BLANK)
    if not data:
        return {}
    try:
        rec = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return rec if is_owner_record(rec) else None


def read_record(dir_fd: int | None, path: str | Path) -> tuple[dict, int] | None:
    """The owner record in the plain file ``path`` (relative to ``dir_fd``) and its owner's
    uid, or None: no such file, a link, not a plain file, too big, not an owner record."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
            return None
        rec = parse_record(os.pread(fd, MAX_RECORD_BYTES, 0))
    except OSError:
        return None
    finally:
        os.close(fd)
    return (rec, st.st_uid) if rec else None


def folder_owner(path: Path, target_name: str) -> dict | None:
    """The owner record of ``path`` when sftdata made it for ``target_name``: a folder (not
    a link) holding an owner record written by the folder's own user, naming that target
    (older sftdata wrote no target: then the folder's name says it). Else None: the folder
    is not sftdata's, whatever its name."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    found = read_record(None, path / OWNER_FILE)
    if found is None or found[1] != st.st_uid:
        return None
    rec = found[0]
    return rec if rec.get("target", target_name) == target_name else None


def journal_owns(lock_record: dict | None, lock_uid: int | None, path: Path) -> str | None:
    """What a lock's journal says folder ``path`` holds (``new``: a dataset being built, or
    ``old``: the dataset being replaced) when that lock's writer made it: its name is in
    the journal, is a name sftdata gives the lock's target, and it is a folder (not a link)
    of the lock file's user. Else None."""
    if not lock_record or target_of(path.name) != lock_record.get("target"):
        return None
    folders = lock_record.get("folders")
    holds = folders.get(path.name) if isinstance(folders, dict) else None
    if holds not in ("new", "old"):
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return holds if stat.S_ISDIR(st.st_mode) and st.st_uid == lock_uid else None


def write_folder_record(path: Path, target_name: str, kind: str) -> None:
    """Write ``path``'s owner record (``kind``: staging or replaced); never over anything."""
    create_file(path / OWNER_FILE, orjson.dumps(owner_record(target=target_name, kind=kind)))


def release_staging(path: Path) -> None:
    """Remove the owner record just before the staging folder becomes the dataset (the
    lock's journal still names the folder until it is renamed)."""
    (path / OWNER_FILE).unlink(missing_ok=True)


class WriterLock:
    """``with WriterLock(target):`` -- exclusive right to write ``target`` (advisory, per
    host). Refuses at once when another process holds it, unless ``wait``.

    ``previous`` is the record the last holder left (a run that died holding it: its
    journal names the folders it made); ``note_folder`` journals a folder before it is
    created. Leaving removes the lock file, unless a folder its journal names is still
    there (then the file stays, with the record that proves the folder sftdata's)."""

    def __init__(self, target: str | Path, *, wait: bool = False):
        self.target = Path(target)
        self.path = self.target.parent / f".{self.target.name}{LOCK_SUFFIX}"
        self.wait = wait
        self.previous: dict | None = None
        self.folders: dict[str, str] = {}
        self.uid: int | None = None  # the lock file's owner
        self._fd: int | None = None
        self._size = 0

    def __enter__(self) -> WriterLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        said = False
        while True:
            fd = self._open()
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise
                    holder = _read_holder(fd)
                    if not self.wait:
                        raise OutputExistsError(
                            f"another sftdata ({holder}) is writing {self.target}; wait for it to finish, pass "
                            f"--wait to wait, or choose another --output-dir") from None
                    if not said:  # a silent wait looks like a hang
                        log.warning(f"another sftdata ({holder}) is writing {self.target}; waiting for it to "
                                    f"finish (--wait)")
                        said = True
                    fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            # the holder before us may have removed the lock file after we opened it:
            # then our lock is on a file nobody else will see; take it again
            try:
                same = os.fstat(fd).st_ino == os.lstat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            self.previous, self._size = self._check_owned(fd)
            self.uid = os.fstat(fd).st_uid
            self._fd = fd
            # what a dead holder journaled and left stays journaled (now under this run's
            # name) until it is removed: rewriting the record never drops a proof
            prev = (self.previous or {}).get("folders")
            self.folders = {n: h for n, h in prev.items() if h in ("new", "old") and isinstance(n, str)
                            and "/" not in n and os.path.lexists(self.target.parent / n)} \
                if isinstance(prev, dict) else {}
            self._write()
        except BaseException:
            self._fd = None
            os.close(fd)
            raise
        return self

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise OutputExistsError(
                    f"{self.path} is a symbolic link (to {link_target(self.path)}); sftdata never writes through a "
                    f"link: remove the link (sftdata's lock file is created there), or choose another "
                    f"--output-dir") from None
            raise
        st = os.fstat(fd)
        why = ("is not a plain file" if not stat.S_ISREG(st.st_mode) else
               f"has {st.st_nlink} names (hard links)" if st.st_nlink != 1 else None)
        if why:
            os.close(fd)
            raise OutputExistsError(f"{self.path} {why}, so it is not sftdata's lock file; sftdata writes nothing "
                                    f"there: move it away, or choose another --output-dir")
        return fd

    def _check_owned(self, fd: int) -> tuple[dict | None, int]:
        """The record the file holds (None when empty) and its size; ``OutputExistsError``
        when it holds anything else: a file sftdata did not write is never overwritten."""
        size = os.fstat(fd).st_size
        rec = parse_record(os.pread(fd, MAX_RECORD_BYTES, 0)) if size <= MAX_RECORD_BYTES else None
        if rec == {}:
            return None, size  # empty: its writer died before its first record
        if rec is None:
            raise OutputExistsError(f"{self.path} holds data sftdata did not write, so it is not sftdata's lock "
                                    f"file and is left as it is: move it away, or choose another --output-dir")
        return rec, size

    def note_folder(self, name: str, holds: str) -> None:
        """Journal folder ``name`` (beside the target) before creating it: ``holds`` is
        ``new`` (a dataset being built) or ``old`` (the dataset being replaced)."""
        self.folders[name] = holds
        self._write()

    def forget_folder(self, name: str) -> None:
        if self.folders.pop(name, None) is not None:
            self._write()

    def _write(self) -> None:
        data = orjson.dumps(owner_record(target=self.target.name, folders=self.folders))
        size = max(self._size, -(-len(data) // RECORD_BYTES) * RECORD_BYTES)
        with naming(self.path):
            if size > self._size:  # grown first (a file-size limit or a full disk fails here, changing nothing)
                os.ftruncate(self._fd, size)
                self._size = size
            done = os.pwrite(self._fd, data + b" " * (size - len(data)), 0)  # whole: the old record or the new
        if done != size:
            raise OSError(errno.ENOSPC, f"{self.path}: only {done} of {size} bytes of the lock's record were written",
                          str(self.path))

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        keep = any(os.path.lexists(self.target.parent / name) for name in self.folders)
        try:
            if not keep and os.fstat(self._fd).st_ino == os.lstat(self.path).st_ino:
                os.unlink(self.path)  # while still holding it; waiters re-check the inode
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def _read_holder(fd: int) -> str:
    try:
        owner = parse_record(os.pread(fd, MAX_RECORD_BYTES, 0))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["created"]))
        return f"pid {owner['pid']}, started {started}"
    except Exception:  # noqa: BLE001 - a half-written record: say less, not fail
        return "another process"


def make_staging(lock: WriterLock) -> Path:
    """Create a new staging folder for the lock's target, journaled first, then with its
    own owner record. A name already taken (by anything: a link is never followed) is
    left alone and another is chosen."""
    target = lock.target
    for _ in range(NAME_TRIES):
        name = staging_name(target.name)
        path = target.parent / name
        if os.path.lexists(path):
            continue
        lock.note_folder(name, "new")
        try:
            os.mkdir(path)
        except FileExistsError:
            lock.forget_folder(name)
            continue
        write_folder_record(path, target.name, "staging")
        return path
    raise OutputExistsError(f"no free name for a staging folder beside {target} after {NAME_TRIES} tries; "
                            f"remove the .{target.name}.tmp-* entries sftdata did not make, or choose another "
                            f"--output-dir")
