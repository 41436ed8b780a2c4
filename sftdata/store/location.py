"""Where a dataset is: a local path, or a ``file://`` URL naming one.

``file:///data/sft``, ``file://localhost/data/sft`` and the ``file:/data/sft`` that
``pathlib.Path`` makes of such a URL (a command-line argument typed as a path) are
``/data/sft``. Other URLs (``s3://``, ``gs://`` ...) are refused in one line: datasets
are read memory-mapped, from a local or shared file system.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..errors import DatasetError

# a URL's scheme; "s3:/b" too: pathlib.Path makes that of "s3://b" (one letter is a drive: C:/)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")


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
        raise DatasetError(f"{text}: datasets are read from a local or shared file system ({m.group(1)}:// is not "
                           f"supported); copy it to a folder (or mount the bucket) and give its path or a file:// URL")
    return Path(location)
