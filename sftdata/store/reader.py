"""Reading datasets: one tolerant opener (``scan_dataset``: the shards it could open and
every structural problem found) and the strict one (``open_dataset``: the dataset, or
``DatasetError`` with the first problem). Also the token-stream view of a split.

Opening is cheap: file sizes and the index arrays, one token per episode (its EOS),
never a pass over the token data; ``verify`` does the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from ..chat.markers import MarkerIds
from ..errors import DatasetError, SftDataError
from ..storage import FORMAT_NAME, METADATA_FILE, SPLITS, read_json
from ..storage.location import dataset_path
from .format import (
    ENTRIES_PER_ROW,
    EPISODES_FILE,
    KIND_EPISODES,
    KIND_KTO,
    KIND_PACKED,
    KIND_PAIRS,
    KIND_PROMPTS,
    KNOWN_FORMAT_VERSIONS,
    MEDIA_FILE,
    METADATA,
    RECREATE,
    REPACK,
    RESTORE,
    ROW_KINDS,
    TOKENIZER_FILE,
    TOKENIZER_STATE,
    TOKENS_FILE,
    Problem,
    choose_token_dtype,
    clean_fields,
    detect_layout,
    format_version_for,
    has_last_reply_flags,
    has_media,
    in_check_order,
    list_shards,
    packed_row_len,
    row_shard_files,
    shard_files,
    shard_record,
)
from .shard import Shard, Split, map_values, missing_files, size_problems
from .structure import (
    HARMLESS_IN_FLAT,
    check_counts,
    check_eos,
    check_index,
    check_rows,
    check_segments,
    check_shard_list,
    episode_bounds,
)

T = TypeVar("T")
GENERATION_TRIES = 5  # reads of a dataset that keeps being replaced, before giving up
# the order problems are reported in: the most specific first (counts are often a consequence)
DATASET_KINDS = (KIND_EPISODES, KIND_PACKED, *ROW_KINDS)  # what "kind" a dataset's metadata may say
STRUCTURE_CHECKS = ("metadata", "tokenizer", "files", "sizes", "index", "eos", "rows", "segments", "counts")


@dataclass
class Dataset:
    """An opened dataset. ``metadata``/``tokenizer_state`` are None for the older flat
    layout (``train/tokens.bin`` + ``train/episodes.idx``, no metadata)."""

    root: Path
    layout: str  # "sharded" | "flat"
    kind: str  # "episodes" | "packed", or a row kind: "pairs" | "kto" | "prompts" (sftdata.store.rows)
    token_dtype: np.dtype
    metadata: dict | None
    tokenizer_state: dict | None
    splits: dict[str, Split]

    @property
    def packing(self) -> dict | None:
        """The packing options of a packed dataset (block_size, row_len, strategy, ...)."""
        return (self.metadata or {}).get("packing") if self.kind == "packed" else None

    @property
    def entries(self) -> int:
        """Index entries per row: 1 (an episode, a packed row), or a row kind's (a pair: 3)."""
        return ENTRIES_PER_ROW.get(self.kind, 1)

    @property
    def shards(self) -> list[Shard]:
        """Every shard, split by split in ``SPLITS`` order, then in name order."""
        return [sh for sp in self.splits.values() for sh in sp.shards]

    def split(self, name: str) -> Split:
        if name not in self.splits:
            have = ", ".join(self.splits) or "none"
            raise DatasetError(f"{self.root} has no split {name!r} (splits: {have})")
        return self.splits[name]

    @property
    def has_media(self) -> bool:
        """Whether the dataset holds images or videos (a media table in every shard)."""
        return has_media(self.metadata)

    @property
    def processor_settings(self) -> dict | None:
        """The processor settings pinned when the media were counted (``sftdata.media``'s
        ``read_processor_settings``), or None: a text dataset."""
        settings = (self.tokenizer_state or {}).get("processor")
        return settings if isinstance(settings, dict) else None

    def media_spans(self, split: str, item: int) -> tuple:
        """The ``MediaSpan``s of global episode (packed: row) ``item`` of ``split``, in
        token order, offsets counted from the item's first token; () for a text dataset.
        A shard's media table is read the first time one of its items is asked for; a
        table that is not as the format says is a ``DatasetError`` naming its first problem."""
        shard, local = self.split(split).locate(item)
        if not self.has_media:
            return ()
        from .media_table import item_spans  # lazy: the media table's code loads only for a dataset with media
        return item_spans(shard, local)


@dataclass
class Scan:
    """What ``scan_dataset`` found: the dataset as far as it could be opened (a shard's
    missing or partial files leave its arrays None or short), every structural problem
    in the order found, and the facts a report words its notes from."""

    dataset: Dataset
    problems: list[Problem]
    metadata_file: bool  # dataset_metadata.json exists (readable or not)
    tokenizer_file: bool  # tokenizer_state.json exists (readable or not)
    row_len: int | None  # packed: packing.row_len when usable
    dtype_guessed: bool  # nothing recorded or given the token dtype: uint32 was assumed
    token_streams: list[str] = field(default_factory=list)  # flat splits with tokens but no episode index
    bad_segments: set[str] = field(default_factory=set)  # shards (rel) whose segments failed their check

    def strict_problems(self) -> list[Problem]:
        """The problems ``open_dataset`` refuses, most specific first (an older flat
        layout may be unsorted or hold tokens outside any episode: training does not mind)."""
        problems = self.problems
        if self.dataset.layout == "flat":
            problems = [p for p in problems if p.code not in HARMLESS_IN_FLAT]
        return in_check_order(problems, STRUCTURE_CHECKS)


def _dataset_root(root: Path) -> str:
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist; create it with "
                           f"`sftdata prepare-chat ... --output-dir {root}`")
    layout = detect_layout(root)
    if layout is None:
        raise DatasetError(f"{root} holds no dataset: expected train/shard_*/ folders or train/tokens.bin")
    return layout


def _read_metadata(root: Path, layout: str) -> tuple[dict | None, list[Problem]]:
    path = root / METADATA_FILE
    if not path.is_file():
        if layout == "flat":
            return None, []
        return None, [Problem("metadata", METADATA_FILE, "", f"{METADATA_FILE} is missing: the dataset was never "
                              "completed (prepare writes it last) or it was deleted",
                              "re-create the dataset; without it counts and checksums cannot be checked")]
    try:
        meta = read_json(path)
    except DatasetError as e:
        return None, [Problem("metadata", METADATA_FILE, "", str(e), RECREATE)]
    meta, damaged = clean_fields(meta, METADATA, METADATA_FILE, RESTORE + (REPACK if meta.get("kind") == KIND_PACKED
                                                                         else RECREATE))
    if meta.get("format") != FORMAT_NAME:
        return meta, [Problem("metadata", METADATA_FILE, "", f"format is {meta.get('format')!r}, not "
                              f"{FORMAT_NAME!r}", "this folder was not written by sftdata; " + RECREATE)]
    version, kind = meta.get("format_version"), meta.get("kind", "episodes")
    if version not in KNOWN_FORMAT_VERSIONS:
        return meta, [Problem("metadata", METADATA_FILE, "", f"format_version {version!r} is not "
                              f"known (this sftdata reads {', '.join(map(str, KNOWN_FORMAT_VERSIONS[:-1]))} and "
                              f"{KNOWN_FORMAT_VERSIONS[-1]})",
                              "upgrade sftdata, or re-create the dataset with this one")]
    if kind not in DATASET_KINDS:
        return meta, [Problem("metadata", METADATA_FILE, "kind", f"kind {kind!r} is not known (this sftdata reads "
                              f"{', '.join(DATASET_KINDS)})", "upgrade sftdata, or re-create the dataset "
                              "with this one")]
    want = format_version_for(kind, has_last_reply_flags(meta), has_media(meta))
    if version != want:
        media = " with media" if has_media(meta) else ""
        return meta, [Problem("metadata", METADATA_FILE, "format_version", f"a {kind!r} dataset{media} is "
                              f"format_version {want}, but this one records {version!r}", RECREATE)]
    return meta, damaged


def _read_tokenizer_state(root: Path) -> tuple[dict | None, list[Problem]]:
    if not (root / TOKENIZER_FILE).is_file():
        return None, []
    try:
        state = read_json(root / TOKENIZER_FILE)
    except DatasetError as e:
        return None, [Problem("tokenizer", TOKENIZER_FILE, "", str(e), RECREATE)]
    return clean_fields(state, TOKENIZER_STATE, TOKENIZER_FILE, RESTORE + RECREATE, check="tokenizer")


def recorded_kind(root: Path) -> str | None:
    """The ``kind`` a dataset's metadata records, or None when it has no readable one
    (a damaged metadata is for ``scan_dataset`` to report)."""
    if not (Path(root) / METADATA_FILE).is_file():
        return None
    try:
        kind = read_json(Path(root) / METADATA_FILE).get("kind")
    except (DatasetError, OSError):
        return None
    return kind if isinstance(kind, str) else None


def markers_from_state(state: dict | None) -> MarkerIds | None:
    """The chat markers a tokenizer state records, or None when it records none usable."""
    try:
        return MarkerIds.from_special_tokens(state["special_tokens"])
    except (SftDataError, KeyError, TypeError):
        return None


def generation(root: Path) -> tuple | None:
    """Which dataset stands at ``root`` now: the identity of its folder and of its
    metadata file (None: nothing there). A writer never changes a dataset in place: it
    swaps a new folder in (``DatasetWriter``), so the same generation before and after a
    read means every file read belongs to one dataset."""
    try:
        st = os.stat(root)
    except OSError:
        return None
    try:
        m = os.stat(root / METADATA_FILE)
        meta = (m.st_dev, m.st_ino, m.st_size, m.st_mtime_ns)
    except OSError:
        meta = None
    return st.st_dev, st.st_ino, meta


def read_one_generation(root: Path, read: Callable[[], T]) -> T:
    """``read()`` of the dataset at ``root``, again when a writer replaced the dataset
    while it ran (its result, or its error, may mix the old dataset with the new one),
    at most ``GENERATION_TRIES`` times: a reader reports the old dataset or the new one,
    never damage that is not there."""
    for _ in range(GENERATION_TRIES):
        before = generation(root)
        try:
            result = read()
        except (SftDataError, OSError):
            if generation(root) != before:
                continue
            raise
        if generation(root) == before:
            return result
    raise DatasetError(f"{root} was replaced {GENERATION_TRIES} times while it was being read (another sftdata "
                       f"keeps writing it); read it once that run has finished")


def scan_dataset(root: str | Path, *, token_dtype=None) -> Scan:
    """Open the dataset at ``root`` tolerantly: map what exists, and run the structural
    checks (description files, files present, sizes, the episode index and EOS endings;
    packed: the rows and segments; counts). Raises ``DatasetError`` only when ``root``
    holds no dataset. ``token_dtype`` is for an older flat layout whose tokens are not
    uint32. A dataset replaced while it was scanned is scanned again
    (``read_one_generation``)."""
    root = dataset_path(root)  # a path, a file:// URL, or an object-store URL (fetched into the cache)
    return read_one_generation(root, lambda: _scan(root, token_dtype))


def _scan(root: Path, token_dtype) -> Scan:
    layout = _dataset_root(root)
    meta, problems = _read_metadata(root, layout)
    kind = (meta or {}).get("kind", "episodes")
    packed = kind == "packed"
    row_len = packed_row_len(meta) if packed else None
    if packed and row_len is None:
        got = ((meta or {}).get("packing") or {}).get("row_len")
        problems.append(Problem("metadata", METADATA_FILE, "packing.row_len", f"a packed dataset needs "
                                f"packing.row_len, an integer >= 2; got {got!r}", "re-create it with `sftdata pack`"))
    state, tok_problems = _read_tokenizer_state(root)
    dtype, dtype_errors, guessed = choose_token_dtype(meta, state, token_dtype)
    problems += tok_problems
    problems += [Problem("metadata", METADATA_FILE, "", e, RECREATE) for e in dtype_errors]
    scan = Scan(Dataset(root, layout, kind, dtype, meta, state, {}), problems, (root / METADATA_FILE).is_file(),
                (root / TOKENIZER_FILE).is_file(), row_len, guessed)
    _open_splits(scan, packed)
    shards = scan.dataset.shards
    if meta is not None and layout == "sharded":
        problems += check_shard_list(meta, {name: [sh.name for sh in sp.shards]
                                            for name, sp in scan.dataset.splits.items()})
    markers = markers_from_state(state)
    for shard in shards:
        problems += size_problems(shard, shard_record(meta, shard.split, shard.name))
        if packed and row_len is not None:
            problems += check_rows(shard, row_len)
            seg = check_segments(shard, row_len)
            if seg or shard.segments is None:
                scan.bad_segments.add(shard.rel)
            problems += seg
        elif not packed:
            bounds = episode_bounds(shard)
            problems += check_index(shard, bounds)
            if markers is not None and kind not in ROW_KINDS:  # a prompt ends with the generation prompt, not EOS
                problems += check_eos(shard, bounds, markers)
    if meta is not None:
        problems += check_counts(meta, shards, packed=packed)
    return scan


def _open_splits(scan: Scan, packed: bool) -> None:
    """Map every shard (flat: every split folder with an episode index) into the scan's
    dataset; a missing file is a problem, not an error."""
    ds = scan.dataset
    for split in SPLITS:
        if ds.layout == "flat":
            d = ds.root / split
            if (d / TOKENS_FILE).is_file() and not (d / EPISODES_FILE).is_file():
                scan.token_streams.append(split)  # a token stream: the token_stream loader reads it
            elif (d / TOKENS_FILE).is_file():
                ds.splits[split] = Split(split, [Shard(d, ds.token_dtype, split, root=ds.root, split=split)])
            continue
        shards, first = [], 0
        for d in list_shards(ds.root, split):
            shard = Shard(d, ds.token_dtype, root=ds.root, split=split, first_gid=first, packed=packed,
                          entries=ds.entries)
            listed = tuple((shard_record(ds.metadata, split, shard.name) or {}).get("files") or {})
            files = row_shard_files(ds.kind) if ds.kind in ROW_KINDS else shard_files(packed)
            files += (MEDIA_FILE,) if ds.has_media else ()
            scan.problems += missing_files(shard, files + listed)
            first += shard.num_items
            shards.append(shard)
        if shards:
            ds.splits[split] = Split(split, shards, packed)


def open_dataset(root: str | Path, *, token_dtype=None) -> Dataset:
    """Open a dataset for reading (memory-mapped), or refuse it: ``DatasetError`` with the
    first structural problem (``scan_dataset``). ``token_dtype`` is needed only for a flat
    layout whose tokens are not uint32."""
    scan = scan_dataset(root, token_dtype=token_dtype)
    problems = scan.strict_problems()
    if problems:
        root = scan.dataset.root
        more = f" ({len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise DatasetError(f"{root}: {problems[0]}{more}. Run `sftdata verify {root}` for the full report")
    return scan.dataset


# ---------------------------------------------------------------------------- token streams
def has_episode_index(root: str | Path, split: str = "train") -> bool:
    """True when ``split`` has ``shard_*/episodes.idx`` or a flat ``episodes.idx``: the
    dataset is episode-indexed (the loader's ``sft_episode`` mode)."""
    root = dataset_path(root)  # a path, a file:// URL, or an object-store URL (fetched into the cache)
    d = root / split
    return (d / EPISODES_FILE).is_file() or any((p / EPISODES_FILE).is_file() for p in list_shards(root, split))


def open_token_stream(root: str | Path, split: str, *, token_dtype=None) -> list[np.ndarray]:
    """The token arrays (memmaps, one per shard in name order) of ``split``, ignoring
    any episode index: what a token-stream (nanoGPT-style) loader samples windows from.
    The dtype comes from dataset_metadata.json, else ``token_dtype``, else uint32."""
    root = dataset_path(root)  # a path, a file:// URL, or an object-store URL (fetched into the cache)
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist")
    meta = read_json(root / METADATA_FILE) if (root / METADATA_FILE).is_file() else None
    dtype, errors, _ = choose_token_dtype(meta, None, token_dtype)
    if errors:
        raise DatasetError(f"{root / METADATA_FILE}: {errors[0]}. Re-create the dataset")
    paths = [p / TOKENS_FILE for p in list_shards(root, split)]
    if not paths and (root / split / TOKENS_FILE).is_file():
        paths = [root / split / TOKENS_FILE]
    if not paths:
        raise DatasetError(f"{root} has no tokens for split {split!r}: expected {split}/{TOKENS_FILE} "
                           f"or {split}/shard_*/{TOKENS_FILE}")
    out = []
    for p in paths:
        if not p.is_file():
            raise DatasetError(f"{p} is missing; the dataset is incomplete")
        if p.stat().st_size % dtype.itemsize:
            raise DatasetError(f"{p}: {p.stat().st_size} bytes is not a whole number of {dtype.name} values "
                               f"({dtype.itemsize} bytes each); the file is truncated or of another dtype. "
                               f"Run `sftdata verify` and re-create the dataset")
        out.append(map_values(p, dtype))
    return out


DESCRIBE = {KIND_PAIRS: "preference pairs (prompt, chosen, rejected)", KIND_KTO: "KTO rows (prompt, completion, label)",
            KIND_PROMPTS: "RL prompts (prompt, columns)"}
PAIR_LOADER = "sftdata.loader.make_pair_loader"


def is_row_kind(ds: Dataset) -> bool:
    return ds.kind in ENTRIES_PER_ROW


def refuse_row_kind(ds: Dataset, reader: str) -> None:
    """``DatasetError`` when ``ds`` holds pairs, KTO rows or RL prompts: ``reader`` (an
    SFT reader: "the SFT loader", "pack" ...) reads episodes, and would otherwise train a
    prompt and its two completions as three conversations."""
    if is_row_kind(ds):
        raise DatasetError(f"{ds.root} is a {ds.kind} dataset ({DESCRIBE[ds.kind]}), not SFT episodes: {reader} "
                           f"reads episodes or packed rows; read it with {PAIR_LOADER} (docs/LOADER.md, "
                           f"\"Pairs, KTO rows and RL prompts\")")


def require_row_kind(ds: Dataset, reader: str, kinds=tuple(ENTRIES_PER_ROW)) -> None:
    """``DatasetError`` unless ``ds`` is one of ``kinds``."""
    if ds.kind not in kinds:
        raise DatasetError(f"{ds.root} is a {ds.kind} dataset: {reader} reads {' or '.join(kinds)} datasets "
                           f"(made by `sftdata prepare-pref` / `sftdata prepare-rl`); read SFT episodes with "
                           f"sftdata.loader.make_loader")
