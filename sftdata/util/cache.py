"""The user's cache of converted tokenizer tables: what is slow to rebuild on every start
(a ranks file parsed and hashed, a ``tokenizer.json``'s vocabulary converted for
tiktoken's core and checked) is kept once, keyed by the sha256 of the file it came from.

Where: ``$SFTDATA_CACHE_DIR`` when set (tests point it at a temporary folder; ``off``
disables the cache), else ``$XDG_CACHE_HOME/sftdata``, else ``~/.cache/sftdata``.

An entry is one file, ``<kind>-v<FORMAT>-<sha256 of the source>.bin``::

    b"SFTDATA-CACHE\\x01"  sha256(body)  body
    body = u64 header length | header JSON {"meta": {...}, "arrays": {name: [dtype, shape, offset]}} | array bytes

It is written to a temporary file in the same folder and renamed into place
(``os.replace``), so two processes racing to fill it both leave a whole entry. An entry
whose checksum, header or arrays do not read back is ignored and rebuilt; a cache that
cannot be written (read-only home) only costs the rebuild.

The cache is a convenience, never evidence: its seal only says an entry was not torn,
not that it came from its source (anyone who can write the folder can write a whole,
well-sealed entry). So every user checks a hit against its source before trusting it
(``cached(..., check=)``: the ranks file's bytes, the tokenizer.json's vocabulary), and
the checks that prove a dataset (``verify --sources``, ``--retokenize``) run inside
``bypassed()``, which reads and writes no entry at all, in this process and the worker
processes it starts.

    >>> meta, arrays = cached("ranks", source_sha256, build, check)   # build() -> (meta, arrays)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson

CACHE_ENV = "SFTDATA_CACHE_DIR"
BYPASS_ENV = "SFTDATA_CACHE_BYPASS"  # set by ``bypassed()``: no entry read or written
FORMAT = 1
MAGIC = b"SFTDATA-CACHE\x01"
_DTYPES = ("uint8", "uint32", "int64")

Entry = tuple[dict, dict[str, np.ndarray]]


def cache_dir() -> Path | None:
    """The cache folder (not created here), or None when ``$SFTDATA_CACHE_DIR`` is ``off``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return None if env.lower() == "off" else Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sftdata"


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """No entry is read or written inside (``$SFTDATA_CACHE_BYPASS`` set, so the worker
    processes started inside do the same): what is built inside comes from the sources
    alone. The folder itself stays (a dataset in object storage is read through it)."""
    old = os.environ.get(BYPASS_ENV)
    os.environ[BYPASS_ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(BYPASS_ENV, None)
        else:
            os.environ[BYPASS_ENV] = old


def entry_path(kind: str, key: str) -> Path | None:
    """Where entry ``kind``/``key`` lives; None when the cache is off or ``bypassed()``."""
    root = None if os.environ.get(BYPASS_ENV) else cache_dir()
    return None if root is None else root / f"{kind}-v{FORMAT}-{key}.bin"


def encode_entry(meta: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """One entry's bytes (the format in the module docstring)."""
    layout, chunks, at = {}, [], 0
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype.name not in _DTYPES:
            raise ValueError(f"cache array {name} has dtype {arr.dtype}; use one of {_DTYPES}")
        layout[name] = [arr.dtype.name, list(arr.shape), at]
        chunks.append(arr.tobytes())
        at += arr.nbytes
    header = orjson.dumps({"meta": meta, "arrays": layout})
    body = len(header).to_bytes(8, "little") + header + b"".join(chunks)
    return MAGIC + hashlib.sha256(body).digest() + body


def decode_entry(data: bytes) -> Entry | None:
    """An entry's ``(meta, arrays)``, or None when it is not a whole, intact entry."""
    start = len(MAGIC) + 32
    if len(data) < start + 8 or not data.startswith(MAGIC):
        return None
    body = memoryview(data)[start:]
    if hashlib.sha256(body).digest() != data[len(MAGIC):start]:
        return None
    n = int.from_bytes(body[:8], "little")
    try:
        header = orjson.loads(body[8:8 + n])
        base = 8 + n
        arrays = {}
        for name, (dtype, shape, at) in header["arrays"].items():
            if dtype not in _DTYPES:
                return None
            count = int(np.prod(shape, dtype=np.int64))
            arrays[name] = np.frombuffer(body, dtype=dtype, count=count, offset=base + at).reshape(shape)
        return header["meta"], arrays
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def read_entry(kind: str, key: str) -> Entry | None:
    path = entry_path(kind, key)
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return decode_entry(data)


def write_entry(kind: str, key: str, meta: dict, arrays: dict[str, np.ndarray]) -> Path | None:
    """Write an entry atomically; None (and nothing left behind) when the folder is not writable."""
    path = entry_path(kind, key)
    if path is None:
        return None
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(encode_entry(meta, arrays))
        os.replace(tmp, path)  # atomic: a racing process sees the old entry, none, or a whole new one
        return path
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return None


def cached(kind: str, key: str, build: Callable[[], Entry], check: Callable[[Entry], bool] | None = None) -> Entry:
    """The entry ``kind``/``key`` from the cache when ``check(entry)`` (held against its
    source) says it is the one ``build()`` gives, else ``build()`` stored there and
    returned."""
    hit = read_entry(kind, key)
    if hit is not None and (check is None or check(hit)):
        return hit
    meta, arrays = build()
    write_entry(kind, key, meta, arrays)
    return meta, arrays
