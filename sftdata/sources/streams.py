"""Byte streams: raw input (counted and hashed as it is read) -> decompressed -> UTF-8.

Every input, a local file, stdin or a URL, is read once, front to back, in bounded
chunks: the first bytes are read ahead to sniff what the input is (``Prefixed`` puts
them back), and the sha256 and block hash recorded in the metadata are computed on the
way (``Counted``).
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import hashlib
import io
import lzma
import zlib

from ..errors import InputError
from ..util.hashing import BlockHasher
from .sniff import HEAD_BYTES

READ_BYTES = 1 << 20  # one read of the decompressed text; a record longer than this is read in pieces


class Counted(io.RawIOBase):
    """The bytes of ``f`` as read, counted (``bytes``) and hashed (``hash``, ``blocks``). With
    ``remote``, any exception of the reading library becomes an ``OSError`` (a network
    library's own errors are not ``OSError``s, and no traceback may reach a user)."""

    def __init__(self, f, remote: bool = False):
        self._f = f
        self._remote = remote
        self.hash = hashlib.sha256()
        self.blocks = BlockHasher()
        self.bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            data = self._f.read(len(b))
        except OSError:
            raise
        except Exception as e:
            if not self._remote:
                raise
            raise OSError(f"{type(e).__name__}: {e}") from None
        n = len(data)
        b[:n] = data
        self.hash.update(data)
        self.blocks.update(data)
        self.bytes += n
        return n

    def drain(self) -> None:
        """Read (and hash) what is left, so that the hash covers the whole input."""
        while self.read(READ_BYTES):
            pass

    def close(self) -> None:
        try:
            self._f.close()
        finally:
            super().close()


class Prefixed(io.RawIOBase):
    """``head`` (bytes already read from ``stream`` to sniff it), then the rest of ``stream``.
    Reads return what one read of ``stream`` gives (``read1``): data decompressed before
    a damaged part of the input is returned before the error is raised."""

    def __init__(self, head: bytes, stream):
        self._head = head
        self._read = getattr(stream, "read1", None) or stream.read

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._read(len(b))
        n = len(data)
        b[:n] = data
        return n


def read_head(stream, n: int = HEAD_BYTES, damaged: tuple[type[BaseException], ...] = ()) -> bytes:
    """Up to ``n`` first bytes (fewer at the end of the stream, or before an error of the
    ``damaged`` kinds once some bytes were read: reading on raises it again)."""
    read = getattr(stream, "read1", None) or stream.read
    head = b""
    while len(head) < n:
        try:
            chunk = read(n - len(head))
        except damaged:
            if head:
                break
            raise
        if not chunk:
            break
        head += chunk
    return head


class BadText(ValueError):
    """Text that is not valid in the encoding its byte order mark announced."""

    def __init__(self, reason: str, offset: int):
        super().__init__(f"{reason} at byte {offset:,}")
        self.reason = reason
        self.offset = offset


class Recoder(io.RawIOBase):
    """UTF-8 bytes of a stream in another Unicode encoding (incrementally). Invalid text
    raises ``BadText`` with its byte offset in the stream."""

    def __init__(self, stream, codec: str):
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder(codec)("strict")
        self._buf = b""
        self._eof = False
        self._pos = 0  # bytes handed to the decoder so far

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf and not self._eof:
            chunk = self._stream.read(1 << 16)
            self._eof = not chunk
            pending = len(self._decoder.getstate()[0])
            try:
                text = self._decoder.decode(chunk, final=self._eof)
            except UnicodeDecodeError as e:
                raise BadText(e.reason, self._pos - pending + e.start) from None
            self._pos += len(chunk)
            self._buf = text.encode("utf-8")
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class Zstd(io.RawIOBase):
    """zstd frames, one after another; input that ends inside a frame raises EOFError
    (the module's stream_reader returns short data without a word). The decompressor is
    fed ``FEED`` bytes at a time: a zstd block of 4 bytes can expand to 128 KiB, so one
    feed yields at most ``FEED / 4 x 128 KiB`` (32 MiB), whatever the input."""

    FEED = 1024

    def __init__(self, f, zstandard):
        self._f = f
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._d = self._new()
        self._in = b""  # compressed bytes read but not yet fed
        self._buf = b""
        self._off = 0  # bytes of _buf already handed out
        self._eof = False
        self._started = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._off == len(self._buf) and not self._eof:
            if not self._in:
                self._in = self._f.read(1 << 16)
                if not self._in:
                    if self._started and not self._d.eof:
                        raise EOFError("the compressed data ends inside a zstd frame")
                    self._eof = True
                    break
            feed, self._in = self._in[:self.FEED], self._in[self.FEED:]
            self._started = True
            self._buf, self._off = self._d.decompress(feed), 0
            if self._d.eof:  # a frame ended: what follows is the next frame
                self._in = self._d.unused_data + self._in
                self._d = self._new()
                self._started = bool(self._in)
        n = min(len(b), len(self._buf) - self._off)
        b[:n] = self._buf[self._off:self._off + n]
        self._off += n
        return n


def zstandard_module(name: str):
    try:
        import zstandard
    except ImportError:
        raise InputError(f"{name} is zstd-compressed; reading it needs the zstandard module: pip install "
                         f"'sftdata[zstd]' (or pip install zstandard, or decompress it first: zstd -d "
                         f"{name})") from None
    return zstandard


def decompressed(f, compression: str | None, name: str):
    """A stream of ``f``'s bytes with ``compression`` undone."""
    if compression is None:
        return f
    if compression == "gzip":
        return gzip.GzipFile(fileobj=f, mode="rb")
    if compression == "bzip2":
        return bz2.BZ2File(f)
    if compression == "xz":
        return lzma.LZMAFile(f)
    return io.BufferedReader(Zstd(f, zstandard_module(name)), READ_BYTES)


def damage_errors() -> tuple[type[BaseException], ...]:
    """What a damaged or truncated compressed stream raises."""
    errors: tuple = (OSError, EOFError, zlib.error, lzma.LZMAError)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


def as_utf8(stream, encoding: str):
    """The text of a decompressed stream as UTF-8 bytes, past any byte order mark."""
    if encoding == "utf-8-sig":
        if read_head(stream, 3) != codecs.BOM_UTF8:  # sniffed from the same bytes: cannot happen
            raise InputError("the UTF-8 byte order mark changed while reading")
        return stream
    if encoding != "utf-8":
        return io.BufferedReader(Recoder(stream, encoding), 1 << 16)
    return stream


# -- what a damaged input says -----------------------------------------------------------------
def truncated(name: str, compression: str, e: BaseException, at: str | None) -> InputError:
    """A damaged compressed input stops the run: the records before the damage alone
    would make a shorter dataset that looks complete."""
    detail = str(e) or type(e).__name__
    if at is None:
        return InputError(f"{name} is a truncated or damaged {compression} file ({detail}): nothing could be read "
                          f"from it; re-download or re-create it")
    return InputError(f"{name} is a truncated or damaged {compression} file ({detail}); {at}. Stopped rather than "
                      f"keep only the records before the damage: re-download or re-create the file")


def not_text(name: str, encoding: str, e: BadText) -> InputError:
    return InputError(f"{name} is not valid {encoding.upper()} text ({e}); re-encode the file as UTF-8")


def unreadable(name: str, e: OSError) -> InputError:
    return InputError(f"input file {name} cannot be read ({e.strerror or e})")
