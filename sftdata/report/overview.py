"""The overview of a dataset, as data: what ``sftdata inspect DATASET`` shows.

Format, kind, tokenizer, token dtype; per split the episodes, tokens, trained tokens,
shards and bytes on disk; episode-length percentiles and histogram; the trained-share
distribution; with ``block_size`` what truncation to ``block_size + 1`` tokens (x and y
of one training row) would cost; the source files, options and rejected records
recorded at prepare time. A packed dataset adds its packing and, per split, rows,
segments and fill (its units are rows: ``episodes`` counts rows there).

Vectorised over the index and the mask: the overview of a 1 GB dataset takes well under
a second (no token is read, the mask once).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DatasetError, UsageError
from ..packing.layout import Segments
from ..store.format import MEDIA_KEY, REJECTS_FILE, SERVING_FILE
from ..store.reader import Dataset, open_dataset
from ..store.serving_file import read_serving
from ..store.shard import Split, split_segments
from ..tokenize import is_hf_state
from ..util.ranges import trained_per_episode
from .rejects import read_rejects

PERCENTILES = (0, 10, 25, 50, 75, 90, 99, 100)


@dataclass
class Histogram:
    """``counts[i]`` values fell in ``[edges[i], edges[i + 1])`` (the last bin is closed)."""

    edges: list[float]
    counts: list[int]


@dataclass
class TruncationCost:
    """What truncating every episode to ``block_size + 1`` tokens (one training row) would drop."""

    block_size: int
    episodes_longer: int  # length > block_size + 1
    episodes_longer_share: float
    tokens_dropped: int
    trained_tokens_dropped: int | None
    trained_dropped_share: float | None  # of all trained tokens


@dataclass
class PackedInfo:
    """What packing did to one split, from its segments."""

    row_len: int
    rows: int
    segments: int
    real_tokens: int  # segment tokens, injected ones included; the rest is padding
    injected_tokens: int
    padding_tokens: int
    fill: float  # real tokens / (rows x row_len)
    segments_per_row: dict[str, float]  # p0 (min), p50, p100 (max), mean


@dataclass
class SplitOverview:
    """One split. Packed: ``episodes`` counts rows, lengths are segment lengths, and the
    trained shares are per row over its real (non-padding) tokens."""

    name: str
    episodes: int
    tokens: int
    trained_tokens: int | None
    trained_share: float | None
    shards: int
    bytes_on_disk: int
    length_percentiles: dict[str, float]  # "p0" (min) ... "p100" (max), and "mean"
    length_histogram: Histogram
    trained_share_percentiles: dict[str, float] | None  # per-episode trained / length
    trained_share_histogram: Histogram | None
    episodes_training_nothing: int | None
    block: TruncationCost | None = None
    packed: PackedInfo | None = None


@dataclass
class Overview:
    path: str
    layout: str
    kind: str
    format_version: int | None
    created_by: str | None
    token_dtype: str
    tokenizer: dict | None
    splits: list[SplitOverview]
    bytes_on_disk: int
    sources: list[dict] = field(default_factory=list)
    options: dict = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    rejected_total: int = 0
    rejects_file: str | None = None
    counts: dict = field(default_factory=dict)  # records_read, repaired, records_truncated, ...
    packing: dict | None = None  # packed: block_size, row_len, strategy, overlong, pad_token_id, seed
    packed_from: dict | None = None  # packed: the source dataset's path and metadata sha256
    notes: list[str] = field(default_factory=list)
    serving: dict | None = None  # serving.json (stop ids, pad id, BOS policy, template); None: an older dataset
    rows: dict | None = None  # pairs, KTO rows, RL prompts: entries per row, rows per split, the truncation used
    media: dict | None = None  # a dataset with media: its counts (items, images, videos, tokens) and "processor"

    def as_dict(self) -> dict:
        return asdict(self)


def open_checked(path, token_dtype=None, tokenizer: str | None = None) -> Dataset:
    """The dataset at ``path`` for a report: ``token_dtype`` and ``tokenizer`` only for
    the older flat layout (which records neither; ``tokenizer`` also for a dataset made
    with a model's tokenizer.json, to say where that file is now), and a packed dataset only when its
    rows and segments are sound (the row views are built from them; index-sized work)."""
    ds = open_dataset(path, token_dtype=token_dtype)
    if token_dtype is not None and ds.metadata is not None:
        raise UsageError(f"--token-dtype is for older flat layouts; {ds.root} records its token dtype")
    if tokenizer is not None and ds.tokenizer_state is not None and not is_hf_state(ds.tokenizer_state):
        raise UsageError(f"--tokenizer is for older flat layouts (or a dataset whose tokenizer.json has moved); "
                         f"{ds.root} records its tokenizer")
    return ds


def episode_bounds(sp: Split) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Per shard: (starts, ends, first global id). ``open_dataset`` refused episodes past
    the tokens, empty or overlapping ones; an older flat layout may still be unsorted,
    which the per-episode sums cannot take."""
    out = []
    for i, sh in enumerate(sp.shards):
        s = sh.index[:, 0].astype(np.int64)
        e = s + sh.index[:, 1].astype(np.int64)
        if e.size and np.any(s[1:] < e[:-1]):
            raise DatasetError(f"{sh.path}: episodes.idx is not sorted (an older flat layout may be); the "
                               f"overview needs sorted episodes. Run `sftdata verify` for details")
        out.append((s, e, int(sp.item_offsets[i])))
    return out


def _percentiles(x: np.ndarray, digits: int | None = None) -> dict[str, float]:
    if not x.size:
        return {}
    q = np.percentile(x, PERCENTILES)
    out = {f"p{p}": (round(float(v), digits) if digits is not None else float(v)) for p, v in zip(PERCENTILES, q)}
    out["mean"] = round(float(x.mean()), 4 if digits is None else digits)
    return out


def length_histogram(lengths: np.ndarray) -> Histogram:
    """Power-of-two bins: [1, 2), [2, 4) ... up to the longest episode."""
    if not lengths.size:
        return Histogram([], [])
    lo = int(np.floor(np.log2(max(1, int(lengths.min())))))
    hi = int(np.floor(np.log2(max(1, int(lengths.max()))))) + 1
    edges = [float(2 ** k) for k in range(lo, hi + 1)]
    counts, _ = np.histogram(lengths, bins=np.array(edges) - 0.5)  # integer lengths: [2^k, 2^(k+1))
    return Histogram(edges, counts.astype(int).tolist())


def share_histogram(shares: np.ndarray) -> Histogram:
    edges = [round(i / 10, 1) for i in range(11)]
    counts, _ = np.histogram(shares, bins=edges)
    return Histogram(edges, counts.astype(int).tolist())


def packed_info(seg: Segments, rows: int, row_len: int) -> PackedInfo:
    """The figures of ``rows`` packed rows of ``row_len`` tokens holding ``seg``."""
    real = int(seg.length.sum())
    per_row = np.bincount(seg.row, minlength=rows) if rows else np.zeros(0, np.int64)
    stats = {} if not rows else {"p0": float(per_row.min()), "p50": float(np.median(per_row)),
                                 "p100": float(per_row.max()), "mean": round(float(per_row.mean()), 4)}
    return PackedInfo(row_len=row_len, rows=rows, segments=len(seg), real_tokens=real,
                      injected_tokens=int(seg.prefix.sum()), padding_tokens=rows * row_len - real,
                      fill=real / (rows * row_len) if rows else 0.0, segments_per_row=stats)


def _split_overview(sp: Split, block_size: int | None, row_len: int | None = None) -> SplitOverview:
    """One split's figures. A packed split (``row_len`` given): lengths are segment
    lengths, shares are per row over its real (non-padding) tokens."""
    bounds = episode_bounds(sp)
    lengths = sp.lengths
    packed = real_per_row = None
    if row_len is not None:
        seg = split_segments(sp)
        packed = packed_info(seg, sp.num_rows, row_len)
        real_per_row = np.bincount(seg.row, weights=seg.length, minlength=sp.num_rows)
        lengths = seg.length
    keep = None if block_size is None else block_size + 1  # one training row: x and y
    trained = late = None
    if sp.has_mask and bounds:
        sums = [trained_per_episode(sh.mask, s, e, keep) for sh, (s, e, _) in zip(sp.shards, bounds)]
        trained = np.concatenate([t for t, _ in sums])
        late = None if keep is None else np.concatenate([x for _, x in sums])
    ttot = None if trained is None else int(trained.sum())
    shares = None if trained is None else trained / np.maximum(lengths if packed is None else real_per_row, 1)
    real = sp.num_tokens if packed is None else packed.real_tokens
    block = None
    if keep is not None:
        long_ = lengths > keep
        n_long = int(long_.sum())
        dropped = None if late is None else int(late.sum())
        block = TruncationCost(block_size, n_long, n_long / max(1, sp.num_items),
                               int((lengths[long_] - keep).sum()), dropped,
                               None if dropped is None else dropped / max(1, ttot))
    return SplitOverview(
        name=sp.name, episodes=sp.num_items, tokens=sp.num_tokens, trained_tokens=ttot,
        trained_share=None if ttot is None else ttot / max(1, real), shards=len(sp.shards),
        bytes_on_disk=sum(p.stat().st_size for sh in sp.shards for p in sh.path.iterdir() if p.is_file()),
        length_percentiles=_percentiles(lengths, 2), length_histogram=length_histogram(lengths),
        trained_share_percentiles=None if shares is None else _percentiles(shares, 4),
        trained_share_histogram=None if shares is None else share_histogram(shares),
        episodes_training_nothing=None if trained is None else int((trained == 0).sum()), block=block,
        packed=packed)


def overview(path: str | Path, *, block_size: int | None = None, token_dtype=None) -> Overview:
    """Everything ``sftdata inspect PATH`` shows. Raises ``DatasetError`` for a folder that
    is not a dataset or whose index does not fit its tokens."""
    if block_size is not None and block_size < 1:
        raise UsageError(f"--block-size must be positive, got {block_size}")
    ds = open_checked(path, token_dtype)
    meta = ds.metadata or {}
    notes = []
    if ds.metadata is None:
        notes.append("older flat layout without dataset_metadata.json: no tokenizer, sources, options or "
                     f"counts recorded; tokens read as {ds.token_dtype.name}")
    packing = ds.packing
    if packing is not None and block_size is not None:
        raise UsageError(f"{ds.root} is packed: its rows are already {packing.get('row_len')} tokens "
                         f"(--block-size {packing.get('block_size')}); --block-size applies to episodes datasets")
    row_len = None if packing is None else int(packing["row_len"])
    splits = [_split_overview(sp, block_size, row_len) for sp in ds.splits.values()]
    for s in splits:
        if s.trained_tokens is None:
            notes.append(f"split {s.name} has no mask.bin: trained tokens unknown")
    counts = dict(meta.get("counts") or {})
    rejected = dict(counts.pop("rejected", {}) or {})
    rejects = ds.root / REJECTS_FILE
    if not rejected and rejects.is_file() and ds.metadata is None:
        found = read_rejects(rejects, examples=0)  # an older layout records no counts: count the file's
        unreadable = {"unreadable_line": found.unreadable_lines} if found.unreadable_lines else {}
        rejected = dict(sorted({**{g.reason: g.count for g in found.groups}, **unreadable}.items()))
    src = meta.get("source") if packing is not None else None
    if src and not Path(str(src.get("path", ""))).is_dir():
        notes.append(f"the source dataset {src.get('path')} is not there any more")
    total = sum(p.stat().st_size for p in ds.root.rglob("*") if p.is_file())
    try:
        serving = read_serving(ds.root)
    except DatasetError as e:  # a damaged serving.json is verify's to report; the overview goes on
        serving = None
        notes.append(f"{SERVING_FILE} cannot be read: {e}")
    else:
        if serving is None and ds.metadata is not None:
            notes.append(f"no {SERVING_FILE}: written by an older version of sftdata (re-create the dataset to get "
                         "one)")
    return Overview(
        path=str(ds.root), layout=ds.layout, kind=ds.kind, format_version=meta.get("format_version"),
        created_by=meta.get("created_by"), token_dtype=ds.token_dtype.name, tokenizer=meta.get("tokenizer"),
        splits=splits, bytes_on_disk=total, sources=list(meta.get("sources") or []),
        options=dict(meta.get("options") or {}), rejected=rejected, rejected_total=sum(rejected.values()),
        rejects_file=str(rejects) if rejects.is_file() else None, counts=counts, packing=packing,
        packed_from=None if src is None else {"path": src.get("path"), "metadata_sha256": src.get("metadata_sha256")},
        notes=notes, serving=serving,
        rows=None if ds.entries == 1 else {"per_row": ds.entries, "splits": {n: sp.num_items // ds.entries
                                                                             for n, sp in ds.splits.items()},
                                           "truncation": meta.get("truncation")},
        media={**meta[MEDIA_KEY], "processor": ds.processor_settings} if ds.has_media else None)
