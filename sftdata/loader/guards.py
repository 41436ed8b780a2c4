"""What the loader refuses before the first batch, from figures it already has (the
metadata, the config), never a pass over the data:

* a train split with nothing to train on: 0 episodes (packed: rows), or 0 trained
  tokens when the loss uses the mask (``NothingToTrainError``);
* a shard whose token ids reach past the vocabulary, or whose mask holds values other
  than 0/1, from the ``token_id_range`` / ``mask_value_range`` the writer records per
  shard (``DatasetError`` naming the shard). A dataset written before those were
  recorded is opened as before; ``sftdata verify`` reads the data itself;
* a batch that does not fit in the memory available (``ConfigError`` with both
  figures), rather than a process the out-of-memory killer ends.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, DatasetError, NothingToTrainError, UsageError
from ..order.config import LoaderConfig
from ..storage import METADATA_FILE
from ..store.format import TOKENIZER_FILE, shard_record
from ..store.reader import Dataset
from ..util.memory import check_fits

# peak bytes per (row, position) cell while a batch is built: x and y int64, the float32
# mask, packed rows' position_ids and seq_ids and their work arrays (measured with
# tracemalloc, numpy backend; tests/test_safety_results.py)
BATCH_BYTES_PER_CELL = {"sft_episode": 24, "packed": 64, "token_stream": 20,
                        # pair rows (estimated, not measured): each side's gather work besides its x, y, mask
                        "pairs": 2 * 48, "kto": 48, "prompts": 48}


def check_batch_fits(cfg: LoaderConfig, mode: str, device: str = "cpu") -> None:
    """``batch_size x block_size`` cells against the memory available (a CUDA device
    doubles it: the batch is copied into pinned memory on its way)."""
    cells = cfg.batch_size * cfg.block_size if cfg.batch_tokens is None else cfg.batch_tokens
    need = cells * BATCH_BYTES_PER_CELL[mode] * (2 if str(device).startswith("cuda") else 1)
    what = (f"batch_size {cfg.batch_size:,} x block_size {cfg.block_size:,}" if cfg.batch_tokens is None
            else f"batch_tokens {cfg.batch_tokens:,}")
    try:
        check_fits(need, f"a batch of {what} ({mode})",
                   "lower batch_size or block_size in the config (gradient accumulation gives a larger "
                   "effective batch)")
    except UsageError as e:
        raise ConfigError(str(e)) from None


def check_trains_something(ds: Dataset, cfg: LoaderConfig) -> None:
    """Refuse a train split with no episode (row), or with no trained token when the
    loss uses the mask (as the metadata records it)."""
    train = ds.split("train")
    packed = ds.kind == "packed"
    items = "rows" if packed else "episodes"
    if train.num_items == 0:
        make = "`sftdata pack`" if packed else "`sftdata prepare-chat` / `prepare-tool`"
        raise NothingToTrainError(f"{ds.root}: its train split holds 0 {items}, so there is nothing to train on; "
                                  f"re-create it with {make}")
    if not cfg.use_loss_mask or not train.has_mask:
        return
    trained = (((ds.metadata or {}).get("splits") or {}).get("train") or {}).get("trained_tokens")
    if trained == 0:
        raise NothingToTrainError(f"{ds.root}: the mask of its train split trains 0 of its {items}' tokens, so "
                                  f"training with use_loss_mask=true would learn nothing (a loss of 0 on every "
                                  f"step); re-create it from records with assistant replies, or set "
                                  f"use_loss_mask=false to train on every token")


def check_value_ranges(root: Path, metadata: dict | None, tokenizer_state: dict | None,
                       mask: bool = True) -> None:
    """Refuse a shard whose recorded token ids reach the vocabulary size of
    ``tokenizer_state`` or whose recorded mask values (when ``mask``) are not within
    0..1. Shards without a record are not checked."""
    vocab = (tokenizer_state or {}).get("vocab_size")
    vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None
    for split, rec in ((metadata or {}).get("splits") or {}).items():
        for sh in (rec or {}).get("shards") or []:
            name = sh.get("name") if isinstance(sh, dict) else None
            if not isinstance(name, str):
                continue
            where = Path(root) / split / name
            shard = shard_record(metadata, split, name) or {}
            ids = _range(shard, "token_id_range", where)
            if ids is not None and vocab is not None and (ids[0] < 0 or ids[1] >= vocab):
                raise DatasetError(f"{where}: its token ids reach {ids[1] if ids[1] >= vocab else ids[0]:,}, "
                                   f"outside the vocabulary of {vocab:,} ids ({TOKENIZER_FILE}), which the model's "
                                   f"embedding cannot look up. The shard was damaged or written with another "
                                   f"tokenizer: re-create the dataset (`sftdata verify {root}` shows where)")
            values = _range(shard, "mask_value_range", where) if mask else None
            if values is not None and (values[0] < 0 or values[1] > 1):
                raise DatasetError(f"{where}: its mask holds values {values[0]}..{values[1]}, but a mask value is "
                                   f"0 (not trained) or 1 (trained). The shard was damaged or written by another "
                                   f"tool: re-create the dataset (`sftdata verify {root}` shows where)")


def _range(shard: dict, key: str, where: Path) -> tuple[int, int] | None:
    if key not in shard:
        return None
    v = shard[key]
    if (not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            or v[0] > v[1]):
        raise DatasetError(f"{where}: {METADATA_FILE} records its {key} as {v!r}, not [smallest, largest]; the "
                           f"metadata was edited or damaged: restore it, or re-create the dataset")
    return v[0], v[1]
