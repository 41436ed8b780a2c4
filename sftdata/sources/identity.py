"""What an input is, cheaply: its identity on the file system and the sha256 of its content,
hashed again only when that identity changed since it was recorded (as git's index and
make do).

* a local file's identity is its ``os.stat``: size, mtime_ns, ctime_ns, inode and device
  (any write, a replacing rename or a copy with the old mtime changes one of them);
* a URL's is what its store says of the object: size plus its ETag, checksum, generation
  or modification time (``util.urls.object_version``); a URL whose store says none of
  these has no identity and is hashed (read whole) every time;
* standard input has none, and its content is known only once it has been read.

The identity recorded is the one taken before the input was read, when it is the same
after (an input that changed while it was read is hashed again next time). It is trusted
only when the file had not changed for ``RACY_NS`` before the build was committed (the
metadata file's own mtime, the file system's clock): a file written just before it was
read could change again within the same timestamp tick and keep its size, unseen, so it
is hashed again, as git does with a "racily clean" index entry. No clock of this process
decides anything, so the recorded bytes depend on the files alone.

A dataset that is up to date is never rewritten, so an input touched since its build (the
same bytes, another stat) is hashed on every run (at the disk's speed: a sha256 runs at
about 1-2 GB/s). Its sha256 is not kept in the user's cache: a cached hash is evidence
nothing can check without reading the file again, and a forged entry would make a changed
input "up to date" (the cache is a convenience, never evidence: ``util.cache``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from ..errors import InputError
from ..util.hashing import sha256_file
from ..util.urls import object_version
from .inputs import Input
from .remote import BLOCK_BYTES, filesystem, open_url, remote_error
from .streams import unreadable

RACY_NS = 2_000_000_000  # a file changed less than this before its build was committed is hashed again


@dataclass(frozen=True)
class Looked:
    """An input's identity as found now (None: it has none, see the module docstring)."""

    identity: dict | None


def look(inp: Input) -> Looked:
    """The identity of ``inp`` now. A local file that cannot be stat'ed has none (reading it
    says why)."""
    if inp.kind == "stdin":
        return Looked(None)
    if inp.kind == "url":
        try:
            fs, path = filesystem(inp.name)
            return Looked(object_version(fs.info(path)))
        except Exception:  # reading the URL names the problem
            return Looked(None)
    try:
        st = os.stat(inp.name)
    except OSError:
        return Looked(None)
    return Looked({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
                   "dev": st.st_dev})


def trusted(identity: dict | None, written_ns: int | None) -> bool:
    """May a recorded identity stand for the recorded content? A URL's version always; a
    file's stat when the file was last changed ``RACY_NS`` or more before the build that
    recorded it was committed at ``written_ns`` (None: unknown, not trusted)."""
    if identity is None:
        return False
    if "mtime_ns" not in identity:
        return True
    return written_ns is not None and max(identity["mtime_ns"], identity.get("ctime_ns", 0)) + RACY_NS <= written_ns


def content_sha256(inp: Input) -> str:
    """The sha256 of the bytes of ``inp`` as stored (compressed inputs: of the compressed
    bytes), the value prepare records for it. Not for standard input."""
    if inp.kind == "url":
        h = hashlib.sha256()
        try:
            with open_url(inp.name) as f:
                while chunk := f.read(BLOCK_BYTES):
                    h.update(chunk)
        except InputError:
            raise
        except Exception as e:
            raise remote_error(inp.name, e) from None
        return h.hexdigest()
    try:
        return sha256_file(inp.name)
    except FileNotFoundError:
        raise InputError(f"input file {inp.name} does not exist") from None
    except OSError as e:
        raise unreadable(inp.name, e) from None


def known_sha256(inp: Input, looked: Looked, recorded: dict | None, written_ns: int | None = None
                 ) -> tuple[str | None, bool]:
    """(sha256 of ``inp``'s content, whether it was read to know it): the ``recorded`` one
    (``{"sha256", "identity"}`` of the build committed at ``written_ns``) when the identity
    is unchanged and ``trusted``; else hashed now. A recorded sha256 of None (a
    Parquet URL read in part) stays None while the identity holds; once it changes the
    content is unknown and None is returned unread (the build key then holds the new
    identity in its place: ``store.build_key.input_component``)."""
    if recorded is not None and looked.identity is not None and recorded.get("identity") == looked.identity \
            and trusted(looked.identity, written_ns):
        return recorded.get("sha256"), False
    if recorded is not None and recorded.get("sha256") is None and inp.kind == "url":
        return None, False
    return content_sha256(inp), True


def recordable(before: Looked, after: Looked) -> dict | None:
    """The identity to record beside the sha256 of what was read between two looks: the
    first, when the input did not change while it was read."""
    return before.identity if before.identity == after.identity else None


__all__ = ["RACY_NS", "Looked", "content_sha256", "known_sha256", "look", "recordable", "trusted"]
