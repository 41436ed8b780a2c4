"""Which files a dataset folder's own metadata says sftdata wrote, and what ``--overwrite``
may therefore remove: exactly those, never anything else.

A folder is a dataset only when its ``dataset_metadata.json`` parses, says
``"format": "sftdata"``, lists its files (``files`` at the top, ``splits.*.shards[].files``
per shard) and every listed file exists. Everything else found in it is *foreign*: a
user's notes, a folder of their work, a symlink (sftdata never writes one). A folder with
anything foreign is never replaced::

    data/chat_sft/
      dataset_metadata.json          owned (the manifest itself)
      tokenizer_state.json           owned (listed in "files")
      train/shard_00000/tokens.bin   owned (listed in splits.train.shards[0].files)
      NOTES.txt                      foreign -> --overwrite refuses, naming it
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import DatasetError, OutputExistsError
from . import FORMAT_NAME, METADATA_FILE, SPLITS, read_json

NAMED = 5  # how many foreign paths a message names


def manifest_of(meta: dict) -> tuple[list[str], list[str]] | None:
    """``(files, folders)`` that ``meta`` says the dataset consists of, as POSIX paths
    relative to the dataset folder (the metadata file included), or None when ``meta``
    does not describe an sftdata dataset's files. Pure: reads nothing.

    >>> manifest_of({"format": "sftdata", "files": {"tokenizer_state.json": {}},
    ...              "splits": {"train": {"shards": [{"name": "shard_00000", "files": {"tokens.bin": {}}}]}}})
    (['dataset_metadata.json', 'tokenizer_state.json', 'train/shard_00000/tokens.bin'], ['train', 'train/shard_00000'])
    """
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        return None
    top, splits = meta.get("files"), meta.get("splits")
    if not isinstance(top, dict) or not isinstance(splits, dict):
        return None
    files, folders = [METADATA_FILE], []
    for name in top:
        if not _plain_name(name):
            return None
        files.append(name)
    for split, info in splits.items():
        shards = info.get("shards") if isinstance(info, dict) else None
        if split not in SPLITS or not isinstance(shards, list):
            return None
        folders.append(split)
        for shard in shards:
            name = shard.get("name") if isinstance(shard, dict) else None
            shard_files = shard.get("files") if isinstance(shard, dict) else None
            if not _plain_name(name) or not isinstance(shard_files, dict):
                return None
            folders.append(f"{split}/{name}")
            for fn in shard_files:
                if not _plain_name(fn):
                    return None
                files.append(f"{split}/{name}/{fn}")
    return sorted(set(files)), sorted(set(folders))


def _plain_name(name) -> bool:
    """One path component that stays inside its folder (no ``..``, no separator)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name and len(PurePosixPath(name).parts) == 1)


@dataclass
class Survey:
    """What a folder holds, sorted into what its metadata owns and what it does not."""
    folder: Path
    is_dataset: bool
    why_not: str = ""                       # when not a dataset: why, for a message
    files: list[str] = field(default_factory=list)    # owned files present
    folders: list[str] = field(default_factory=list)  # owned folders present
    foreign: list[str] = field(default_factory=list)  # anything else (folders end with "/")

    @property
    def empty(self) -> bool:
        return not self.files and not self.folders and not self.foreign


def survey(folder: str | Path) -> Survey:
    """Sort the entries of ``folder`` (an existing folder) into owned and foreign."""
    folder = Path(folder)
    entries = _walk(folder)
    if not entries:
        return Survey(folder, is_dataset=False, why_not="empty")
    if not (folder / METADATA_FILE).is_file() or (folder / METADATA_FILE).is_symlink():
        return Survey(folder, False, f"no {METADATA_FILE}, and not empty", foreign=_tops(entries))
    try:
        listed = manifest_of(read_json(folder / METADATA_FILE))
    except (DatasetError, OSError):
        listed = None
    if listed is None:
        return Survey(folder, False, f"its {METADATA_FILE} is not an sftdata dataset's, or does not list its files",
                      foreign=_tops(entries))
    files, folders = listed
    kinds = dict(entries)  # relpath -> "file" | "dir" | "other"
    missing = [f for f in files if kinds.get(f) != "file"]
    if missing:
        return Survey(folder, False, f"{len(missing)} file(s) its {METADATA_FILE} lists are missing "
                                     f"(first: {missing[0]})", foreign=_tops(entries))
    owned_files, owned_folders = set(files), set(folders)
    foreign = _tops([(rel, kind) for rel, kind in entries
                     if not ((kind == "file" and rel in owned_files) or (kind == "dir" and rel in owned_folders))])
    return Survey(folder, True, files=files, folders=folders, foreign=foreign)


def walk(top: str | Path, onerror=None):
    """``os.walk(top)`` top-down, links not followed, without recursion: Python 3.11's
    recurses once per level, so a folder 3,000 deep would end it in a RecursionError.
    Yields (folder, its subfolder names, its other names); removing a name from the
    subfolder list skips that subfolder, as with ``os.walk``."""
    stack = [os.fspath(top)]
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as e:
            if onerror is not None:
                onerror(e)
            continue
        dirs, files = [], []
        for e in entries:
            try:
                is_dir = e.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(e.name)
        yield path, dirs, files
        stack.extend(p for p in (os.path.join(path, d) for d in reversed(dirs)) if not os.path.islink(p))


def _walk(folder: Path) -> list[tuple[str, str]]:
    """Every entry below ``folder`` as (relative POSIX path, kind), not following links."""
    out = []
    for dirpath, dirnames, filenames in walk(folder):
        base = Path(dirpath).relative_to(folder)
        for name in sorted(dirnames) + sorted(filenames):
            p = Path(dirpath) / name
            rel = (base / name).as_posix()
            if p.is_symlink():
                kind = "other"
            elif p.is_dir():
                kind = "dir"
            elif p.is_file():
                kind = "file"
            else:
                kind = "other"
            out.append((rel, kind))
    return sorted(out)


def _tops(entries: list[tuple[str, str]]) -> list[str]:
    """The outermost of ``entries`` (a folder stands for what it holds); folders end in "/"."""
    out: list[str] = []
    for rel, kind in sorted(entries):
        if any(rel.startswith(o) for o in out if o.endswith("/")):
            continue
        out.append(rel + "/" if kind == "dir" else rel)
    return out


def named(paths: list[str]) -> str:
    """Up to five paths for a message, then how many more."""
    shown = ", ".join(paths[:NAMED])
    return shown + (f" (and {len(paths) - NAMED} more)" if len(paths) > NAMED else "")


def check_replaceable(folder: str | Path) -> Survey:
    """The survey of ``folder`` when ``--overwrite`` may replace it (empty, or a dataset
    holding nothing but its own files); else :class:`OutputExistsError` saying why,
    naming up to five foreign paths, and what to do."""
    s = survey(folder)
    if s.empty or (s.is_dataset and not s.foreign):
        return s
    if not s.is_dataset:
        raise OutputExistsError(
            f"{s.folder} is not an sftdata dataset ({s.why_not}): --overwrite replaces only a dataset, "
            f"never other files (they would be deleted). It holds: {named(s.foreign)}. Choose another "
            f"--output-dir, or remove the folder yourself")
    raise OutputExistsError(
        f"{s.folder} holds files sftdata did not write: {named(s.foreign)}. --overwrite removes only a "
        f"dataset's own files; move those out of the folder (or choose another --output-dir) and run again")


def signature(folder: str | Path) -> tuple | None:
    """What ``folder`` looks like now, cheaply (None when absent): the kind, size and
    modification time of every entry below it. Equal signatures before and after a run
    mean nobody changed the target in between."""
    folder = Path(folder)
    if not folder.exists() and not folder.is_symlink():
        return None
    if not folder.is_dir() or folder.is_symlink():
        st = folder.lstat()
        return (("", "other", st.st_size, st.st_mtime_ns),)
    out = []
    for rel, kind in _walk(folder):
        st = (folder / rel).lstat()
        out.append((rel, kind, st.st_size if kind == "file" else 0, st.st_mtime_ns if kind != "dir" else 0))
    return tuple(out)
