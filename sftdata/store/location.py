"""Where a dataset is: a local path, a ``file://`` URL naming one, or an object-store URL,
and for the last its place in object storage (file system, objects, the names beside it).

``file:///data/sft``, ``file://localhost/data/sft`` and the ``file:/data/sft`` that
``pathlib.Path`` makes of such a URL (a command-line argument typed as a path) are
``/data/sft``. Other URLs (``s3://bucket/sft``, ``gs://``, any fsspec protocol; also the
``s3:/bucket/sft`` that ``pathlib.Path`` makes of one) name a dataset in object storage:
``remote_url`` gives the URL, and the readers fetch it into a local cache
(``object_cache``), the writer uploads it (``object_commit``). ``local_path`` is for what
must be local, and refuses them in one line.

A dataset at ``s3://bucket/sft/v3`` is the objects ``bucket/sft/v3/...``; its writer's
lock object is ``bucket/sft/.v3.sftdata-lock`` beside it (as a local target's lock file
is beside the folder), so a prefix holds nothing but the dataset. fsspec is imported
only lazily (``sftdata.fsspec_urls``): ``sftdata.loader`` imports numpy alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..cache import cache_dir
from ..errors import DatasetError, SftDataError
from ..fsspec_urls import filesystem
from .lock import LOCK_SUFFIX

# a URL's scheme; "s3:/b" too: pathlib.Path makes that of "s3://b" (one letter is a drive: C:/)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")


def remote_url(location: str | os.PathLike) -> str | None:
    """The URL of a dataset in object storage (``s3://bucket/sft``), else None (a local
    path, or a ``file://`` URL). ``s3:/bucket/sft`` (a URL passed through ``pathlib.Path``)
    is ``s3://bucket/sft``; a trailing ``/`` is dropped."""
    text = os.fspath(location)
    m = _SCHEME.match(text)
    if m is None or m.group(1).lower() == "file":
        return None
    return f"{m.group(1).lower()}://{text[m.end():].lstrip('/')}".rstrip("/")


def local_path(location: str | os.PathLike) -> Path:
    """The local path of ``location`` (a path, or a ``file://`` URL)."""
    text = os.fspath(location)
    if text.startswith("file:"):
        url = urlparse(text)
        if url.netloc not in ("", "localhost"):
            raise DatasetError(f"{text}: a file:// URL names this machine's files (file:///path/to/dataset); "
                               f"host {url.netloc!r} is not this machine")
        return Path(unquote(url.path))
    m = _SCHEME.match(text)
    if m:
        raise DatasetError(f"{text}: this needs a local path or a file:// URL ({m.group(1)}:// is not supported "
                           f"here); copy it to a folder (or mount the bucket) and give its path")
    return Path(location)


def remote_fs(url: str, verb: str, error: type[SftDataError]):
    """(file system, the dataset's path in it without a trailing ``/``) for ``url``. A
    missing package is one line naming the ``cloud`` extra; a URL that names a bucket
    alone is refused (its lock object would have nowhere to go)."""
    fs, root = filesystem(url, verb, error)
    root = root.rstrip("/")
    if "/" not in root.strip("/"):
        raise error(f"{url}: give a folder inside the bucket ({url.rstrip('/')}/sft, say): a dataset is written "
                    f"under a prefix, with its lock object beside it")
    return fs, root


UPLOADS = "uploads"  # the cache's sub-folder where datasets for URLs are built before their upload


def upload_home(url: str) -> Path:
    """The local place a dataset for ``url`` is built beside before its upload:
    ``CACHE/uploads/<sha256(URL)[:16]>/NAME`` (never itself created: its staging folders
    ``.NAME.tmp-PID-RANDOM`` and its local writer lock go beside it, as for a local target).
    CACHE is ``sftdata.cache.cache_dir()``, or the system's temporary folder when the cache is off."""
    home = cache_dir() or Path(tempfile.gettempdir()) / "sftdata"
    return home / UPLOADS / hashlib.sha256(url.encode()).hexdigest()[:16] / (url.rstrip("/").rpartition("/")[2] or "dataset")


def lock_key(root: str) -> str:
    """The lock object of the dataset at ``root``: ``bucket/sft/.v3.sftdata-lock``."""
    parent, _, name = root.rpartition("/")
    return f"{parent}/.{name}{LOCK_SUFFIX}"


def list_objects(fs, root: str) -> dict[str, dict]:
    """Every object under ``root/`` as {path relative to root: fsspec info}, freshly listed
    (a file system's listing cache is dropped first: another process may have written)."""
    fs.invalidate_cache(root)
    prefix = root + "/"
    try:
        found = fs.find(prefix, detail=True)
    except FileNotFoundError:
        return {}
    out = {}
    for path, info in found.items():
        path = fs._strip_protocol(path)
        if path.startswith(prefix) and info.get("type") != "directory":
            out[path[len(prefix):]] = info
    return dict(sorted(out.items()))


def identity(info: dict) -> tuple:
    """What tells one version of an object from another: its size, and the etag or
    modification time the store gives (whichever it has)."""
    return (info.get("size"), str(info.get("ETag") or info.get("etag") or info.get("mtime")
                                  or info.get("LastModified") or info.get("created") or ""))
