"""fsspec for a URL (``s3://``, ``gs://``, ``hf://``, ``https://``, ``memory://`` ...): the
file system and path it names, or one line naming the pip extra that adds a missing
package. fsspec is imported only when a URL is opened. Used by the inputs
(``sources.remote``) and by datasets in object storage (``storage.location``).
"""

from __future__ import annotations

import re

from ..errors import InputError, SftDataError

EXTRA = "cloud"  # pip install 'sftdata[cloud]'
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


# what an object store says of an object's version: its content checksum or tag, a generation
# number, or its modification time (s3: ETag, LastModified; gcs: md5Hash, crc32c, generation,
# updated; hf: the blob id; fsspec's memory and local file systems: created, mtime)
VERSION_FIELDS = ("ETag", "etag", "md5Hash", "crc32c", "generation", "VersionId", "version_id", "blob_id",
                  "LastModified", "last_modified", "updated", "mtime", "created")


def object_version(info: dict) -> dict | None:
    """What tells one version of an object from another, from its fsspec ``info``: its size
    and whichever ``VERSION_FIELDS`` the store gives, as JSON-safe text; None when it gives
    none of them (the size alone cannot tell two versions apart)."""
    found = {k: str(info[k]) for k in VERSION_FIELDS if info.get(k) is not None}
    return {"size": info.get("size"), **found} if found else None
