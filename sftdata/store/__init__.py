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

``sftdata.store`` itself names the reading API (what a training process loads anyway);
writing, locks, object storage and ``serving.json`` are imported from their modules.
"""

from __future__ import annotations

from ..storage import FORMAT_NAME, METADATA_FILE, SPLITS, read_json
from .format import EPISODES_FILE, FORMAT_VERSION, MASK_FILE, SOURCES_FILE, TOKENIZER_FILE, TOKENS_FILE, Problem
from .reader import Dataset, Scan, has_episode_index, open_dataset, open_token_stream, scan_dataset
from .shard import Shard, Split, split_segments

__all__ = [
    "EPISODES_FILE", "FORMAT_NAME", "FORMAT_VERSION", "MASK_FILE", "METADATA_FILE", "SOURCES_FILE", "SPLITS",
    "TOKENIZER_FILE", "TOKENS_FILE", "Problem", "read_json", "Dataset", "Scan", "has_episode_index", "open_dataset",
    "open_token_stream", "scan_dataset", "Shard", "Split", "split_segments",
]
