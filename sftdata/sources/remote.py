"""URLs (``s3://``, ``gs://``, ``hf://``, ``https://``, ``file://`` ...) through fsspec.

A URL is opened as a seekable file that fetches ``BLOCK_BYTES`` at a time as it is read:
streamed, never downloaded whole first. fsspec, and each protocol's own package, are
optional: a missing one is a one-line error naming the pip extra that adds it.
"""

from __future__ import annotations

import re

from ..errors import InputError, SftDataError

EXTRA = "cloud"  # pip install 'sftdata[cloud]'
BLOCK_BYTES = 8 << 20  # bytes fetched per request, and the read-ahead held in memory
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
# protocol -> the package fsspec needs for it (fsspec itself does file://, memory://)
PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "hf": "huggingface_hub",
            "http": "aiohttp", "https": "aiohttp", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}


def url_protocol(text: str) -> str | None:
    """The protocol of a URL (``s3``), or None for a local path (``C:\\data`` included)."""
    m = _URL.match(text)
    return m.group(1).lower() if m else None


def _fsspec(url: str, verb: str, error: type[SftDataError]):
    try:
        import fsspec
    except ImportError:
        raise error(f"{url}: {verb} URLs needs fsspec: pip install 'sftdata[{EXTRA}]' (or pip install "
                    f"fsspec)") from None
    return fsspec


def filesystem(url: str, verb: str = "reading", error: type[SftDataError] = InputError):
    """(fsspec file system, path inside it) for a URL. A missing package is one ``error``
    line: ``URL: {verb} s3:// URLs needs s3fs: pip install 'sftdata[cloud]' ...``."""
    fsspec = _fsspec(url, verb, error)
    protocol = url_protocol(url) or "file"
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError:
        package = PACKAGES.get(protocol, f"the fsspec implementation of {protocol}://")
        raise error(f"{url}: {verb} {protocol}:// URLs needs {package}: pip install 'sftdata[{EXTRA}]' "
                    f"(or pip install {package})") from None
    except ValueError as e:
        raise error(f"{url}: {protocol}:// is not a protocol fsspec knows ({e}); give a local path or an "
                    f"s3://, gs://, hf://, https:// or file:// URL") from None
    except Exception as e:  # a protocol's own errors (credentials, configuration)
        raise error(f"{url} cannot be opened ({type(e).__name__}: {e})") from None


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
