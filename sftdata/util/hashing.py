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
