"""One writer per target, and staging folders that say who owns them.

- The writer lock is an advisory ``flock`` on ``.NAME.sftdata-lock`` beside the target:
  the operating system releases it when the process dies, whatever kills it. A second
  writer is refused at once (or waits, with ``wait=True``), told which process holds it.
- A staging folder (``.NAME.tmp-PID-RANDOM``, where a dataset is built before its final
  rename) holds ``.sftdata-staging.json``: host, pid and the process's start time. A
  staging folder whose owner is dead (no such pid on this host, or the pid now belongs to
  a process started at another time) is stale: the next run to that target, or
  ``sftdata clean``, removes it. A live one is never touched.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..errors import OutputExistsError
from .format import METADATA_FILE, PARTS_DIR, REJECTS_FILE, SERVING_FILE, SPLITS, STAGING_SPLIT, TOKENIZER_FILE

log = logging.getLogger("sftdata.store")

OWNER_FILE = ".sftdata-staging.json"
STAGING_INFIX = ".tmp-"
REPLACED_INFIX = ".old-"  # .NAME.old-RANDOM: the dataset --overwrite is replacing (writer.py)
LOCK_SUFFIX = ".sftdata-lock"
NO_OWNER_GRACE_S = 60.0  # a staging folder without an owner file is young for this long
# what a staging folder holds at its top level, at any moment of a run
STAGING_NAMES = frozenset({OWNER_FILE, STAGING_SPLIT, PARTS_DIR, *SPLITS, REJECTS_FILE, TOKENIZER_FILE,
                           SERVING_FILE, METADATA_FILE})


def process_start(pid: int) -> str | None:
    """An identity of process ``pid``'s start (its start time in clock ticks since boot,
    Linux), or None when there is no such process or the system does not tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]  # field 22: starttime


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def owner_record() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": process_start(pid), "created": time.time()}


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


def staging_path(target: Path) -> Path:
    return target.parent / f".{target.name}{STAGING_INFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def make_staging(target: Path) -> Path:
    """Create a new staging folder for ``target``, with its owner record."""
    path = staging_path(target)
    path.mkdir()
    (path / OWNER_FILE).write_bytes(orjson.dumps(owner_record()))
    return path


def release_staging(path: Path) -> None:
    """Remove the owner record just before the staging folder becomes the dataset."""
    (path / OWNER_FILE).unlink(missing_ok=True)


@dataclass(frozen=True)
class Staging:
    path: Path
    target: Path
    stale: bool
    owner: dict | None


def staging_target(name: str) -> str | None:
    """The target name of a staging folder's name (``.NAME.tmp-PID-RANDOM``), else None."""
    head, sep, tail = name[1:].rpartition(STAGING_INFIX)
    return head if name.startswith(".") and sep and head and pid_in_name(name) is not None else None


def find_staging(folder: Path, target_name: str | None = None) -> list[Staging]:
    """Staging folders sftdata left in ``folder`` (for ``target_name`` only, if given)."""
    out = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return out
    for p in entries:
        name = staging_target(p.name)
        if name is None or (target_name is not None and name != target_name) or not p.is_dir() or p.is_symlink():
            continue
        state, owner = staging_state(p)
        out.append(Staging(p, folder / name, state == "stale", owner))
    return out


def staging_state(path: Path) -> tuple[str, dict | None]:
    """``(state, owner record or None)`` of a staging folder: ``stale`` (its owner is
    dead), ``live`` (its owner runs, or it is younger than ``NO_OWNER_GRACE_S`` without an
    owner record) or ``unknown`` (an owner on another host; no owner record and a name
    sftdata does not write there at its top level: perhaps not sftdata's)."""
    owner = _read_owner(path)
    if owner is not None:
        return owner_state(owner), owner
    try:  # older sftdata, or killed between mkdir and the owner record: the pid in the name
        names = {p.name for p in path.iterdir()}
        young = time.time() - path.stat().st_mtime < NO_OWNER_GRACE_S
    except OSError:
        return "unknown", None
    pid = pid_in_name(path.name)
    if pid is None or not names <= STAGING_NAMES:
        return "unknown", None
    return ("live" if young or pid_alive(pid) else "stale"), None


def _read_owner(p: Path) -> dict | None:
    try:
        owner = orjson.loads((p / OWNER_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return owner if isinstance(owner, dict) else None


def pid_in_name(name: str) -> int | None:
    tail = name.rpartition(STAGING_INFIX)[2]
    head = tail.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def sweep_stale(target: Path) -> list[Path]:
    """Remove the stale staging folders of ``target``; return the removed paths."""
    removed = []
    for s in find_staging(target.parent, target.name):
        if s.stale:
            shutil.rmtree(s.path, ignore_errors=True)
            removed.append(s.path)
    return removed


class WriterLock:
    """``with WriterLock(target):`` -- exclusive right to write ``target`` (advisory, per
    host). Refuses at once when another process holds it, unless ``wait``."""

    def __init__(self, target: str | Path, *, wait: bool = False):
        self.target = Path(target)
        self.path = self.target.parent / f".{self.target.name}{LOCK_SUFFIX}"
        self.wait = wait
        self._fd: int | None = None

    def __enter__(self) -> WriterLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        said = False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, orjson.dumps(owner_record()))
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            try:
                os.unlink(self.path)  # while still holding it; waiters re-check the inode
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        owner = orjson.loads(os.pread(fd, 4096, 0))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["created"]))
        return f"pid {owner['pid']}, started {started}"
    except Exception:  # noqa: BLE001 - a half-written record: say less, not fail
        return "another process"
