"""The on-disk dataset format: the only package that knows file names and layout.

::

    DATASET/
    ├── dataset_metadata.json      written last; counts, options, sha256 of every file
    ├── tokenizer_state.json
    ├── rejects.jsonl              (prepare) rejected records and why
    ├── serving.json               stop ids, pad id, BOS policy, template (``serving``)
    ├── train/shard_00000/{tokens.bin, mask.bin, episodes.idx, sources.idx}
    └── val/shard_00000/...

``episodes.idx`` is little-endian uint64 (start, length) pairs, 16 bytes per episode;
``sources.idx`` one uint64 record number per episode. The global episode id of a split
is the position in the concatenation of its shards in name order.

- ``format``: file names, dtypes, format name and version, the token-dtype rules;
- ``reader``: ``scan_dataset`` (tolerant: what could be opened plus every structural
  ``Problem``) and ``open_dataset`` (strict: the dataset, or ``DatasetError`` with the
  first problem); readers memory-map, and survive pickling into worker processes (they
  reopen by path);
- ``shard`` / ``structure``: one shard's files, and the structural checks;
- ``writer``: ``DatasetWriter`` builds everything in a hidden temporary folder beside
  the target and renames it into place only on a clean ``commit``; an error, Ctrl-C or
  crash leaves nothing at the target.
"""

from __future__ import annotations

from ..packing import Segments
from ..sources import sha256_file
from .format import (
    DEFAULT_SHARD_TOKENS,
    EPISODES_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    IDX_DTYPE,
    MASK_FILE,
    METADATA_FILE,
    NO_SOURCE,
    PARTS_DIR,
    RECREATE,
    REJECTS_FILE,
    REPACK,
    SEGMENT_FIELDS,
    SEGMENTS_FILE,
    SERVING_FILE,
    SOURCES_FILE,
    SPLITS,
    STAGING_SPLIT,
    STOP_FILE,
    TOKEN_DTYPES,
    TOKENIZER_FILE,
    TOKENS_FILE,
    Problem,
    detect_layout,
    dumps_json,
    iter_files,
    list_shards,
    read_json,
    shard_name,
    token_dtype_for,
)
from .location import local_path, remote_url
from .object_cache import dataset_path, fetch_dataset, remote_metadata
from .reader import Dataset, Scan, has_episode_index, open_dataset, open_token_stream, scan_dataset
from .serving_file import episode_first_ids, read_serving, write_serving
from .shard import Shard, Split, split_segments
from .writer import DatasetWriter, PackedSplitWriter, ShardInfo, SplitWriter

__all__ = [
    "DEFAULT_SHARD_TOKENS", "EPISODES_FILE", "FORMAT_NAME", "FORMAT_VERSION", "IDX_DTYPE", "MASK_FILE",
    "METADATA_FILE", "NO_SOURCE", "REJECTS_FILE", "SEGMENT_FIELDS", "SEGMENTS_FILE", "PARTS_DIR", "STAGING_SPLIT", "STOP_FILE",
    "SERVING_FILE", "SOURCES_FILE", "SPLITS",
    "TOKEN_DTYPES", "TOKENIZER_FILE", "TOKENS_FILE", "detect_layout", "dumps_json", "iter_files", "list_shards",
    "read_json", "sha256_file", "shard_name", "token_dtype_for", "Segments", "split_segments", "Problem", "RECREATE",
    "REPACK", "Dataset", "Scan", "Shard", "Split", "has_episode_index", "open_dataset", "open_token_stream",
    "scan_dataset", "episode_first_ids", "read_serving", "write_serving", "DatasetWriter", "PackedSplitWriter",
    "ShardInfo", "SplitWriter", "local_path", "remote_url", "dataset_path", "fetch_dataset", "remote_metadata",
]
