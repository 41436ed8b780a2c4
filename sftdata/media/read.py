"""A media reference resolved to its bytes and their sha256.

A reference is what a record names: a path (relative to the record file's folder, or to
``media_root`` when one is given), a ``file://`` URL, a ``data:`` URL (base64 or
percent-encoded), or any other URL fsspec opens (``s3://``, ``hf://`` ..., the ``cloud``
extra). A reference that names nothing is ``media_missing``; one that cannot be read, or
is larger than ``max_bytes``, is ``media_unreadable``: both a ``MediaError`` naming the
reference, never a traceback.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlsplit

from ..errors import SftDataError
from ..util.urls import filesystem, url_protocol
from .errors import MEDIA_MISSING, MEDIA_UNREADABLE, MediaError

MAX_MEDIA_BYTES = 256 << 20  # one image or clip; a larger file is refused, not read into memory


@dataclass(frozen=True)
class MediaBytes:
    """``uri``: where the bytes came from (a resolved path, the URL, or ``data:`` for an inline
    item); ``sha256``: hex digest of ``data``."""

    uri: str
    data: bytes
    sha256: str


def resolve_path(ref: str, base: str | Path | None = None, media_root: str | Path | None = None) -> Path:
    """The file a local reference names: ``file://`` URLs unquoted, absolute paths as they are,
    relative ones against ``media_root`` if given, else the record file's folder ``base``
    (else the working directory)."""
    if ref.startswith("file://"):
        parts = urlsplit(ref)
        return Path(unquote_to_bytes(parts.path).decode("utf-8", "surrogateescape"))
    path = Path(ref)
    if path.is_absolute():
        return path
    root = media_root if media_root is not None else base
    return Path(root) / path if root is not None else path


def decode_data_url(ref: str) -> bytes:
    """The bytes of a ``data:[<type>][;base64],<payload>`` URL; a malformed one is
    ``media_unreadable``."""
    head, sep, payload = ref[5:].partition(",")
    if not sep:
        raise MediaError(MEDIA_UNREADABLE, "a data: URL without ',' before its payload: write "
                         "data:image/png;base64,<base64 bytes>", where=_short(ref))
    if head.endswith(";base64"):
        try:
            return base64.b64decode("".join(payload.split()), validate=True)
        except (binascii.Error, ValueError) as e:
            raise MediaError(MEDIA_UNREADABLE, f"the data: URL's base64 payload is invalid ({e})",
                             where=_short(ref)) from None
    return unquote_to_bytes(payload)


def _short(ref: str) -> str:
    """A reference as an error names it: an inline item is cut after 48 characters."""
    return ref if len(ref) <= 64 or not ref.startswith("data:") else ref[:48] + "..."


def _read_local(path: Path, ref: str, max_bytes: int) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise MediaError(MEDIA_MISSING, f"no such file: {path} (a relative path is read from the record "
                         f"file's folder, or from --media-root when given)", where=ref) from None
    except IsADirectoryError:
        raise MediaError(MEDIA_UNREADABLE, f"{path} is a folder, not a media file", where=ref) from None
    except OSError as e:
        raise MediaError(MEDIA_UNREADABLE, f"{path} cannot be read ({e.strerror or e})", where=ref) from None
    return data


def _read_url(ref: str, max_bytes: int) -> bytes:
    try:
        fs, path = filesystem(ref)
        with fs.open(path, "rb") as f:
            return f.read(max_bytes + 1)
    except FileNotFoundError:
        raise MediaError(MEDIA_MISSING, f"no object at {ref}", where=ref) from None
    except SftDataError as e:
        raise MediaError(MEDIA_UNREADABLE, str(e), where=ref) from None
    except Exception as e:  # a protocol's own errors (network, credentials)
        raise MediaError(MEDIA_UNREADABLE, f"{ref} cannot be read ({type(e).__name__}: {e})", where=ref) from None


def read_media(ref: str, base: str | Path | None = None, media_root: str | Path | None = None,
               max_bytes: int = MAX_MEDIA_BYTES) -> MediaBytes:
    """The bytes a reference names and their sha256 (see the module's docstring)."""
    if not isinstance(ref, str) or not ref:
        raise MediaError(MEDIA_UNREADABLE, f"a media reference must be a non-empty string, got {ref!r}")
    if ref.startswith("data:"):
        data, uri = decode_data_url(ref), "data:"
    elif url_protocol(ref) not in (None, "file"):
        data, uri = _read_url(ref, max_bytes), ref
    else:
        path = resolve_path(ref, base, media_root)
        data, uri = _read_local(path, ref, max_bytes), str(path)
    if len(data) > max_bytes:
        raise MediaError(MEDIA_UNREADABLE, f"larger than {max_bytes:,} bytes, the most one media item may be",
                         where=_short(ref))
    return MediaBytes(uri=uri, data=data, sha256=hashlib.sha256(data).hexdigest())
