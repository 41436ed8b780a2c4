"""The on-disk dataset format: the only module that knows file names and layout.

::

    DATASET/
    ├── dataset_metadata.json      written last; counts, options, sha256 of every file
    ├── tokenizer_state.json
    ├── rejects.jsonl              (prepare) rejected records and why
    ├── train/shard_00000/{tokens.bin, mask.bin, episodes.idx, sources.idx}
    └── val/shard_00000/...

``episodes.idx`` is little-endian uint64 (start, length) pairs, 16 bytes per episode;
``sources.idx`` one uint64 record number per episode. The global episode id of a split
is the position in the concatenation of its shards in name order.

Writing is atomic: ``DatasetWriter`` builds everything in a hidden temporary folder
beside the target and renames it into place only on a clean ``commit``; an error,
Ctrl-C or crash leaves nothing at the target. Readers memory-map, and survive pickling
into worker processes (they reopen by path).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import orjson

from .errors import DatasetError, OutputExistsError

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


# ---------------------------------------------------------------------------- writing
class _HashedFile:
    """A binary file written sequentially whose sha256 and size are known on close."""

    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "wb")
        self._h = hashlib.sha256()
        self.bytes = 0

    def write(self, data) -> None:
        mv = memoryview(data).cast("B")
        self._f.write(mv)
        self._h.update(mv)
        self.bytes += mv.nbytes

    def close(self) -> dict:
        self._f.close()
        return {"bytes": self.bytes, "sha256": self._h.hexdigest()}


@dataclass
class ShardInfo:
    name: str
    episodes: int
    tokens: int
    trained_tokens: int
    files: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"name": self.name, "episodes": self.episodes, "tokens": self.tokens,
                "trained_tokens": self.trained_tokens, "files": self.files}


class SplitWriter:
    """Appends episodes to a split's shards; a new shard starts when the next episode
    would push the current one past ``shard_tokens`` (an episode never spans shards)."""

    def __init__(self, root: Path, split: str, token_dtype: np.dtype, shard_tokens: int):
        self.dir = root / split
        self.split = split
        self.token_dtype = np.dtype(token_dtype)
        self.shard_tokens = int(shard_tokens)
        self.shards: list[ShardInfo] = []
        self._files: dict[str, _HashedFile] | None = None
        self._cur: ShardInfo | None = None

    def _open_shard(self) -> None:
        self._close_shard()
        name = shard_name(len(self.shards))
        d = self.dir / name
        d.mkdir(parents=True, exist_ok=False)
        self._files = {fn: _HashedFile(d / fn) for fn in (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SOURCES_FILE)}
        self._cur = ShardInfo(name, 0, 0, 0)
        self.shards.append(self._cur)

    def _close_shard(self) -> None:
        if self._files is not None:
            self._cur.files = {fn: f.close() for fn, f in self._files.items()}
            self._files = None

    def add_many(self, ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray, sources: np.ndarray) -> None:
        """Append episodes given as one concatenated ids/mask array and their lengths."""
        lengths = np.asarray(lengths, dtype=np.int64)
        sources = np.asarray(sources, dtype=np.int64)
        if ids.shape != mask.shape or int(lengths.sum()) != ids.shape[0] or sources.shape != lengths.shape:
            raise ValueError("ids, mask, lengths and sources disagree in size")
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        i, n = 0, len(lengths)
        while i < n:
            if self._cur is None or (self._cur.tokens > 0 and self._cur.tokens + lengths[i] > self.shard_tokens):
                self._open_shard()
            room = self.shard_tokens - self._cur.tokens
            # take as many whole episodes as fit (at least one)
            fit = np.searchsorted(bounds[i + 1:] - bounds[i], room, side="right")
            j = i + max(1, int(fit))
            a, b = int(bounds[i]), int(bounds[j])
            self._write(ids[a:b], mask[a:b], lengths[i:j], sources[i:j])
            i = j

    def _write(self, ids, mask, lengths, sources) -> None:
        cur, f = self._cur, self._files
        starts = cur.tokens + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        idx = np.empty((len(lengths), 2), dtype=IDX_DTYPE)
        idx[:, 0] = starts
        idx[:, 1] = lengths
        f[TOKENS_FILE].write(np.ascontiguousarray(ids, dtype=self.token_dtype))
        f[MASK_FILE].write(np.ascontiguousarray(mask, dtype=np.uint8))
        f[EPISODES_FILE].write(idx)
        f[SOURCES_FILE].write(np.ascontiguousarray(sources, dtype=IDX_DTYPE))
        cur.tokens += int(lengths.sum())
        cur.episodes += len(lengths)
        cur.trained_tokens += int(np.count_nonzero(mask))

    def close(self) -> dict:
        self._close_shard()
        if not self.shards:  # an empty split still has one (empty) shard, so readers find it
            self._open_shard()
            self._close_shard()
        return {
            "episodes": sum(s.episodes for s in self.shards),
            "tokens": sum(s.tokens for s in self.shards),
            "trained_tokens": sum(s.trained_tokens for s in self.shards),
            "shards": [s.as_dict() for s in self.shards],
        }


class DatasetWriter:
    """Context manager that builds a dataset in a temporary folder and renames it into
    place on ``commit``. Leaving the block without ``commit`` (an exception, Ctrl-C)
    removes the temporary folder; the target is untouched."""

    def __init__(self, target: str | Path, *, overwrite: bool = False):
        self.target = Path(target)
        self.overwrite = overwrite
        self.tmp: Path | None = None
        self._committed = False

    def __enter__(self) -> "DatasetWriter":
        if self.target.exists() and not self.overwrite:
            raise OutputExistsError(f"{self.target} already exists; pass --overwrite to replace it, "
                                    f"or choose another --output-dir")
        if self.target.exists() and not self.target.is_dir():
            raise OutputExistsError(f"{self.target} exists and is not a folder; remove it or choose "
                                    f"another --output-dir")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.target.parent / f".{self.target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed and self.tmp is not None and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def path(self) -> Path:
        assert self.tmp is not None, "use DatasetWriter as a context manager"
        return self.tmp

    def split(self, name: str, token_dtype: np.dtype, shard_tokens: int = DEFAULT_SHARD_TOKENS) -> SplitWriter:
        return SplitWriter(self.path, name, token_dtype, shard_tokens)

    def packed_split(self, name: str, token_dtype: np.dtype, row_len: int,
                     shard_tokens: int = DEFAULT_SHARD_TOKENS) -> "PackedSplitWriter":
        return PackedSplitWriter(self.path, name, token_dtype, row_len, shard_tokens)

    def write_json(self, relname: str, obj) -> None:
        (self.path / relname).write_bytes(dumps_json(obj))

    def commit(self, metadata: dict) -> Path:
        """Write ``dataset_metadata.json`` (with sha256 of the top-level files) last,
        then move the folder into place."""
        files = {}
        for p in sorted(self.path.iterdir()):
            if p.is_file() and p.name != METADATA_FILE:
                files[p.name] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
        meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **metadata, "files": files}
        (self.path / METADATA_FILE).write_bytes(dumps_json(meta))
        old = None
        if self.target.exists():
            old = self.target.parent / f".{self.target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(self.target, old)
        os.replace(self.path, self.target)
        self._committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.target


# ---------------------------------------------------------------------------- reading
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
        self.segments = _read_segments(p / SEGMENTS_FILE)

    @property
    def num_episodes(self) -> int:
        return self.episodes.shape[0]

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
        from .tokenizer import tokenizer_from_state

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


def iter_files(root: Path) -> Iterable[Path]:
    """Every file of a dataset below ``root`` (for checksums), in a stable order."""
    return sorted(p for p in root.rglob("*") if p.is_file())


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


def _read_segments(path: Path) -> np.ndarray | None:
    if not path.is_file():
        return None
    n = len(SEGMENT_FIELDS)
    size = path.stat().st_size
    if size % (8 * n):
        raise DatasetError(f"{path}: {size} bytes is not a multiple of {8 * n} ({n} uint64 per segment); "
                           f"the index is truncated. Re-create the packed dataset with `sftdata pack`")
    return np.asarray(_map(path, IDX_DTYPE)).reshape(-1, n)


@dataclass
class Segments:
    """The segments of a packed split, global row ids, int64 arrays (source -1 = unknown)."""

    row: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    prefix: np.ndarray
    episode: np.ndarray
    episode_start: np.ndarray
    source: np.ndarray

    def of_rows(self, rows) -> "Segments":
        """The segments of the given rows, in the order of ``rows`` (then offset)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        a = np.searchsorted(self.row, rows, side="left")
        b = np.searchsorted(self.row, rows, side="right")
        n = b - a
        idx = np.repeat(a - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
        return Segments(*(getattr(self, f)[idx] for f in SEGMENT_FIELDS))


def split_segments(split: Split) -> Segments:
    """All segments of a packed split with global row ids."""
    parts = []
    for si, sh in enumerate(split.shards):
        if sh.segments is None:
            raise DatasetError(f"{sh.path / SEGMENTS_FILE} is missing; the packed dataset is incomplete. "
                               f"Re-create it with `sftdata pack`")
        a = np.asarray(sh.segments).astype(np.int64)  # NO_SOURCE wraps to -1
        a[:, 0] += int(split.episode_offsets[si])
        parts.append(a)
    a = np.concatenate(parts) if parts else np.empty((0, len(SEGMENT_FIELDS)), np.int64)
    return Segments(*(np.ascontiguousarray(a[:, i]) for i in range(len(SEGMENT_FIELDS))))


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


class PackedSplitWriter:
    """Appends packed rows to a split's shards, ``shard_tokens // row_len`` rows per shard."""

    def __init__(self, root: Path, split: str, token_dtype: np.dtype, row_len: int, shard_tokens: int):
        self.dir = root / split
        self.token_dtype = np.dtype(token_dtype)
        self.row_len = int(row_len)
        self.rows_per_shard = max(1, int(shard_tokens) // self.row_len)
        self.shards: list[dict] = []
        self._files: dict[str, _HashedFile] | None = None

    def _open_shard(self) -> None:
        self._close_shard()
        name = shard_name(len(self.shards))
        d = self.dir / name
        d.mkdir(parents=True, exist_ok=False)
        self._files = {fn: _HashedFile(d / fn) for fn in (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SEGMENTS_FILE)}
        self.shards.append({"name": name, "rows": 0, "segments": 0, "tokens": 0, "trained_tokens": 0})

    def _close_shard(self) -> None:
        if self._files is not None:
            self.shards[-1]["files"] = {fn: f.close() for fn, f in self._files.items()}
            self._files = None

    def add_rows(self, tokens: np.ndarray, mask: np.ndarray, segments: np.ndarray) -> None:
        """Append rows ``tokens``/``mask`` (k, row_len) and their segments: an (s, 7)
        int64 array in ``SEGMENT_FIELDS`` order whose ``row`` is 0..k-1 (these rows),
        sorted by (row, offset); ``source`` -1 = unknown."""
        k = tokens.shape[0]
        if tokens.shape != (k, self.row_len) or mask.shape != tokens.shape:
            raise ValueError(f"rows must be (k, {self.row_len}); got tokens {tokens.shape}, mask {mask.shape}")
        segments = np.asarray(segments, dtype=np.int64)
        i = 0
        while i < k:
            if self._files is None or self.shards[-1]["rows"] >= self.rows_per_shard:
                self._open_shard()
            cur = self.shards[-1]
            j = min(k, i + self.rows_per_shard - cur["rows"])
            a, b = np.searchsorted(segments[:, 0], [i, j], side="left")
            seg = segments[a:b].copy()
            seg[:, 0] += cur["rows"] - i
            real = int(seg[:, 2].sum())
            f = self._files
            idx = np.empty((j - i, 2), dtype=IDX_DTYPE)
            idx[:, 0] = (cur["rows"] + np.arange(j - i)) * self.row_len
            idx[:, 1] = self.row_len
            f[TOKENS_FILE].write(np.ascontiguousarray(tokens[i:j], dtype=self.token_dtype))
            f[MASK_FILE].write(np.ascontiguousarray(mask[i:j], dtype=np.uint8))
            f[EPISODES_FILE].write(idx)
            f[SEGMENTS_FILE].write(np.ascontiguousarray(seg).astype(IDX_DTYPE))  # -1 -> NO_SOURCE
            cur["rows"] += j - i
            cur["segments"] += b - a
            cur["tokens"] += real
            cur["trained_tokens"] += int(np.count_nonzero(mask[i:j]))
            i = j

    def close(self) -> dict:
        self._close_shard()
        if not self.shards:
            self._open_shard()
            self._close_shard()
        return {
            "rows": sum(s["rows"] for s in self.shards),
            "row_len": self.row_len,
            "segments": sum(s["segments"] for s in self.shards),
            "tokens": sum(s["tokens"] for s in self.shards),
            "trained_tokens": sum(s["trained_tokens"] for s in self.shards),
            "shards": self.shards,
        }
