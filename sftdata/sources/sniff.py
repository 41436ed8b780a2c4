"""What a file holds, from its first bytes (pure: bytes in, a name or a refusal out).

Never from its name: a ``.jsonl.gz`` that is plain text is read as text, a ``.jsonl``
that is gzip is decompressed, a ``.jsonl`` that is a zip archive is refused.
"""

from __future__ import annotations

import codecs

HEAD_BYTES = 4096  # read to sniff a file; the binary test looks at the first KiB of it
BINARY_WINDOW = 1024
PARQUET_MAGIC = b"PAR1"

# first bytes -> compression; a supported compression is undone before the text is sniffed
COMPRESSIONS = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zXZ\x00", "xz"))
# byte order marks -> the codec reading the text (UTF-32 first: its LE mark starts like UTF-16's)
BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
# first bytes -> (what the file is, an archive?, what to do); refused with one line
REFUSED = (
    (b"PK\x03\x04", "a zip archive", True, "unpack it first"),
    (b"PK\x05\x06", "a zip archive", True, "unpack it first"),
    (b"PK\x07\x08", "a zip archive", True, "unpack it first"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", True, "unpack it first"),
    (b"Rar!\x1a\x07", "a RAR archive", True, "unpack it first"),
    (b"ARROW1", "an Arrow/Feather file", False, "convert it to Parquet or JSON Lines first"),
    (b"SQLite format 3\x00", "an SQLite database", False, "export the conversations as JSON Lines first"),
    (b"\x7fELF", "an executable (ELF)", False, "give the file of conversations"),
    (b"MZ", "a Windows executable", False, "give the file of conversations"),
    (b"%PDF-", "a PDF document", False, "give the file of conversations"),
    (b"\x89PNG", "a PNG image", False, "give the file of conversations"),
    (b"\x93NUMPY", "a NumPy array file", False, "give the file of conversations"),
)


def compression_of(head: bytes) -> str | None:
    """The compression the first bytes announce, or None."""
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0":
        return "bzip2"
    return next((name for magic, name in COMPRESSIONS if head.startswith(magic)), None)


def encoding_of(head: bytes) -> str:
    """The codec for the text from its byte order mark (UTF-8 without one)."""
    return next((codec for bom, codec in BOMS if head.startswith(bom)), "utf-8")


def container_of(head: bytes, encoding: str = "utf-8") -> str:
    """``parquet``, ``json`` (an array: the first non-blank character is ``[``) or
    ``jsonl``, for a (decompressed) head that ``refusal`` accepted."""
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    text = head
    if encoding != "utf-8":  # a few characters find the container; bad text is reported where it is
        text = codecs.getincrementaldecoder(encoding)("replace").decode(head).encode("utf-8")
    return "json" if text.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] == b"[" else "jsonl"


def refusal(head: bytes, name: str, compression: str | None = None) -> str | None:
    """Why a file whose (decompressed) text starts with ``head`` cannot be read as JSON
    Lines, a JSON array or Parquet, as one line naming it; None when it can be tried."""
    packed = f" ({compression}-compressed)" if compression else ""
    if len(head) > 262 and head[257:262] == b"ustar":
        return f"{name} is a tar archive{packed}; unpack it first"
    if head.startswith(PARQUET_MAGIC) and compression:  # Parquet compresses inside; it needs random access
        return f"{name} is a Parquet file{packed}; decompress it first (Parquet is read in place, not as a stream)"
    for magic, what, archive, todo in REFUSED:
        if head.startswith(magic):
            if archive:
                return f"{name} is {what}{packed}; {todo}"
            return f"{name} looks like {what}{packed}, not JSON Lines; {todo}"
    inner = compression_of(head)
    if inner:
        return f"{name} is compressed twice ({compression}, then {inner}); decompress it once and give the result"
    if encoding_of(head) != "utf-8" or head.startswith(PARQUET_MAGIC):
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
