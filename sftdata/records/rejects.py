"""Where the rejected records of a run go, and naming the path of a failed write.

A run that keeps at least one record writes ``rejects.jsonl`` inside the dataset. A run
that keeps none creates no dataset, so its rejects are kept beside the output folder
(``keep_rejects``), never over a file sftdata did not write.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from ..errors import NoUsableRecordsError
from ..util.oserrors import naming

REJECT_KEYS = ("record", "source", "where", "reason", "message")  # one line of rejects.jsonl


def writing(path: Path, target: str | Path):
    """An OSError while writing (a full disk: ``write`` errors carry no file name) names
    the path being written and the output folder it is for."""
    return naming(path, f"while preparing {target}")


def is_rejects_file(path: Path) -> bool:
    """True when ``path`` is a rejects file sftdata wrote: a regular file, not empty, each
    line a JSON object with exactly the keys of a reject."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            n = 0
            for line in f:
                obj = orjson.loads(line)
                if not isinstance(obj, dict) or tuple(obj) != REJECT_KEYS:
                    return False
                n += 1
        return n > 0
    except (OSError, orjson.JSONDecodeError):
        return False


def keep_rejects(src: Path, output_dir: str | Path) -> Path:
    """Put the rejects of a run that kept no record beside the output folder (which is not
    created): ``DIR.rejects.jsonl``, or ``DIR.rejects-2.jsonl`` (-3, ...) when that name
    holds anything sftdata did not write there. A file is never overwritten unless it is
    such a rejects file; a new name is claimed with a hard link, which fails rather than
    replace a file that appeared meanwhile."""
    out = Path(output_dir)
    name = out.name or out.resolve().name
    for k in range(1, 1000):
        dest = out.parent / (f"{name}.rejects.jsonl" if k == 1 else f"{name}.rejects-{k}.jsonl")
        with writing(dest, output_dir):
            if dest.is_symlink() or dest.exists():
                if is_rejects_file(dest):  # an earlier run's: replaced
                    os.replace(src, dest)
                    return dest
                continue
            try:
                os.link(src, dest)
            except FileExistsError:
                continue
            except OSError:  # a file system without hard links
                os.replace(src, dest)
            return dest
    raise NoUsableRecordsError(f"every record was rejected, and {out.parent} already holds 999 files named "
                               f"{name}.rejects*.jsonl that sftdata did not write; remove some of them")
