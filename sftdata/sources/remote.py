"""URLs (``s3://``, ``gs://``, ``hf://``, ``https://``, ``file://`` ...) through fsspec.

A URL is opened as a seekable file that fetches ``BLOCK_BYTES`` at a time as it is read:
streamed, never downloaded whole first. fsspec, and each protocol's own package, are
optional: a missing one is a one-line error naming the pip extra that adds it.
"""

from __future__ import annotations

from ..errors import InputError
from ..util.urls import EXTRA, PACKAGES, filesystem, url_protocol

__all__ = ["BLOCK_BYTES", "EXTRA", "PACKAGES", "filesystem", "open_url", "remote_error", "url_listing", "url_protocol"]

BLOCK_BYTES = 8 << 20  # bytes fetched per request, and the read-ahead held in memory


def remote_error(url: str, e: BaseException) -> InputError:
    if isinstance(e, FileNotFoundError):
        return InputError(f"input {url} does not exist")
    if isinstance(e, PermissionError):
        return InputError(f"input {url} is not readable (permission denied)")
    return InputError(f"input {url} cannot be read ({type(e).__name__}: {e})")


def open_url(url: str):
    """A seekable binary file object reading ``url`` in blocks of BLOCK_BYTES."""
    fs, path = filesystem(url)
    try:
        return fs.open(path, "rb", block_size=BLOCK_BYTES)
    except Exception as e:
        raise remote_error(url, e) from None


def url_listing(url: str, has_glob: bool) -> tuple[str, list[tuple[str, str, int | None]]]:
    """What a URL names: ``("file", [(url, url, size)])``; ``("glob", [(url, url, size)
    of each file matched])``; or ``("folder", [(path relative to it, url, size) of every
    file under it])``."""
    fs, path = filesystem(url)
    try:
        if has_glob:  # as a shell's (and Python's) glob: a pattern matches hidden names only when they are spelled
            found = fs.glob(path, detail=True)
            hidden = path.rstrip("/").rpartition("/")[2].startswith(".")
            return "glob", sorted((fs.unstrip_protocol(p), fs.unstrip_protocol(p), i.get("size"))
                                  for p, i in found.items() if i.get("type") != "directory"
                                  and (hidden or not p.rstrip("/").rpartition("/")[2].startswith(".")))
        info = fs.info(path)
        if info.get("type") != "directory":
            return "file", [(url, url, info.get("size"))]
        root = fs._strip_protocol(path).rstrip("/") + "/"
        found = fs.find(path, detail=True)
        return "folder", [(p[len(root):] if p.startswith(root) else p, fs.unstrip_protocol(p), i.get("size"))
                          for p, i in sorted(found.items())]
    except InputError:
        raise
    except Exception as e:
        raise remote_error(url, e) from None
