"""Reading input files as a stream of records, keeping where each came from.

What a file holds is decided by its first bytes, never by its name (``sniff``):

* compression: gzip, bzip2, xz, or zstd (zstd needs the ``zstandard`` module). A
  compressed file that ends early or is damaged is an error naming the file and the last
  complete line read: a silently shorter dataset would be worse;
* text encoding: UTF-8 (a leading byte order mark is skipped), or UTF-16 / UTF-32 with a
  byte order mark (recoded to UTF-8 as it is read);
* container: JSON Lines (one JSON value per line), streamed line by line, so memory does
  not grow with the file (blank lines are skipped); or a JSON array (the first non-blank
  character is ``[``), read whole;
* anything else (zip or tar archives, Parquet, Arrow, SQLite, executables, any file with
  a NUL byte in its first KiB) is refused with one line naming what it looks like, never
  read as N bad records.

Record numbers are global and 0-based: for JSONL the record number of a line is its
0-based line index plus the record offset of its file; for arrays, the item index plus
the offset. With several inputs, file ``k`` starts at the sum of the earlier files'
record counts. ``where`` strings name the file and the 1-based line (or the 0-based
array item) for error messages.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import hashlib
import io
import lzma
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import InputError
from .exact_json import InexactJSON, loads

HEAD_BYTES = 4096  # read to sniff a file; the binary test looks at the first KiB of it
BINARY_WINDOW = 1024

# first bytes -> compression; a supported compression is undone before the text is sniffed
COMPRESSIONS = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zXZ\x00", "xz"))
# byte order marks -> the codec reading the text (UTF-32 first: its LE mark starts like UTF-16's)
BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
PARQUET_HINT = ("Parquet input is not supported yet: convert it to JSON Lines first, e.g. with pandas: "
                "pd.read_parquet(FILE).to_json(OUT, orient='records', lines=True, force_ascii=False)")
# first bytes -> (what the file is, an archive?, what to do); refused with one line
REFUSED = (
    (b"PK\x03\x04", "a zip archive", True, "unpack it first"),
    (b"PK\x05\x06", "a zip archive", True, "unpack it first"),
    (b"PK\x07\x08", "a zip archive", True, "unpack it first"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", True, "unpack it first"),
    (b"Rar!\x1a\x07", "a RAR archive", True, "unpack it first"),
    (b"PAR1", "a Parquet file", False, PARQUET_HINT),
    (b"ARROW1", "an Arrow/Feather file", False, "convert it to JSON Lines first"),
    (b"SQLite format 3\x00", "an SQLite database", False, "export the conversations as JSON Lines first"),
    (b"\x7fELF", "an executable (ELF)", False, "give the file of conversations"),
    (b"MZ", "a Windows executable", False, "give the file of conversations"),
    (b"%PDF-", "a PDF document", False, "give the file of conversations"),
    (b"\x89PNG", "a PNG image", False, "give the file of conversations"),
    (b"\x93NUMPY", "a NumPy array file", False, "give the file of conversations"),
)


@dataclass
class SourceInfo:
    path: str
    sha256: str
    bytes: int
    container: str  # "jsonl" | "json"
    compressed: bool
    first_record: int = 0
    records: int = 0  # record numbers used (lines incl. blank ones, or array items)
    # how the bytes are read (sniffed again from the file, so not recorded in the metadata)
    compression: str | None = None  # "gzip" | "bzip2" | "xz" | "zstd"
    encoding: str = "utf-8"  # the codec reading the text: "utf-8", "utf-8-sig", "utf-16", "utf-32"

    def as_dict(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes, "container": self.container,
                "compressed": self.compressed, "first_record": self.first_record, "records": self.records}


@dataclass
class RawRecord:
    record: int  # global 0-based record number
    where: str  # "file:line N" / "file:item N"
    raw: Any  # bytes of one JSONL line, or an already decoded array item


# -- sniffing (pure: bytes in, a name or a refusal out) ------------------------------------
def compression_of(head: bytes) -> str | None:
    """The compression the first bytes announce, or None."""
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0":
        return "bzip2"
    return next((name for magic, name in COMPRESSIONS if head.startswith(magic)), None)


def encoding_of(head: bytes) -> str:
    """The codec for the text from its byte order mark (UTF-8 without one)."""
    return next((codec for bom, codec in BOMS if head.startswith(bom)), "utf-8")


def refusal(head: bytes, name: str, compression: str | None = None) -> str | None:
    """Why a file whose (decompressed) text starts with ``head`` cannot be read as JSON
    Lines or a JSON array, as one line naming it; None when it can be tried."""
    packed = f" ({compression}-compressed)" if compression else ""
    if len(head) > 262 and head[257:262] == b"ustar":
        return f"{name} is a tar archive{packed}; unpack it first"
    for magic, what, archive, todo in REFUSED:
        if head.startswith(magic):
            todo = todo.replace("FILE", repr(name))
            if archive:
                return f"{name} is {what}{packed}; {todo}"
            return f"{name} looks like {what}{packed}, not JSON Lines; {todo}"
    inner = compression_of(head)
    if inner:
        return f"{name} is compressed twice ({compression}, then {inner}); decompress it once and give the result"
    if encoding_of(head) != "utf-8":
        return None
    window = head[:BINARY_WINDOW]
    nul = window.find(b"\x00")
    if nul >= 0:
        even, odd = window[0::2], window[1::2]
        if odd and odd.count(0) > 0.9 * len(odd) and even.count(0) == 0:
            return (f"{name} looks like UTF-16 text (little-endian) without a byte order mark{packed}; re-encode "
                    f"it as UTF-8 (iconv -f UTF-16LE -t UTF-8)")
        if even and even.count(0) > 0.9 * len(even) and odd.count(0) == 0:
            return (f"{name} looks like UTF-16 text (big-endian) without a byte order mark{packed}; re-encode "
                    f"it as UTF-8 (iconv -f UTF-16BE -t UTF-8)")
        return (f"{name} is a binary file{packed}, not JSON Lines or a JSON array (a NUL byte at offset {nul}); "
                f"give the conversations as text, one JSON object per line")
    controls = sum(window.count(bytes([c])) for c in range(32) if c not in (9, 10, 13))
    if controls > len(window) // 20:  # JSON text has none outside strings, and strings escape them
        return (f"{name} is a binary file{packed}, not JSON Lines or a JSON array ({controls} control bytes in "
                f"its first {len(window)}); give the conversations as text, one JSON object per line")
    return None


# -- opening: raw file -> decompressed bytes -> UTF-8 bytes ---------------------------------
class BadText(ValueError):
    """Text that is not valid in the encoding its byte order mark announced."""

    def __init__(self, reason: str, offset: int):
        super().__init__(f"{reason} at byte {offset:,}")
        self.reason = reason
        self.offset = offset


class _Recoder(io.RawIOBase):
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


class _Zstd(io.RawIOBase):
    """zstd frames, one after another; input that ends inside a frame raises EOFError
    (the module's stream_reader returns short data without a word)."""

    def __init__(self, f, zstandard):
        self._f = f
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._d = self._new()
        self._buf = b""
        self._eof = False
        self._started = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf and not self._eof:
            chunk = self._f.read(1 << 16)
            if not chunk:
                if self._started and not self._d.eof:
                    raise EOFError("the compressed data ends inside a zstd frame")
                self._eof = True
                break
            while chunk:
                self._started = True
                self._buf += self._d.decompress(chunk)
                chunk = b""
                if self._d.eof:  # a frame ended: what follows is the next frame
                    chunk = self._d.unused_data
                    self._d = self._new()
                    self._started = bool(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _zstandard(name: str):
    try:
        import zstandard
    except ImportError:
        raise InputError(f"{name} is zstd-compressed; reading it needs the zstandard module: pip install "
                         f"zstandard (or decompress it first: zstd -d {name})") from None
    return zstandard


def _decompressed(f, compression: str | None, name: str):
    if compression is None:
        return f
    if compression == "gzip":
        return gzip.GzipFile(fileobj=f, mode="rb")
    if compression == "bzip2":
        return bz2.BZ2File(f)
    if compression == "xz":
        return lzma.LZMAFile(f)
    return io.BufferedReader(_Zstd(f, _zstandard(name)))


def _damage_errors() -> tuple[type[BaseException], ...]:
    """What a damaged or truncated compressed stream raises."""
    errors: tuple = (OSError, EOFError, zlib.error, lzma.LZMAError)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


def _open(path: Path, compression: str | None, encoding: str):
    """(stream of the file's text as UTF-8 bytes, past any byte order mark; the raw file)."""
    f = open(path, "rb")
    stream = _decompressed(f, compression, str(path))
    if encoding == "utf-8-sig":
        stream.read(3)
    elif encoding != "utf-8":
        stream = io.BufferedReader(_Recoder(stream, encoding), 1 << 16)
    return stream, f


def _truncated(p: Path, compression: str, e: BaseException, at: str | None) -> InputError:
    """A damaged compressed input stops the run: the records before the damage alone
    would make a shorter dataset that looks complete."""
    detail = str(e) or type(e).__name__
    if at is None:
        return InputError(f"{p} is a truncated or damaged {compression} file ({detail}): nothing could be read "
                          f"from it; re-download or re-create it")
    return InputError(f"{p} is a truncated or damaged {compression} file ({detail}); {at}. Stopped rather than "
                      f"keep only the records before the damage: re-download or re-create the file")


def _last_line(lines: int) -> str:
    return f"the last complete line is line {lines}" if lines else "it ends before its first complete line"


def _not_text(p: Path, encoding: str, e: BadText) -> InputError:
    return InputError(f"{p} is not valid {encoding.upper()} text ({e}); re-encode the file as UTF-8")


def _unreadable(p: Path, e: OSError) -> InputError:
    return InputError(f"input file {p} cannot be read ({e.strerror or e})")


def _head(stream, p: Path, compression: str) -> bytes:
    """The first HEAD_BYTES of a decompressed stream, or fewer when it is damaged after
    some (reading it again says where)."""
    head = b""
    while len(head) < HEAD_BYTES:
        try:
            chunk = stream.read1(HEAD_BYTES - len(head))
        except _damage_errors() as e:
            if head:
                break
            raise _truncated(p, compression, e, None) from None
        if not chunk:
            break
        head += chunk
    return head


def inspect_source(path: str | Path) -> SourceInfo:
    """Hash the file and sniff what it holds, failing early with a one-line message."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"input file {p} does not exist")
    if not p.is_file():
        raise InputError(f"input {p} is not a file")
    h = hashlib.sha256()
    try:
        with open(p, "rb") as f:
            raw_head = f.read(HEAD_BYTES)
            h.update(raw_head)
            while True:
                b = f.read(8 << 20)
                if not b:
                    break
                h.update(b)
    except PermissionError:
        raise InputError(f"input file {p} is not readable (permission denied)") from None
    except OSError as e:
        raise _unreadable(p, e) from None
    compression = compression_of(raw_head)
    head = raw_head
    if compression:
        with open(p, "rb") as f:
            head = _head(_decompressed(f, compression, str(p)), p, compression)
    why = refusal(head, str(p), compression)
    if why:
        raise InputError(why)
    encoding = encoding_of(head)
    text = head
    if encoding != "utf-8":  # a few characters find the container; bad text is reported where it is
        text = codecs.getincrementaldecoder(encoding)("replace").decode(head).encode("utf-8")
    container = "json" if text.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] == b"[" else "jsonl"
    return SourceInfo(str(path), h.hexdigest(), p.stat().st_size, container, compression is not None,
                      compression=compression, encoding=encoding)


def iter_records(info: SourceInfo) -> Iterator[tuple[RawRecord, int]]:
    """Yield (record, bytes of the file consumed so far) for one source."""
    p = Path(info.path)
    damaged = _damage_errors() if info.compression else ()
    stream, raw = _open(p, info.compression, info.encoding)
    with raw:
        if info.container == "json":
            try:
                data = loads(stream.read())  # integers beyond 64 bits stay exact (see exact_json)
            except (orjson.JSONDecodeError, InexactJSON) as e:
                raise InputError(f"{p}: not a valid JSON array ({e}); fix the file or convert it to "
                                 f"JSONL (one conversation per line) to skip bad records") from None
            except BadText as e:
                raise _not_text(p, info.encoding, e) from None
            except damaged as e:
                raise _truncated(p, info.compression, e, "the JSON array could not be read whole") from None
            except OSError as e:
                raise _unreadable(p, e) from None
            if not isinstance(data, list):
                raise InputError(f"{p}: top-level JSON is a {type(data).__name__}, expected an array of records")
            for i, item in enumerate(data):
                yield RawRecord(info.first_record + i, f"{p}:item {i}", item), info.bytes
            info.records = len(data)
            return
        lines = 0
        try:
            for line in stream:
                if line.strip():
                    yield RawRecord(info.first_record + lines, f"{p}:line {lines + 1}", line), raw.tell()
                lines += 1
        except BadText as e:
            raise _not_text(p, info.encoding, e) from None
        except damaged as e:
            raise _truncated(p, info.compression, e, _last_line(lines)) from None
        except OSError as e:
            raise _unreadable(p, e) from None
        info.records = lines


def iter_all(infos: list[SourceInfo]) -> Iterator[tuple[RawRecord, int]]:
    """Records of several sources in order, with cumulative bytes consumed."""
    done = 0
    offset = 0
    for info in infos:
        info.first_record = offset
        for rec, pos in iter_records(info):
            yield rec, done + pos
        done += info.bytes
        offset += info.records
