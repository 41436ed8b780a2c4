"""Where a dataset is: a local path, a ``file://`` URL naming one, or an object-store URL,
and for the last its place in object storage (file system, objects, the names beside it).

``file:///data/sft``, ``file://localhost/data/sft`` and the ``file:/data/sft`` that
``pathlib.Path`` makes of such a URL (a command-line argument typed as a path) are
``/data/sft``. Other URLs (``s3://bucket/sft``, ``gs://``, any fsspec protocol; also the
``s3:/bucket/sft`` that ``pathlib.Path`` makes of one) name a dataset in object storage:
``remote_url`` gives the URL, and the readers fetch it into a local cache
(``object_cache``), the writer uploads it (``object_commit``). ``local_path`` is for what
must be local, and refuses them in one line.

Its place in object storage (file system, objects, lock object) is ``objects``'; the
object-storage code is imported only when a dataset at a URL is opened (``dataset_path``),
so a training process reading a local folder loads none of it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..errors import DatasetError

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


def dataset_path(location) -> Path:
    """The local folder of a dataset: ``location`` itself (a path or ``file://`` URL), or
    for an object-store URL its copy in the cache, fetched first when needed."""
    url = remote_url(location)
    if url is None:
        return local_path(location)
    from .object_cache import fetch_dataset  # lazy: object-storage code loads only for a dataset at a URL

    return fetch_dataset(url).path
