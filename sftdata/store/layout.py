"""File names, dtypes and small helpers of the on-disk format (see the package docstring)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import orjson

from ..errors import DatasetError

FORMAT_NAME = "sftdata"
FORMAT_VERSION = 1
METADATA_FILE = "dataset_metadata.json"
TOKENIZER_FILE = "tokenizer_state.json"
REJECTS_FILE = "rejects.jsonl"
TOKENS_FILE = "tokens.bin"
MASK_FILE = "mask.bin"
EPISODES_FILE = "episodes.idx"
SOURCES_FILE = "sources.idx"
SEGMENTS_FILE = "segments.idx"  # packed datasets: what rebuilds each row's segments
SPLITS = ("train", "val")
DEFAULT_SHARD_TOKENS = 100_000_000
IDX_DTYPE = np.dtype("<u8")


def shard_name(i: int) -> str:
    return f"shard_{i:05d}"


def token_dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32; little-endian."""
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")


def dumps_json(obj) -> bytes:
    """Deterministic, readable JSON (sorted keys, 2-space indent, trailing newline)."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


# ---------------------------------------------------------------------- packed layout
# A packed split's shard holds fixed-length rows (row_len = block_size + 1 tokens):
#   tokens.bin    rows x row_len token ids (padding included)
#   mask.bin      rows x row_len uint8, 1 = trained target (recomputed per segment)
#   episodes.idx  (start, row_len) per row, so generic readers see one "episode" per row
#   segments.idx  uint64 x 7 per segment, sorted by (row, offset), SEGMENT_FIELDS:
#                 row (local to the shard), offset in the row, length (with injected
#                 tokens), prefix (injected tokens at its start), episode (global episode
#                 id in the source split), episode_start (first episode token), source
#                 (input record number of the episode, NO_SOURCE when unknown)
SEGMENT_FIELDS = ("row", "offset", "length", "prefix", "episode", "episode_start", "source")
NO_SOURCE = np.iinfo(np.uint64).max


def read_json(path: Path) -> dict:
    try:
        obj = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise DatasetError(f"{path} is missing") from None
    except orjson.JSONDecodeError as e:
        raise DatasetError(f"{path} is not valid JSON ({e}); the file is damaged. Re-create the dataset") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{path} holds a JSON {type(obj).__name__}, not an object")
    return obj


def detect_layout(root: Path) -> str | None:
    """``sharded`` (split/shard_*/), ``flat`` (split/tokens.bin) or None."""
    for split in SPLITS:
        d = root / split
        if any(d.glob("shard_*/")) if d.is_dir() else False:
            return "sharded"
    for split in SPLITS:
        if (root / split / TOKENS_FILE).is_file():
            return "flat"
    return None


def list_shards(root: Path, split: str) -> list[Path]:
    d = root / split
    return sorted(p for p in d.glob("shard_*") if p.is_dir()) if d.is_dir() else []


def iter_files(root: Path) -> Iterable[Path]:
    """Every file of a dataset below ``root`` (for checksums), in a stable order."""
    return sorted(p for p in root.rglob("*") if p.is_file())
