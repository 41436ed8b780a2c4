"""Distributions behind the report's plots, as data: pure functions over per-episode
(or per-row) numpy arrays, computed whole (never a plotted point per episode).

* ``log_histogram``: integer bins that grow by a quarter octave, the same edges for
  every dataset (so two reports overlay), with the cumulative share at each bin's end;
* ``count_histogram``: one bin per value (turns, segments per row), log bins past 64;
* ``share_by_length``: trained share per length bin (median, p10, p90, mean);
* ``truncation_curve``: what truncating to one row would cost at each block size;
* ``file_table``: episodes, tokens and trained tokens per input file;
* ``unit_histogram``: shares in [0, 1] (trained share, packed rows' fill) in equal bins.

Worked example (lengths 3, 5, 5, 40)::

    log_histogram: edges [3, 4, 5, 6, ..., 40, 46]; counts 1 at [3, 4), 2 at [5, 6), 1 at [39, 46)
    cdf at each bin's last value: 0.25 at 3, 0.75 at 5, 1.0 at 45
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .overview import TruncationCost

PER_OCTAVE = 4  # log bins: 2^(k/4), rounded up to integers
MAX_UNIT_BINS = 64  # count_histogram: one bin per value up to this many values


@dataclass
class Bins:
    """``counts[i]`` values fell in ``[edges[i], edges[i + 1])``; ``cdf[i]`` is the share
    of all values (zeros included) at most ``edges[i + 1] - 1`` (integer values)."""

    edges: list[float]
    counts: list[int]
    cdf: list[float]
    total: int  # values counted, zeros included
    zeros: int  # values equal to 0 (a log axis cannot show them)


@dataclass
class ShareByLength:
    """Per-episode trained share, by episode length (log bins, half an octave)."""

    lo: list[int]  # bin i holds lengths [lo[i], hi[i]); bins without episodes are left out
    hi: list[int]
    episodes: list[int]
    p10: list[float]
    p50: list[float]
    p90: list[float]
    mean: list[float]


@dataclass
class FileRow:
    """One input file: what it gave the dataset (all splits together)."""

    path: str
    records: int
    episodes: int
    tokens: int
    trained_tokens: int | None
    rejected: int
    length_p50: float | None


def log_edges(lo: int, hi: int, per_octave: int = PER_OCTAVE) -> np.ndarray:
    """Integer edges ``ceil(2^(k/per_octave))`` (duplicates removed) covering ``[lo, hi]``,
    the same for every dataset: ``log_edges(1, 9) -> [1, 2, 3, 4, 5, 6, 7, 8, 10]``."""
    k0 = int(np.floor(np.log2(max(1, lo)) * per_octave))
    k1 = int(np.ceil(np.log2(max(1, hi) + 1) * per_octave)) + 1
    edges = np.unique(np.ceil(np.exp2(np.arange(k0, k1 + 1) / per_octave) - 1e-9).astype(np.int64))
    last = int(np.searchsorted(edges, hi, side="right"))  # the first edge past hi closes the last bin
    first = max(0, int(np.searchsorted(edges, max(1, lo), side="right")) - 1)
    return edges[first:last + 1]


def _bins(values: np.ndarray, edges: np.ndarray) -> Bins:
    values = np.asarray(values)
    zeros = int((values == 0).sum())
    counts = np.histogram(values, bins=edges)[0] if edges.size > 1 else np.zeros(0, np.int64)
    total = int(values.size)
    cdf = (zeros + np.cumsum(counts)) / max(1, total)
    return Bins([float(e) for e in edges], counts.astype(int).tolist(), np.round(cdf, 6).tolist(), total, zeros)


def log_histogram(values: np.ndarray, per_octave: int = PER_OCTAVE) -> Bins:
    """Non-negative integers in log bins (zeros counted apart, in ``zeros`` and the CDF)."""
    values = np.asarray(values, dtype=np.int64)
    pos = values[values > 0]
    if not pos.size:
        return _bins(values, np.zeros(0, np.int64))
    return _bins(values, log_edges(int(pos.min()), int(pos.max()), per_octave))


def count_histogram(values: np.ndarray) -> Bins:
    """Small non-negative integers, one bin per value ``[v, v + 1)``; past
    ``MAX_UNIT_BINS`` distinct values, log bins (zeros then counted apart)."""
    values = np.asarray(values, dtype=np.int64)
    if not values.size:
        return _bins(values, np.zeros(0, np.int64))
    hi = int(values.max())
    if hi > MAX_UNIT_BINS:
        return log_histogram(values)
    lo = int(values.min())
    b = _bins(values, np.arange(lo, hi + 2))
    b.zeros = 0  # zero has a bin of its own here
    b.cdf = np.round(np.cumsum(b.counts) / max(1, b.total), 6).tolist()
    return b


def share_by_length(lengths: np.ndarray, shares: np.ndarray) -> ShareByLength:
    """Trained share per length bin: median, p10, p90 (nearest rank below) and mean."""
    lengths = np.asarray(lengths, dtype=np.int64)
    shares = np.asarray(shares, dtype=np.float64)
    if not lengths.size:
        return ShareByLength([], [], [], [], [], [], [])
    edges = log_edges(int(lengths.min()), int(lengths.max()), per_octave=2)
    b = np.searchsorted(edges, lengths, side="right") - 1
    key = np.sort(b + 0.5 * np.clip(shares, 0.0, 1.0))  # by bin, then by share: one float sort (lexsort: 6x slower)
    s, nb = 2 * (key - np.floor(key)), np.bincount(b, minlength=edges.size - 1)[:edges.size - 1]
    start = np.concatenate([[0], np.cumsum(nb)[:-1]])
    full = nb > 0
    st, n = start[full], nb[full]

    def q(p: float) -> list[float]:
        return np.round(s[st + np.floor(p * (n - 1)).astype(np.int64)], 4).tolist()

    mean = np.bincount(b, weights=shares, minlength=edges.size - 1)[:edges.size - 1][full] / n
    return ShareByLength(edges[:-1][full].tolist(), edges[1:][full].tolist(), n.astype(int).tolist(), q(0.1),
                         q(0.5), q(0.9), np.round(mean, 4).tolist())


def curve_block_sizes(max_length: int, chosen: int | None = None) -> list[int]:
    """Block sizes for the truncation curve: powers of two from 32 up to the first that
    holds the longest episode whole, and ``chosen``."""
    sizes, b = [], 32
    while True:
        sizes.append(b)
        if b + 1 >= max_length:
            break
        b *= 2
    return sorted(set(sizes) | ({chosen} if chosen else set()))


def truncation_curve(lengths: np.ndarray, block_sizes: list[int], trained_past: list[int] | None,
                     trained_total: int | None) -> list[TruncationCost]:
    """What truncating every episode to ``block_size + 1`` tokens costs, per block size.
    ``trained_past[i]``: trained tokens past the first ``block_sizes[i] + 1`` of each
    episode (from ``collect.scan_split``)."""
    lengths = np.sort(np.asarray(lengths, dtype=np.int64))
    n = lengths.size
    suffix = np.concatenate([np.cumsum(lengths[::-1])[::-1], [0]])  # suffix[i] = sum(lengths[i:])
    out = []
    for i, bs in enumerate(block_sizes):
        keep = bs + 1
        j = int(np.searchsorted(lengths, keep, side="right"))
        longer = n - j
        dropped = int(suffix[j]) - keep * longer
        late = None if trained_past is None else int(trained_past[i])
        out.append(TruncationCost(bs, longer, longer / max(1, n), dropped, late,
                                  None if late is None else late / max(1, trained_total or 0)))
    return out


def file_table(sources: list[dict], records: np.ndarray, lengths: np.ndarray, trained: np.ndarray | None,
               rejected_by_file: dict[str, int]) -> list[FileRow]:
    """Per input file (``sources`` as the metadata lists them, with ``first_record``):
    the episodes whose record number falls in its range, their tokens and trained
    tokens, and the file's rejected records."""
    if not sources:
        return []
    first = np.array([int(s.get("first_record", 0)) for s in sources], dtype=np.int64)
    nfile = len(sources)
    which = np.clip(np.searchsorted(first, np.asarray(records, dtype=np.int64), side="right") - 1, 0, nfile - 1)
    eps = np.bincount(which, minlength=nfile)
    toks = np.bincount(which, weights=lengths, minlength=nfile)
    tr = None if trained is None else np.bincount(which, weights=trained, minlength=nfile)
    lengths = np.asarray(lengths, dtype=np.int64)
    top = int(lengths.max(initial=0)) + 1
    by_file = np.sort(which * top + lengths) % top  # lengths sorted within each file: one integer sort
    starts = np.concatenate([[0], np.cumsum(eps)[:-1]])
    rows = []
    for f, s in enumerate(sources):
        med = float(np.median(by_file[starts[f]:starts[f] + eps[f]])) if eps[f] else None
        path = str(s.get("path"))
        rows.append(FileRow(path, int(s.get("records", 0)), int(eps[f]), int(toks[f]),
                            None if tr is None else int(tr[f]), int(rejected_by_file.get(path, 0)), med))
    return rows


def unit_histogram(shares: np.ndarray, bins: int = 20) -> Bins:
    """Shares in [0, 1] (trained share per episode, fill per packed row) in ``bins``
    equal bins, the last one closed (full rows count there); ``zeros``: shares of 0."""
    fill = np.asarray(shares, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    counts = np.histogram(fill, bins=edges)[0]
    total = int(fill.size)
    return Bins(np.round(edges, 4).tolist(), counts.astype(int).tolist(),
                np.round(np.cumsum(counts) / max(1, total), 6).tolist(), total, int((fill == 0).sum()))
