"""sha256 of files: the one helper every layer uses (inputs recorded in the metadata, shard
files, tokenizer and ranks files keyed in the cache)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file as hex, read through one reused buffer (``hashlib.file_digest``):
    memory stays flat whatever the file's size."""
    with open(path, "rb", buffering=0) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# -- the block hash of an input: the same whoever reads which part of it
HASH_BLOCK_BYTES = 4 << 20


def combine_blocks(digests: list[bytes]) -> str:
    """The block hash of an input from the sha256 digests of its consecutive blocks of
    ``HASH_BLOCK_BYTES`` (the last one shorter; none for an empty input): the sha256 of
    the digests, concatenated. Tasks that read an input in byte ranges hash the blocks that
    start in their range, so no one reads the whole input for its hash."""
    return hashlib.sha256(b"".join(digests)).hexdigest()


def block_record(digest: str) -> dict:
    """What the metadata records of an input's block hash (``combine_blocks``)."""
    return {"block_bytes": HASH_BLOCK_BYTES, "sha256": digest}


class BlockHasher:
    """The digests of consecutive ``HASH_BLOCK_BYTES`` blocks of bytes fed in order."""

    def __init__(self):
        self.digests: list[bytes] = []
        self._h = hashlib.sha256()
        self._filled = 0

    def update(self, data) -> None:
        mv = memoryview(data).cast("B")
        while mv.nbytes:
            take = min(mv.nbytes, HASH_BLOCK_BYTES - self._filled)
            self._h.update(mv[:take])
            self._filled += take
            mv = mv[take:]
            if self._filled == HASH_BLOCK_BYTES:
                self.digests.append(self._h.digest())
                self._h, self._filled = hashlib.sha256(), 0

    def finish(self) -> list[bytes]:
        """Every block's digest, the last partial one included."""
        if self._filled:
            self.digests.append(self._h.digest())
            self._h, self._filled = hashlib.sha256(), 0
        return self.digests


def file_hashes(path: str | Path, whole: bool = True, read_bytes: int = 8 << 20) -> tuple[str | None, str]:
    """(sha256 of the whole file or None when not ``whole``, its block hash) in one read."""
    h, blocks = hashlib.sha256() if whole else None, BlockHasher()
    with open(path, "rb", buffering=0) as f:
        while data := f.read(read_bytes):
            if h is not None:
                h.update(data)
            blocks.update(data)
    return (None if h is None else h.hexdigest()), combine_blocks(blocks.finish())
