"""Everything the HTML report of one dataset shows, as data: the overview ``inspect``
shows, the distributions behind the plots (per split), the input files, the rejected
records by reason, and the sampled episodes (packed: rows) token by token.

Index-sized work plus one chunked pass over each split's mask and tokens (``scan_split``):
a dataset of a million episodes is collected in seconds, and nothing grows with its size
but the per-episode arrays (a few numbers per episode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..chat.loss_rule import LossRule
from ..store.media_table import read_media_table
from ..store.reader import Dataset
from ..store.shard import Split, split_segments
from ..util.ranges import CHUNK_TOKENS, OnesBefore, read_range, whole_runs
from .distributions import (
    Bins,
    FileRow,
    ShareByLength,
    count_histogram,
    curve_block_sizes,
    file_table,
    log_histogram,
    share_by_length,
    truncation_curve,
    unit_histogram,
)
from .overview import Overview, TruncationCost, episode_bounds, open_checked, overview
from .rejects import Rejects, read_rejects
from .samples import TOKEN_BUDGET, SampleEpisode, SampleRow, samples
from .views import dataset_tokenizer


@dataclass
class SplitFigures:
    """One split's distributions. ``unit`` is "episode", or "row" for a packed split
    (whose ``lengths`` are then segment lengths and shares are over real tokens)."""

    name: str
    unit: str
    count: int  # episodes (rows)
    tokens: int  # tokens of its episodes (packed: of its segments)
    lengths: Bins
    trained: Bins | None = None  # trained tokens per episode (row)
    shares: Bins | None = None  # trained share per episode (row)
    turns: Bins | None = None  # user, assistant and tool messages per episode
    share_by_length: ShareByLength | None = None
    truncation: list[TruncationCost] | None = None  # one per block size of ``curve_block_sizes``
    fill: Bins | None = None  # packed: real tokens / row length, per row
    segments_per_row: Bins | None = None
    media_tokens: Bins | None = None  # a dataset with media: placeholder tokens per image (video)


@dataclass
class DatasetReport:
    overview: Overview
    figures: list[SplitFigures]
    files: list[FileRow]
    rejects: Rejects
    repairs: dict[str, int]
    samples: list[SampleEpisode] | list[SampleRow]
    sample_split: str
    seed: int
    block_size: int | None
    tokenizer: str
    notes: list[str] = field(default_factory=list)

    @property
    def packed(self) -> bool:
        return self.overview.kind == "packed"


@dataclass
class SplitScan:
    """What ``scan_split`` measures of one split."""

    trained: np.ndarray | None  # trained tokens per episode (None without mask.bin)
    trained_past: list[int] | None  # per keep: trained tokens past each episode's first ``keep``
    turns: np.ndarray | None  # per episode: how many of the ``openers`` ids it holds


def is_opener(tokens: np.ndarray, openers: list[int]) -> np.ndarray:
    """Bool per token: one of ``openers``. Consecutive ids (the chat markers are) take one
    unsigned subtraction, in place (``tokens`` is overwritten), and one comparison."""
    lo, hi = min(openers), max(openers)
    if hi - lo + 1 == len(set(openers)) and tokens.dtype.kind == "u":
        np.subtract(tokens, tokens.dtype.type(lo), out=tokens)  # ids below lo wrap to large values
        return tokens <= hi - lo
    return np.isin(tokens, openers)


def scan_split(sp: Split, keeps: list[int], openers: list[int] | None = None, chunk: int = CHUNK_TOKENS
               ) -> SplitScan:
    """Trained tokens per episode, trained tokens past each ``keep`` (all episodes
    together), and with ``openers`` (marker ids) the count of those ids per episode.

    One pass over the mask (and tokens) in chunks of whole episodes (``whole_runs``), so
    memory stays at a few tens of MB whatever the dataset's size; per chunk the trained
    tokens before any position come from ``OnesBefore``: an episode's are the ones
    before its end minus those before its start, past ``keep`` minus those before
    ``start + keep``."""
    n = sp.num_items
    trained = np.zeros(n, np.int64) if sp.has_mask else None
    past = np.zeros(len(keeps), np.int64) if sp.has_mask else None
    turns = np.zeros(n, np.int64) if openers else None
    for sh, (starts, ends, first) in zip(sp.shards, episode_bounds(sp)):
        for i, j in whole_runs(ends, chunk, starts):
            lo, hi = int(starts[i]), int(ends[j - 1])
            s, e = starts[i:j] - lo, ends[i:j] - lo
            if trained is not None:
                before = OnesBefore(sh.mask, lo, hi)
                at_e = before(e)
                trained[first + i:first + j] = at_e - before(s)
                for k, keep in enumerate(keeps):
                    long_ = np.flatnonzero(e - s > keep)
                    past[k] += int((at_e[long_] - before(s[long_] + keep)).sum())
            if turns is not None:
                pos = np.flatnonzero(is_opener(read_range(sh.tokens, lo, hi), openers))
                turns[first + i:first + j] = np.searchsorted(pos, e) - np.searchsorted(pos, s)
    return SplitScan(trained, None if past is None else past.tolist(), turns)


def _episode_figures(sp: Split, rule: LossRule, block_size: int | None) -> tuple[SplitFigures, np.ndarray | None]:
    lengths = sp.lengths
    sizes = curve_block_sizes(int(lengths.max()) if lengths.size else 1, block_size)
    # turns are counted by their opening markers; a model's template has none the rule knows
    m = getattr(rule, "markers", None)
    openers = None if m is None else [i for i in (m.user, m.assistant, m.tool, m.assistant_context) if i is not None]
    scan = scan_split(sp, [b + 1 for b in sizes], openers)
    fig = SplitFigures(sp.name, "episode", sp.num_episodes, int(lengths.sum()), log_histogram(lengths),
                       turns=None if scan.turns is None else count_histogram(scan.turns))
    if scan.trained is not None:
        shares = scan.trained / np.maximum(lengths, 1)
        fig.trained = log_histogram(scan.trained)
        fig.shares = unit_histogram(shares)
        fig.share_by_length = share_by_length(lengths, shares)
    total = None if scan.trained is None else int(scan.trained.sum())
    fig.truncation = truncation_curve(lengths, sizes, scan.trained_past, total)
    return fig, scan.trained


def _packed_figures(sp: Split, row_len: int) -> SplitFigures:
    seg = split_segments(sp)
    rows = sp.num_rows
    real = np.bincount(seg.row, weights=seg.length, minlength=rows) if rows else np.zeros(0)
    fig = SplitFigures(sp.name, "row", rows, int(seg.length.sum()), log_histogram(seg.length), fill=unit_histogram(real / row_len),
                       segments_per_row=count_histogram(np.bincount(seg.row, minlength=rows)))
    scan = scan_split(sp, [])
    if scan.trained is not None:
        fig.trained = log_histogram(scan.trained)
        fig.shares = unit_histogram(scan.trained / np.maximum(real, 1))
    return fig


def _media_figures(ds: Dataset, figures: list[SplitFigures]) -> None:
    """Each split's tokens per media item, from its shards' media tables (no token read)."""
    for fig, sp in zip(figures, ds.splits.values()):
        tokens = np.concatenate([read_media_table(sh).tokens for sh in sp.shards] or [np.zeros(0, np.int64)])
        fig.media_tokens = log_histogram(tokens) if tokens.size else None


def dataset_report(path: str | Path, *, split: str = "train", sample: int = 8, seed: int = 0,
                   episodes: list[int] | None = None, rows: list[int] | None = None, block_size: int | None = None,
                   token_dtype=None, token_budget: int = TOKEN_BUDGET) -> DatasetReport:
    """Collect what the HTML report of the dataset at ``path`` shows. ``episodes`` (packed:
    ``rows``) of ``split`` are drawn first, then ``sample`` more chosen with ``seed``;
    ``block_size`` marks what truncating to one row of ``block_size + 1`` tokens costs;
    the samples draw ``token_budget`` tokens in all."""
    ov = overview(path, block_size=block_size, token_dtype=token_dtype)
    ds = open_checked(path, token_dtype)
    tok, rule, notes = dataset_tokenizer(ds)
    if ds.tokenizer_state is None:
        notes = [f"the dataset records no tokenizer: its samples are decoded with {tok.name}"]
    shown = samples(ds, split, tok, sample=sample, seed=seed, episodes=episodes, rows=rows, token_budget=token_budget,
                    rule=rule)
    figures: list[SplitFigures] = []
    files: list[FileRow] = []
    rejects = read_rejects(ov.rejects_file)
    if ds.kind == "packed":
        row_len = int(ds.packing["row_len"])
        figures = [_packed_figures(sp, row_len) for sp in ds.splits.values()]
    else:
        trained_all, records_all = [], []
        for sp in ds.splits.values():
            fig, trained = _episode_figures(sp, rule, block_size)
            figures.append(fig)
            trained_all.append(trained)
            records_all.append(sp.sources)
        lengths = np.concatenate([sp.lengths for sp in ds.splits.values()])
        trained = None if any(t is None for t in trained_all) else np.concatenate(trained_all)
        if ds.entries > 1:  # pairs, KTO rows: one record per row, so the files count rows (all their parts)
            lengths = lengths.reshape(-1, ds.entries).sum(axis=1)
            trained = None if trained is None else trained.reshape(-1, ds.entries).sum(axis=1)
        records = None if any(r is None for r in records_all) else np.concatenate(records_all)
        if records is not None:
            files = file_table(ov.sources, records, lengths, trained, rejects.by_file)
        elif ov.sources:
            notes.append("the dataset stores no record numbers (sources.idx): episodes cannot be traced to "
                         "their input files")
    if ds.has_media:
        _media_figures(ds, figures)
    repairs = {k: int(v) for k, v in (ov.counts.get("repaired") or {}).items()}
    return DatasetReport(overview=ov, figures=figures, files=files, rejects=rejects, repairs=repairs, samples=shown,
                         sample_split=split, seed=seed, block_size=block_size, tokenizer=tok.name, notes=notes)
