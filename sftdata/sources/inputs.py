"""What the INPUT arguments name: files, folders, globs, ``-`` (stdin) and URLs.

``expand_inputs(["chats/", "extra/*.jsonl.gz", "-", "s3://bucket/train/"])`` returns
one ``Input`` per file to read, in the order the arguments give them (an
``hf://datasets/`` URL pinned to the commit its revision names now: ``hub``); a folder's files
come sorted by their path inside it (recursively), a glob's by name. In a folder, only
files named like inputs are read (``.jsonl``, ``.ndjson``, ``.json``, ``.parquet``,
each optionally ``.gz``, ``.bz2``, ``.xz``, ``.zst``); hidden files and folders (a name
starting with ``.``, which includes sftdata's own staging folders), datasets (a folder
holding ``dataset_metadata.json``) and rejects files (``NAME.rejects.jsonl``) are
skipped. A file named explicitly is read whatever its name (its bytes say what it is).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, UsageError
from .hub import HubPin, pin_hub_url
from .remote import url_listing, url_protocol

STDIN = "<stdin>"  # the name of standard input in messages, rejects.jsonl and the metadata
INPUT_NAME = re.compile(r"\.(jsonl|ndjson|json|parquet)(\.(gz|bz2|xz|zst|zstd))?$", re.IGNORECASE)
REJECTS_NAME = re.compile(r"(^|/)([^/]+\.)?rejects(-\d+)?\.jsonl$")
DATASET_MARK = "dataset_metadata.json"
_GLOB = re.compile(r"[*?[]")


@dataclass(frozen=True)
class Input:
    """One input to read: ``name`` is how messages and the metadata call it (a path as
    given or found, a URL, or ``<stdin>``). ``hub``: a Hub dataset's revision and the
    commit ``name`` is pinned to (``hub``)."""

    name: str
    kind: str = "file"  # "file" | "url" | "stdin"
    size: int | None = None
    hub: HubPin | None = None

    @property
    def given(self) -> str:
        """The input as the user named it (a Hub URL with its revision, not the commit)."""
        return self.hub.given(self.name) if self.hub is not None else self.name


def select_inputs(paths: Iterable[str]) -> list[str]:
    """The input files of a folder listing (POSIX paths relative to the folder), sorted:
    named like inputs, not hidden, not in a dataset, not a rejects file (pure)."""
    paths = list(paths)
    datasets = {p.rpartition("/")[0] for p in paths if p.rpartition("/")[2] == DATASET_MARK}

    def keep(p: str) -> bool:
        parts = p.split("/")
        if any(part.startswith(".") for part in parts) or not INPUT_NAME.search(parts[-1]):
            return False
        if REJECTS_NAME.search(p):
            return False
        return not any("/".join(parts[:k]) in datasets for k in range(len(parts)))

    return sorted(p for p in paths if keep(p))


def _nothing_in(folder: str, listing: list[str]) -> InputError:
    if DATASET_MARK in listing:
        return InputError(f"{folder} is an sftdata dataset, not a folder of inputs; give the files of "
                          f"conversations it was prepared from")
    seen = [p for p in listing if not any(part.startswith(".") for part in p.split("/"))]
    shown = ", ".join(seen[:5]) + (f" and {len(seen) - 5:,} more" if len(seen) > 5 else "")
    return InputError(f"folder {folder} holds no input file (.jsonl, .ndjson, .json or .parquet, optionally "
                      f".gz/.bz2/.xz/.zst){'; it holds: ' + shown if shown else ''}")


def _walk(folder: Path) -> list[str]:
    """Every file under ``folder`` as a relative POSIX path; hidden folders and datasets
    are not entered."""
    out: list[str] = []

    def refuse(e: OSError):
        raise InputError(f"folder {e.filename or folder} cannot be read ({e.strerror or e})")

    for root, dirs, files in os.walk(folder, onerror=refuse):
        rel = Path(root).relative_to(folder).as_posix()
        prefix = "" if rel == "." else rel + "/"
        if DATASET_MARK in files and prefix:
            dirs[:] = []
            out.append(prefix + DATASET_MARK)
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [prefix + f for f in files]
    return out


def _local_folder(folder: Path, shown: str) -> list[Input]:
    listing = _walk(folder)
    chosen = select_inputs(listing)
    if not chosen:
        raise _nothing_in(shown, sorted(listing))
    return [Input(os.path.join(shown, *p.split("/")), "file", None) for p in chosen]


def _url(arg: str, resolved: dict) -> list[Input]:
    pinned = pin_hub_url(arg, resolved)  # a Hub dataset's revision: read at the commit it names now
    hub = None
    if pinned is not None:
        arg, hub = pinned
    kind, listing = url_listing(arg, bool(_GLOB.search(arg.split("://", 1)[1])))
    if kind == "folder":
        by_rel = {rel: (url, size) for rel, url, size in listing}
        chosen = select_inputs(by_rel)
        if not chosen:
            raise _nothing_in(arg, sorted(by_rel))
        return [Input(by_rel[r][0], "url", by_rel[r][1], hub) for r in chosen]
    if not listing:
        raise InputError(f"no file matches {arg}")
    return [Input(url, "url", size, hub) for _, url, size in listing]


def _local(arg: str) -> list[Input]:
    p = Path(arg)
    if p.is_dir():
        return _local_folder(p, arg)
    if p.exists() or p.is_symlink() or not _GLOB.search(arg):
        return [Input(arg, "file", None)]  # a missing file is reported when it is opened
    found = []
    for m in sorted(glob.glob(arg, recursive=True)):
        found += _local_folder(Path(m), m) if os.path.isdir(m) else [Input(m, "file", None)]
    if not found:
        raise InputError(f"no file matches {arg} (a pattern: * ? and [...] match file names, ** folders)")
    return found


def expand_inputs(args: Sequence[str | os.PathLike]) -> list[Input]:
    """One ``Input`` per file the arguments name, in order (see the module docstring)."""
    out: list[Input] = []
    stdin = 0
    resolved: dict = {}  # Hub commits asked for in this call, by (repo, revision)
    for a in args:
        arg = os.fspath(a)
        if arg == "-":
            stdin += 1
            if stdin > 1:
                raise UsageError("'-' (standard input) is given twice; it can be read once")
            out.append(Input(STDIN, "stdin", None))
        elif url_protocol(arg):
            out += _url(arg, resolved)
        else:
            out += _local(arg)
    return out
