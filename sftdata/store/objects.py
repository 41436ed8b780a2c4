"""A dataset's place in object storage: its file system and path (``remote_fs``), its
objects, their identities, and its writer's lock object.

A dataset at ``s3://bucket/sft/v3`` is the objects ``bucket/sft/v3/...``; its writer's
lock object is ``bucket/sft/.v3.sftdata-lock`` beside it (as a local target's lock file
is beside the folder), so a prefix holds nothing but the dataset. fsspec is imported
only lazily (``sftdata.util.urls``).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from ..errors import SftDataError
from ..util.cache import cache_dir
from ..util.urls import filesystem, object_version
from .lock import LOCK_SUFFIX


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
    CACHE is ``sftdata.util.cache.cache_dir()``, or the system's temporary folder when the cache is off."""
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
    """What tells one version of an object from another: its size, and the etag, checksum or
    modification time the store gives (``util.urls.object_version``, which inputs use too)."""
    return tuple(sorted((object_version(info) or {"size": info.get("size")}).items()))
