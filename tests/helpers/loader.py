"""Datasets for the loader tests. In the synthetic ones every token says which episode and
position it is, so a test can state exactly which tokens a batch must hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sftdata.loader import LoaderConfig, make_loader
from sftdata.pack import PackOptions, pack
from sftdata.store import TOKENIZER_FILE
from sftdata.store.writer import DatasetWriter

EOS = 7


def ep_tokens(gid: int, n: int) -> np.ndarray:
    """Tokens of synthetic episode ``gid``: gid * 1000 + 1 + position."""
    return gid * 1000 + 1 + np.arange(n, dtype=np.int64)


def ep_mask(gid: int, n: int) -> np.ndarray:
    return ((np.arange(n) + gid) % 3 == 0).astype(np.uint8)


def make_dataset(path: Path, lengths, *, shard_tokens: int = 1 << 40, val_lengths=None,
                 sources=None, eos: int = EOS) -> Path:
    """A sharded dataset whose train episode ``g`` has ``lengths[g]`` tokens."""
    with DatasetWriter(path) as w:
        meta_splits = {}
        for split, lens in (("train", lengths), ("val", val_lengths)):
            if lens is None:
                continue
            lens = np.asarray(lens, dtype=np.int64)
            ids = np.concatenate([ep_tokens(g, n) for g, n in enumerate(lens)]) if len(lens) else np.empty(0)
            mask = np.concatenate([ep_mask(g, n) for g, n in enumerate(lens)]) if len(lens) else np.empty(0)
            src = np.asarray(sources if sources is not None and split == "train" else np.arange(len(lens)) * 2 + 5)
            sw = w.split(split, np.dtype("<u4"), shard_tokens)
            sw.add_many(ids.astype(np.uint32), mask.astype(np.uint8), lens, src)
            meta_splits[split] = sw.close()
        w.write_json(TOKENIZER_FILE, {"eos_id": eos, "vocab_size": 1 << 30, "special_tokens": {"<|EOS|>": eos}})
        w.commit({"kind": "episodes", "token_dtype": "uint32", "splits": meta_splits})
    return Path(path)


def make_flat(path: Path, lengths, *, mask: str | None = "uint8", with_index: bool = True) -> Path:
    """The older flat layout: train/tokens.bin (uint32) [+ mask.bin] [+ episodes.idx], no metadata."""
    d = Path(path) / "train"
    d.mkdir(parents=True)
    lens = np.asarray(lengths, dtype=np.int64)
    toks = np.concatenate([ep_tokens(g, n) for g, n in enumerate(lens)]).astype("<u4")
    toks.tofile(d / "tokens.bin")
    if mask is not None:
        m = np.concatenate([ep_mask(g, n) for g, n in enumerate(lens)]).astype(mask)
        m.tofile(d / "mask.bin")
    if with_index:
        idx = np.stack([np.concatenate([[0], np.cumsum(lens)[:-1]]), lens], axis=1).astype("<u8")
        idx.tofile(d / "episodes.idx")
    return Path(path)


def make_stream(path: Path, train_tokens: int = 5000, val_tokens: int = 600) -> Path:
    """A bare token stream (flat layout, no episode index, no metadata): train holds
    0, 1, 2, ... and val 100000, 100001, ..."""
    for split, n, first in (("train", train_tokens, 0), ("val", val_tokens, 100000)):
        (Path(path) / split).mkdir(parents=True)
        (np.arange(n, dtype="<u4") + first).tofile(Path(path) / split / "tokens.bin")
    return Path(path)


PACKED_BLOCK = 63


def make_packed(source: Path, path: Path) -> Path:
    """``source`` (a prepared dataset) packed into rows of ``PACKED_BLOCK + 1`` tokens,
    20 rows per shard."""
    pack(source, path, PackOptions(block_size=PACKED_BLOCK, shard_tokens=20 * (PACKED_BLOCK + 1)))
    return Path(path)


# one dataset of each kind the loader reads, and the loader settings the tests read them with
LENGTHS = [3, 5, 1, 12, 4, 7, 2, 9, 6, 10, 3, 8]  # episode 2 (1 token) is below episode_min_tokens=2
CONFIGS = {"episodes": dict(batch_size=3, block_size=6, use_loss_mask=True),
           "packed": dict(batch_size=4, block_size=PACKED_BLOCK, use_loss_mask=True, epoch_seed=7),
           "windows": dict(batch_size=4, block_size=8)}


def make_each_kind(source: Path, folder: Path) -> dict[str, Path]:
    """Under ``folder``: a synthetic episodes dataset of several shards (global ids cross
    shard boundaries), ``source`` packed, and a bare token stream."""
    # shard_tokens=15 -> several shards, so global ids cross shard boundaries
    return {"episodes": make_dataset(folder / "ds", LENGTHS, shard_tokens=15, val_lengths=[4, 4, 6, 2]),
            "packed": make_packed(source, folder / "packed"), "windows": make_stream(folder / "stream")}


def load(each_kind: dict[str, Path], kind: str, *, backend="numpy", **kw):
    """The loader of ``each_kind[kind]`` with ``CONFIGS[kind]`` updated by ``kw`` (rank,
    world_size and audit_dir go to make_loader)."""
    opts = {k: kw.pop(k) for k in ("rank", "world_size", "audit_dir") if k in kw}
    return make_loader(LoaderConfig(**{**CONFIGS[kind], **kw}), each_kind[kind], backend=backend, **opts)
