"""What a dataset holds, as data (the CLI draws it).

* ``overview(path, block_size=None)``: format, kind, tokenizer, token dtype; per split
  the episodes, tokens, trained tokens, shards and bytes on disk; episode-length
  percentiles and histogram; the trained-share distribution; with ``block_size`` what
  truncation to ``block_size + 1`` tokens (x and y of one row) would cost; the source
  files, options and rejected records recorded at prepare time.
* ``episode_views(path, split, episodes=..., record=..., sample=...)``: one or more
  episodes as pieces of decoded text (markers apart, trained or not) and, on request,
  one row per token.

Vectorised over the index and the mask: the overview of a 1 GB dataset takes well under
a second (no token is read, the mask once). This module is imported as
``from sftdata import inspect as sft_inspect`` where the standard ``inspect`` is in use.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import orjson

from .errors import DatasetError, UsageError
from .inspect_packed import PackedInfo, packed_info, row_view, select_rows, split_segments
from .masking import loss_mask
from .range_sums import trained_per_episode
from .store import REJECTS_FILE, Dataset, Split, open_dataset
from .tokenizer import ChatTokenizer, load_tokenizer

PERCENTILES = (0, 10, 25, 50, 75, 90, 99, 100)


@dataclass
class Histogram:
    """``counts[i]`` values fell in ``[edges[i], edges[i + 1])`` (the last bin is closed)."""

    edges: list[float]
    counts: list[int]


@dataclass
class BlockCost:
    """What truncating every episode to ``block_size + 1`` tokens would drop."""

    block_size: int
    episodes_longer: int  # length > block_size + 1
    episodes_longer_share: float
    tokens_dropped: int
    trained_tokens_dropped: int | None
    trained_dropped_share: float | None  # of all trained tokens


@dataclass
class SplitOverview:
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
    block: BlockCost | None = None
    packed: PackedInfo | None = None  # packed datasets: episodes are rows, lengths segment lengths


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

    def as_dict(self) -> dict:
        return asdict(self)


def _episode_bounds(sp: Split) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Per shard: (starts, ends, first global id), after checking the index fits the
    tokens and is sorted without overlaps (inspect reads a dataset verify may not have
    passed)."""
    out = []
    for i, sh in enumerate(sp.shards):
        s = sh.episodes[:, 0].astype(np.int64)
        e = s + sh.episodes[:, 1].astype(np.int64)
        if e.size and (int(e.max()) > sh.tokens.shape[0] or int(sh.episodes.max()) >= 2**62):
            raise DatasetError(f"{sh.path}: episodes.idx points past the end of tokens.bin; the shard is "
                               f"damaged. Run `sftdata verify` for details")
        if e.size and (np.any(s[1:] < e[:-1]) or np.any(e <= s)):
            raise DatasetError(f"{sh.path}: episodes.idx holds empty, unsorted or overlapping episodes; the "
                               f"index is damaged. Run `sftdata verify` for details")
        out.append((s, e, int(sp.episode_offsets[i])))
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


def _split_overview(sp: Split, block_size: int | None, row_len: int | None = None) -> SplitOverview:
    """One split's figures. A packed split (``row_len`` given): lengths are segment
    lengths, shares are per row over its real (non-padding) tokens."""
    bounds = _episode_bounds(sp)
    lengths = sp.lengths
    packed = None
    if row_len is not None:
        packed = packed_info(sp, row_len)
        seg = split_segments(sp)
        real_per_row = np.bincount(seg.row, weights=seg.length, minlength=sp.num_episodes)
    keep = None if block_size is None else block_size + 1  # one training row: x and y
    trained = late = None
    if sp.has_mask and bounds:
        sums = [trained_per_episode(sh.mask, s, e, keep) for sh, (s, e, _) in zip(sp.shards, bounds)]
        trained = np.concatenate([t for t, _ in sums])
        late = None if keep is None else np.concatenate([x for _, x in sums])
    ttot = None if trained is None else int(trained.sum())
    shares = None if trained is None else trained / np.maximum(lengths if packed is None else real_per_row, 1)
    real = sp.num_tokens if packed is None else packed.real_tokens
    if packed is not None:
        lengths = seg.length
    block = None
    if keep is not None:
        long_ = lengths > keep
        n_long = int(long_.sum())
        dropped = None if late is None else int(late.sum())
        block = BlockCost(block_size, n_long, n_long / max(1, sp.num_episodes), int((lengths[long_] - keep).sum()),
                          dropped, None if dropped is None else dropped / max(1, ttot))
    return SplitOverview(
        name=sp.name, episodes=sp.num_episodes, tokens=sp.num_tokens, trained_tokens=ttot,
        trained_share=None if ttot is None else ttot / max(1, real), shards=len(sp.shards),
        bytes_on_disk=sum(p.stat().st_size for sh in sp.shards for p in sh.path.iterdir() if p.is_file()),
        length_percentiles=_percentiles(lengths, 2), length_histogram=length_histogram(lengths),
        trained_share_percentiles=None if shares is None else _percentiles(shares, 4),
        trained_share_histogram=None if shares is None else share_histogram(shares),
        episodes_training_nothing=None if trained is None else int((trained == 0).sum()), block=block,
        packed=packed)


def _rejects_from_file(path: Path) -> Counter:
    c: Counter = Counter()
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    c[orjson.loads(line).get("reason", "unknown")] += 1
                except (orjson.JSONDecodeError, AttributeError):
                    c["unreadable_line"] += 1
    return c


def _open(path, token_dtype, tokenizer=None) -> Dataset:
    ds = open_dataset(path, token_dtype=token_dtype)
    if token_dtype is not None and ds.metadata is not None:
        raise UsageError(f"--token-dtype is for older flat layouts; {ds.root} records its token dtype")
    if tokenizer is not None and ds.tokenizer_state is not None:
        raise UsageError(f"--tokenizer is for older flat layouts; {ds.root} records its tokenizer")
    return ds


def overview(path: str | Path, *, block_size: int | None = None, token_dtype=None) -> Overview:
    """Everything ``sftdata inspect PATH`` shows. Raises ``DatasetError`` for a folder that
    is not a dataset or whose index does not fit its tokens."""
    if block_size is not None and block_size < 1:
        raise UsageError(f"--block-size must be positive, got {block_size}")
    ds = _open(path, token_dtype)
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
        rejected = dict(sorted(_rejects_from_file(rejects).items()))
    src = meta.get("source") if packing is not None else None
    if src and not Path(str(src.get("path", ""))).is_dir():
        notes.append(f"the source dataset {src.get('path')} is not there any more")
    total = sum(p.stat().st_size for p in ds.root.rglob("*") if p.is_file())
    return Overview(
        path=str(ds.root), layout=ds.layout, kind=ds.kind, format_version=meta.get("format_version"),
        created_by=meta.get("created_by"), token_dtype=ds.token_dtype.name, tokenizer=meta.get("tokenizer"),
        splits=splits, bytes_on_disk=total, sources=list(meta.get("sources") or []),
        options=dict(meta.get("options") or {}), rejected=rejected, rejected_total=sum(rejected.values()),
        rejects_file=str(rejects) if rejects.is_file() else None, counts=counts, packing=packing,
        packed_from=None if src is None else {"path": src.get("path"), "metadata_sha256": src.get("metadata_sha256")},
        notes=notes)


# ---------------------------------------------------------------------------- episodes
@dataclass
class Piece:
    """A run of decoded text: one marker, or text tokens that are all trained or all not."""

    text: str
    trained: bool
    marker: bool
    injected: bool = False  # packed rows: context the packer prepended (never trained)


@dataclass
class TokenRow:
    position: int
    id: int
    text: str
    trained: bool
    marker: bool
    span: str  # the span the token lies in: system, user, assistant, tool, or "" outside


@dataclass
class EpisodeView:
    split: str
    episode: int
    record: int | None  # input record number (sources.idx), when stored
    shard: str
    start: int  # token offset in the shard's tokens.bin
    length: int
    trained_tokens: int | None
    pieces: list[Piece]
    tokens: list[TokenRow] | None = None
    rule_differs_at: list[int] | None = None  # positions where the stored mask is not the rule's

    def as_dict(self) -> dict:
        return asdict(self)


def spans_of(ids: np.ndarray, tok: ChatTokenizer) -> list[str]:
    """The span each token lies in: system, user, assistant, tool, or "" outside any."""
    m = tok.ids
    names = {m.system: "system", m.user: "user", m.assistant: "assistant", m.tool: "tool"}
    out, cur = [], ""
    for t in ids.tolist():
        if t in names:
            cur = names[t]
        out.append(cur)
        if t in (m.end, m.eos):
            cur = ""
    return out


def pieces_of(ids: np.ndarray, trained: np.ndarray, is_marker: np.ndarray, tok: ChatTokenizer,
              injected: bool = False) -> list[Piece]:
    """Runs of text that break at every marker and wherever training starts or stops."""
    n = ids.shape[0]
    cut = np.flatnonzero(is_marker[1:] | is_marker[:-1] | (trained[1:] != trained[:-1])) + 1
    bounds = [0, *cut.tolist(), n] if n else [0]
    return [Piece(tok.token_text(int(ids[a])) if is_marker[a] else tok.decode(ids[a:b].tolist()),
                  bool(trained[a]), bool(is_marker[a]), injected) for a, b in zip(bounds[:-1], bounds[1:])]


def episode_view(ds: Dataset, split: str, episode: int, tok: ChatTokenizer, *, tokens: bool = False) -> EpisodeView:
    """One episode as pieces of text (and, with ``tokens``, one row per token)."""
    sp = ds.split(split)
    shard, local = sp.locate(episode)
    ids, mask = sp.episode(episode)
    ids = np.asarray(ids, dtype=np.int64)
    trained = np.zeros(ids.shape[0], bool) if mask is None else np.asarray(mask) != 0
    markers = set(tok.special_tokens.values())
    is_marker = np.isin(ids, list(markers))
    n = ids.shape[0]
    pieces = pieces_of(ids, trained, is_marker, tok)
    rows = None
    if tokens:
        spans = spans_of(ids, tok)
        rows = [TokenRow(p, int(t), tok.token_text(int(t)), bool(trained[p]), bool(is_marker[p]), spans[p])
                for p, t in enumerate(ids)]
    differs = None
    if mask is not None:
        differs = np.flatnonzero(loss_mask(ids, tok.ids) != trained).tolist()
    sources = shard.sources
    return EpisodeView(split=split, episode=int(episode),
                       record=None if sources is None or local >= sources.shape[0] else int(sources[local]),
                       shard=shard.name, start=int(shard.episodes[local, 0]), length=int(n),
                       trained_tokens=None if mask is None else int(trained.sum()), pieces=pieces, tokens=rows,
                       rule_differs_at=differs)


def find_record(ds: Dataset, record: int) -> tuple[str, int]:
    """(split, episode id) of the episode made from input record ``record``."""
    for name, sp in ds.splits.items():
        src = sp.sources
        if src is None:
            raise DatasetError(f"split {name} has no sources.idx: record numbers are not stored in this dataset; "
                               f"use --episode")
        hit = np.flatnonzero(src == record)
        if hit.size:
            return name, int(hit[0])
    why = ""
    rejects = ds.root / REJECTS_FILE
    if rejects.is_file():
        with open(rejects, "rb") as f:
            for line in f:
                try:
                    r = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if r.get("record") == record:
                    why = f": it was rejected at prepare time ({r.get('reason')}: {r.get('message')}; {r.get('where')})"
                    break
    raise DatasetError(f"input record {record} is in no split of {ds.root}{why or ' (no such record was kept)'}")


def sample_ids(n: int, k: int, seed: int) -> list[int]:
    """``k`` distinct episode ids of ``n``, drawn with ``RandomState(seed)``, in id order."""
    if k < 1:
        raise UsageError(f"--sample must be at least 1, got {k}")
    return sorted(np.random.RandomState(seed).choice(n, min(k, n), replace=False).tolist()) if n else []


def views(path: str | Path, split: str = "train", *, episodes: list[int] | None = None,
          rows: list[int] | None = None, record: int | None = None, sample: int | None = None, seed: int = 0,
          tokens: bool = False, token_dtype=None, tokenizer: str | None = None) -> tuple[list, list[str]]:
    """What ``inspect --episode/--row/--record/--sample`` shows: ``EpisodeView``s of an
    episodes dataset, ``RowView``s of a packed one; and notes about them."""
    chosen = sum(x is not None for x in (episodes or None, rows or None, record, sample))
    if chosen != 1:
        raise UsageError("give exactly one of --episode, --row, --record or --sample")
    ds = _open(path, token_dtype, tokenizer)
    notes = []
    if ds.tokenizer_state is not None:
        tok = ds.tokenizer()
    else:
        tok = load_tokenizer(tokenizer)
        notes.append(f"the dataset records no tokenizer: decoded with {tok.name} (pass --tokenizer to choose)")
    if ds.kind == "packed":
        found = select_rows(ds, split, rows=rows, episodes=episodes, record=record, sample=sample, seed=seed)
        return [row_view(ds, s, r, tok, tokens=tokens) for s, r in found], notes
    if rows:
        raise UsageError("--row is for packed datasets; this one holds episodes: use --episode")
    if record is not None:
        split, gid = find_record(ds, record)
        ids = [gid]
    elif sample is not None:
        ids = sample_ids(ds.split(split).num_episodes, sample, seed)
    else:
        ids = list(episodes)
    return [episode_view(ds, split, i, tok, tokens=tokens) for i in ids], notes
