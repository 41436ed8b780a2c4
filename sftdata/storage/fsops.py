"""File system operations beside a target that never follow a link sftdata did not make.

A dataset's target sits in a folder other people may write to (a shared scratch disk, a
world-writable folder). Whatever they plant there, under any name sftdata uses, is never
written through, truncated or removed:

- a link where sftdata would write is refused up front, naming the link and what it
  points to (``refuse_link``): the target itself, the lock file, a mixture file;
- files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (``create_file``), folders with
  ``mkdir`` (which never follows a link), and a name already taken is never reused;
- renames never replace what stands at the destination (``rename_noreplace``), and the
  commit of ``--overwrite`` swaps the two folders in one step (``exchange``:
  ``renameat2(RENAME_EXCHANGE)``, Linux), so the target always holds a whole dataset;
- a worker process (or Ray task) creates its folders only inside the staging folder the
  run's coordinator created and still owns, checked by the identity the coordinator
  recorded (``folder_identity``: device, inode and a file of a random name in it;
  ``make_owned_folder``), and never a parent folder: once
  the run has stopped and removed its staging folder, nothing re-creates it, and a link
  planted at its name is never written through;
- removal walks from a folder's descriptor, opening each folder below it with
  ``O_NOFOLLOW`` and unlinking only regular files (``remove_listed``): a link planted
  inside, even while the removal runs, is never entered.

Where the system has no ``renameat2`` (or the file system does not support it: NFS, some
FUSE mounts), ``exchange`` says so and the writer falls back to two renames.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
import uuid
from pathlib import Path, PurePosixPath

from ..errors import OutputExistsError, SftDataError

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_NOT_SUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _libc_renameat2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_renameat2_fn = _libc_renameat2()


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``; False when the system or file system lacks it."""
    if _renameat2_fn is None:
        return False
    if _renameat2_fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NOT_SUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


def exchange(a: Path, b: Path) -> bool:
    """Swap the entries ``a`` and ``b`` (both must exist) in one step: a reader sees one or
    the other at each name, never neither. False when this system cannot (nothing done)."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; ``FileExistsError`` when anything stands at ``dst`` (a
    link, a file, an empty folder), which is never replaced."""
    if _renameat2(src, dst, _RENAME_NOREPLACE):
        return
    if os.path.lexists(dst):  # no renameat2 here: check, then rename (a narrow race remains)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


OUTPUT_DIR_FIX = "give the folder it points to as --output-dir, or remove the link"  # a linked output folder


def link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def refuse_link(path: Path, fix: str) -> None:
    """``OutputExistsError`` when ``path`` is a symbolic link (naming it and what it points
    to, then ``fix``); nothing otherwise."""
    if os.path.islink(path):
        raise OutputExistsError(f"{path} is a symbolic link (to {link_target(path)}); sftdata never writes "
                                f"through a link: {fix}")


def create_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Create ``path`` holding ``data``; ``FileExistsError`` when anything is there already
    (a link included: never followed). A write that fails (a full disk) removes the file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)


def open_folder(path: Path) -> int | None:
    """A descriptor of the folder ``path`` (its last part never a link), or None when
    there is no such folder."""
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _open_below(parent, path.name)
    finally:
        os.close(parent)


def _open_below(fd: int, name: str) -> int | None:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def _walk_to(root: int, parts: tuple[str, ...]) -> int | None:
    """A descriptor of the folder ``parts`` below ``root``, each step without following a
    link; None when a step is missing or is not a folder."""
    fd = os.dup(root)
    for part in parts:
        nxt = _open_below(fd, part)
        os.close(fd)
        if nxt is None:
            return None
        fd = nxt
    return fd


def unlink_file(dir_fd: int, name: str) -> bool:
    """Unlink ``name`` in ``dir_fd`` when it is a regular file (never a link, a folder or
    anything else); True when it was removed."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def remove_listed(folder: Path, files: list[str], folders: list[str], last: tuple[str, ...] = ()) -> list[str]:
    """Remove the regular files ``files`` (POSIX paths relative to ``folder``), then the
    folders ``folders`` that are empty, deepest first, then the top-level files ``last`` in
    that order (the manifest, then the owner record), then ``folder`` itself when nothing is
    left in it. A run killed anywhere in between leaves the manifest for as long as
    anything it lists is there. Missing entries are skipped; links are never followed.
    Returns the names left at ``folder``'s top (empty when it was removed)."""
    root = open_folder(folder)
    if root is None:
        return []
    try:
        for rel in files:
            if rel in last:
                continue
            parts = PurePosixPath(rel).parts
            fd = _walk_to(root, parts[:-1])
            if fd is not None:
                try:
                    unlink_file(fd, parts[-1])
                finally:
                    os.close(fd)
        for rel in sorted(folders, key=lambda r: (-r.count("/"), r)):
            parts = PurePosixPath(rel).parts
            fd = _walk_to(root, parts[:-1])
            if fd is None:
                continue
            try:
                os.rmdir(parts[-1], dir_fd=fd)
            except OSError:  # not empty (something not listed appeared), a link, or gone
                pass
            finally:
                os.close(fd)
        for name in last:
            unlink_file(root, name)
        left = sorted(os.listdir(root))
    finally:
        os.close(root)
    if not left:
        try:
            os.rmdir(folder)
        except FileNotFoundError:
            pass
        except OSError:  # something appeared meanwhile
            left = sorted(os.listdir(folder))
    return left


def make_folder(path: Path) -> None:
    """``path`` made (its parent must exist: no parent is ever created), or kept when a
    folder already stands there; a link or a file there is refused, never followed."""
    try:
        os.mkdir(path)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise OutputExistsError(f"{path} is not a folder sftdata made (a link or a file stands there); sftdata "
                                    f"never writes through it: remove it and rerun") from None


STAGE_MARK = ".sftdata-stage-"  # a file in a staging area, named at random: what a task checks it by


def folder_identity(path: Path) -> dict:
    """What tells the folder ``path`` (made by this run) from anything later put at its
    name: its device and inode, the host that saw them (another host of a shared file
    system sees another device number), and a file of a random name made in it (an inode
    number is reused once its folder is removed; a folder someone else made holds no such
    file). Asked again, the same (the file is made once)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OutputExistsError(f"{path} is not a folder sftdata made (a link or a file stands there); sftdata never "
                                f"writes through it: remove it and rerun")
    mark = next((n for n in sorted(os.listdir(path)) if n.startswith(STAGE_MARK)), None)
    if mark is None:
        mark = STAGE_MARK + uuid.uuid4().hex
        create_file(path / mark, b"")
    return {"host": os.uname().nodename, "dev": st.st_dev, "ino": st.st_ino, "mark": mark}


def _same_folder(st: os.stat_result, identity: dict, dir_fd: int | None, path: Path) -> bool:
    if st.st_ino != identity["ino"] or (identity["host"] == os.uname().nodename and st.st_dev != identity["dev"]):
        return False
    try:
        mark = os.stat(identity["mark"], dir_fd=dir_fd, follow_symlinks=False) if dir_fd is not None else \
            os.lstat(path / identity["mark"])
    except OSError:
        return False
    return stat.S_ISREG(mark.st_mode)


def owned_folder_gone(path: Path) -> SftDataError:
    return SftDataError(f"{path} is no longer the staging folder this run created (the run stopped and removed it, "
                        f"or something else now stands at its name); nothing more is written there. Rerun the "
                        f"command")


def check_owned_folder(path: Path, identity: dict | None) -> None:
    """Raise (``owned_folder_gone``) unless ``path`` is still the folder of ``identity``
    (``folder_identity``; None: not recorded, nothing checked)."""
    if identity is None:
        return
    try:
        st = os.lstat(path)
    except OSError:
        raise owned_folder_gone(path) from None
    if not stat.S_ISDIR(st.st_mode) or not _same_folder(st, identity, None, path):
        raise owned_folder_gone(path)


def make_owned_folder(parent: Path, prefix: str, identity: dict | None) -> Path:
    """A new folder ``parent/PREFIX.tmp-PID-RANDOM``, made inside the folder ``parent``
    the coordinator created (``identity``: checked on the descriptor the folder is made
    from, so no link at ``parent``'s name is followed), never its parents: a staging area
    already removed stays removed (``owned_folder_gone``)."""
    name = f"{prefix}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(parent, DIR_FLAGS)
    except OSError:
        raise owned_folder_gone(parent) from None
    try:
        if identity is not None and not _same_folder(os.fstat(fd), identity, fd, parent):
            raise owned_folder_gone(parent)
        os.mkdir(name, 0o777, dir_fd=fd)
    finally:
        os.close(fd)
    return parent / name
