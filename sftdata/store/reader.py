"""Memory-mapped reading of datasets (episodes, packed rows, flat older layouts, token streams)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from .layout import (
    EPISODES_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    IDX_DTYPE,
    MASK_FILE,
    METADATA_FILE,
    SEGMENT_FIELDS,
    SEGMENTS_FILE,
    SOURCES_FILE,
    SPLITS,
    TOKENIZER_FILE,
    TOKENS_FILE,
    detect_layout,
    list_shards,
    read_json,
)


def _map(path: Path, dtype) -> np.ndarray:
    """Read-only memmap; an empty file gives an empty array (memmap refuses size 0)."""
    dtype = np.dtype(dtype)
    size = path.stat().st_size
    if size == 0:
        return np.empty(0, dtype=dtype)
    if size % dtype.itemsize:
        raise DatasetError(f"{path}: {size} bytes is not a whole number of {dtype.name} values "
                           f"({dtype.itemsize} bytes each); the file is truncated or of another dtype. "
                           f"Run `sftdata verify` and re-create the dataset")
    return np.memmap(path, dtype=dtype, mode="r")


class Shard:
    """One shard folder, memory-mapped. Pickles by path (cheap to send to workers)."""

    def __init__(self, path: Path, token_dtype, name: str | None = None):
        self.path = Path(path)
        self.name = name or self.path.name
        self.token_dtype = np.dtype(token_dtype)
        self._open()

    def _open(self) -> None:
        p = self.path
        for fn in (TOKENS_FILE, EPISODES_FILE):
            if not (p / fn).is_file():
                raise DatasetError(f"{p / fn} is missing; the dataset is incomplete. Re-create it "
                                   f"(or restore the file) and run `sftdata verify`")
        self.tokens = _map(p / TOKENS_FILE, self.token_dtype)
        idx_path = p / EPISODES_FILE
        if idx_path.stat().st_size % 16:
            raise DatasetError(f"{idx_path}: {idx_path.stat().st_size} bytes is not a multiple of 16 "
                               f"(uint64 start, length pairs); the index is truncated. Re-create the dataset")
        self.episodes = np.asarray(_map(idx_path, IDX_DTYPE)).reshape(-1, 2)
        self.mask = None
        self.mask_dtype = None
        mp = p / MASK_FILE
        if mp.is_file():
            size, n = mp.stat().st_size, self.tokens.shape[0]
            if size == n:
                self.mask_dtype = np.dtype(np.uint8)
            elif size == 4 * n:
                self.mask_dtype = np.dtype("<f4")
            else:
                raise DatasetError(f"{mp}: {size} bytes matches neither uint8 ({n} bytes) nor float32 "
                                   f"({4 * n} bytes) for the {n} tokens of {p / TOKENS_FILE}; the mask is "
                                   f"truncated or belongs to other tokens. Re-create the dataset")
            self.mask = _map(mp, self.mask_dtype)
        sp = p / SOURCES_FILE
        self.sources = np.asarray(_map(sp, IDX_DTYPE)) if sp.is_file() else None
        if self.sources is not None and self.sources.shape[0] != self.episodes.shape[0]:
            raise DatasetError(f"{sp}: {self.sources.shape[0]:,} record numbers for the {self.episodes.shape[0]:,} "
                               f"episodes of {idx_path}: there must be one per episode; the file is truncated or "
                               f"belongs to other episodes. Re-create the dataset (`sftdata verify` reports more)")
        self.segments = _read_segments(p / SEGMENTS_FILE)

    @property
    def num_episodes(self) -> int:
        return self.episodes.shape[0]

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens and mask ``[start, stop)`` read with plain file reads into fresh arrays.

        For streaming a whole shard in bounded memory: pages touched through the
        memmap stay resident and count in the process's RSS, file reads do not."""
        def read(name: str, dtype: np.dtype) -> np.ndarray:
            out = np.empty(stop - start, dtype=dtype)
            with open(self.path / name, "rb") as f:
                f.seek(start * dtype.itemsize)
                n = f.readinto(memoryview(out).cast("B"))
            if n != out.nbytes:
                raise DatasetError(f"{self.path / name}: short read at token {start}; the file is truncated")
            return out

        mask = read(MASK_FILE, self.mask_dtype) if self.mask is not None else None
        return read(TOKENS_FILE, self.token_dtype), mask

    def __getstate__(self):
        return {"path": str(self.path), "token_dtype": self.token_dtype.str, "name": self.name}

    def __setstate__(self, state):
        self.path = Path(state["path"])
        self.name = state["name"]
        self.token_dtype = np.dtype(state["token_dtype"])
        self._open()


class Split:
    """The shards of one split seen as one sequence of episodes with global ids."""

    def __init__(self, name: str, shards: list[Shard]):
        self.name = name
        self.shards = shards
        counts = [s.num_episodes for s in shards]
        self.episode_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_episodes = int(self.episode_offsets[-1])
        if shards:
            self.starts = np.concatenate([s.episodes[:, 0] for s in shards]).astype(np.int64)
            self.lengths = np.concatenate([s.episodes[:, 1] for s in shards]).astype(np.int64)
        else:
            self.starts = np.empty(0, np.int64)
            self.lengths = np.empty(0, np.int64)
        self.has_mask = bool(shards) and all(s.mask is not None for s in shards)
        self.num_tokens = int(sum(s.tokens.shape[0] for s in shards))

    @property
    def sources(self) -> np.ndarray | None:
        """Input record number of every episode (global order), or None when not stored."""
        if not self.shards or any(s.sources is None for s in self.shards):
            return None
        return np.concatenate([np.asarray(s.sources, dtype=np.int64) for s in self.shards])

    def shard_of(self, global_ids) -> np.ndarray:
        """Index of the shard holding each global episode id."""
        return np.searchsorted(self.episode_offsets, np.asarray(global_ids), side="right") - 1

    def locate(self, global_id: int) -> tuple[Shard, int]:
        gid = int(global_id)
        if not 0 <= gid < self.num_episodes:
            raise DatasetError(f"episode {gid} does not exist in split {self.name!r}, which has "
                               f"{self.num_episodes} episodes (ids 0..{self.num_episodes - 1})")
        si = int(self.shard_of(gid))
        return self.shards[si], gid - int(self.episode_offsets[si])

    def episode(self, global_id: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and mask, or None) of one episode, at most ``limit`` tokens; views, no copy."""
        shard, local = self.locate(global_id)
        start, length = (int(v) for v in shard.episodes[local])
        n = length if limit is None else min(length, limit)
        toks = shard.tokens[start:start + n]
        mask = shard.mask[start:start + n] if shard.mask is not None else None
        return toks, mask


@dataclass
class Dataset:
    """An opened dataset. ``metadata``/``tokenizer_state`` are None for the older flat
    layout (``train/tokens.bin`` + ``train/episodes.idx``, no metadata)."""

    root: Path
    layout: str  # "sharded" | "flat"
    kind: str  # "episodes" | "packed"
    token_dtype: np.dtype
    metadata: dict | None
    tokenizer_state: dict | None
    splits: dict[str, Split]

    def tokenizer(self):
        """Rebuild the recorded tokenizer and check it is exactly the one used."""
        from ..tokenizer import tokenizer_from_state

        if self.tokenizer_state is None:
            raise DatasetError(f"{self.root} has no {TOKENIZER_FILE}; the tokenizer it was made "
                               f"with is unknown")
        return tokenizer_from_state(self.tokenizer_state, str(self.root / TOKENIZER_FILE))

    @property
    def packing(self) -> dict | None:
        """The packing options of a packed dataset (block_size, row_len, strategy, ...)."""
        return (self.metadata or {}).get("packing") if self.kind == "packed" else None

    def split(self, name: str) -> Split:
        if name not in self.splits:
            have = ", ".join(self.splits) or "none"
            raise DatasetError(f"{self.root} has no split {name!r} (splits: {have})")
        return self.splits[name]


def open_dataset(root: str | Path, *, token_dtype=None) -> Dataset:
    """Open a dataset for reading (memory-mapped). ``token_dtype`` is needed only for a
    flat layout whose tokens are not uint32."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist; create it with "
                           f"`sftdata prepare-chat ... --output-dir {root}`")
    layout = detect_layout(root)
    if layout is None:
        raise DatasetError(f"{root} holds no dataset: expected train/shard_*/ folders or "
                           f"train/tokens.bin (is this the --output-dir of prepare?)")
    meta = tok_state = None
    if (root / METADATA_FILE).is_file():
        meta = read_json(root / METADATA_FILE)
        if meta.get("format") != FORMAT_NAME:
            raise DatasetError(f"{root / METADATA_FILE}: format is {meta.get('format')!r}, not {FORMAT_NAME!r}")
        if meta.get("format_version") != FORMAT_VERSION:
            raise DatasetError(f"{root / METADATA_FILE}: format_version {meta.get('format_version')!r} is not "
                               f"supported (this sftdata reads {FORMAT_VERSION}); upgrade sftdata")
    elif layout == "sharded":
        raise DatasetError(f"{root / METADATA_FILE} is missing: the dataset was not completed (prepare "
                           f"writes it last). Re-create the dataset")
    if (root / TOKENIZER_FILE).is_file():
        tok_state = read_json(root / TOKENIZER_FILE)
    if meta is not None:
        dtype = np.dtype(meta.get("token_dtype", "uint32")).newbyteorder("<")
        kind = meta.get("kind", "episodes")
    else:
        dtype = np.dtype(token_dtype or "<u4")
        kind = "episodes"
    splits: dict[str, Split] = {}
    for split in SPLITS:
        if layout == "sharded":
            paths = list_shards(root, split)
            if paths:
                splits[split] = Split(split, [Shard(p, dtype) for p in paths])
        elif (root / split / TOKENS_FILE).is_file():
            if not (root / split / EPISODES_FILE).is_file():
                continue  # a token stream without episodes: the token_stream loader reads it
            splits[split] = Split(split, [Shard(root / split, dtype, name=split)])
    if kind == "packed":
        _check_packed(root, meta, splits)
    return Dataset(root, layout, kind, dtype, meta, tok_state, splits)


# ---------------------------------------------------------------------------- token streams
def has_episode_index(root: str | Path, split: str = "train") -> bool:
    """True when ``split`` has ``shard_*/episodes.idx`` or a flat ``episodes.idx``: the
    dataset is episode-indexed (the loader's ``sft_episode`` mode)."""
    d = Path(root) / split
    return (d / EPISODES_FILE).is_file() or any((p / EPISODES_FILE).is_file() for p in list_shards(Path(root), split))


def open_token_stream(root: str | Path, split: str, *, token_dtype=None) -> list[np.ndarray]:
    """The token arrays (memmaps, one per shard in name order) of ``split``, ignoring
    any episode index: what a token-stream (nanoGPT-style) loader samples windows from.
    The dtype comes from dataset_metadata.json, else ``token_dtype``, else uint32."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist")
    dtype = np.dtype(token_dtype or "<u4")
    if (root / METADATA_FILE).is_file():
        meta = read_json(root / METADATA_FILE)
        if "token_dtype" in meta:
            dtype = np.dtype(meta["token_dtype"]).newbyteorder("<")
    paths = [p / TOKENS_FILE for p in list_shards(root, split)]
    if not paths and (root / split / TOKENS_FILE).is_file():
        paths = [root / split / TOKENS_FILE]
    if not paths:
        raise DatasetError(f"{root} has no tokens for split {split!r}: expected {split}/{TOKENS_FILE} "
                           f"or {split}/shard_*/{TOKENS_FILE}")
    for p in paths:
        if not p.is_file():
            raise DatasetError(f"{p} is missing; the dataset is incomplete")
    return [_map(p, dtype) for p in paths]


def _read_segments(path: Path) -> np.ndarray | None:
    if not path.is_file():
        return None
    n = len(SEGMENT_FIELDS)
    size = path.stat().st_size
    if size % (8 * n):
        raise DatasetError(f"{path}: {size} bytes is not a multiple of {8 * n} ({n} uint64 per segment); "
                           f"the index is truncated. Re-create the packed dataset with `sftdata pack`")
    return np.asarray(_map(path, IDX_DTYPE)).reshape(-1, n)


def _check_packed(root: Path, meta: dict | None, splits: dict[str, Split]) -> None:
    packing = (meta or {}).get("packing") or {}
    row_len = packing.get("row_len")
    if not isinstance(row_len, int) or row_len < 2:
        raise DatasetError(f"{root / METADATA_FILE}: a packed dataset needs packing.row_len (an integer >= 2), "
                           f"got {row_len!r}. Re-create it with `sftdata pack`")
    for split in splits.values():
        for sh in split.shards:
            if sh.segments is None:
                raise DatasetError(f"{sh.path / SEGMENTS_FILE} is missing; the packed dataset is incomplete. "
                                   f"Re-create it with `sftdata pack`")
            if sh.tokens.shape[0] != sh.num_episodes * row_len:
                raise DatasetError(f"{sh.path / TOKENS_FILE}: {sh.tokens.shape[0]} tokens are not "
                                   f"{sh.num_episodes} rows of {row_len}; the shard is damaged. "
                                   f"Re-create the packed dataset with `sftdata pack`")
