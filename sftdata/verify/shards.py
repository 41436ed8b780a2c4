"""The checks of ``verify`` that read one shard's data: the unit an engine runs per shard.

``check_shard`` runs the content checks of one shard (token ids, mask values, the mask
rule, the stops; packed: per segment, and the padding; an older flat layout: the EOS
endings) in this process, as ``--engine local`` does shard after shard. ``shard_checks``
is all the reading of one shard a remote task does (``--engine ray``): the content
checks, the trained-token count, the sha256 of its files and, where the checksums do not
prove them, its value ranges; it returns problems and small figures, no data. The driver
merges them in shard order, so the report is the one ``--engine local`` gives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..store import Problem, Shard, sha256_file
from ..store.structure import check_eos, episode_bounds
from .checksums import Job
from .content import check_content
from .description import Vocab
from .metadata import data_ranges, proven_shards
from .packed import check_packed_content
from .stops import StopFindings


@dataclass(frozen=True)
class ShardContext:
    """What the content checks of every shard need to know of the dataset."""

    packed: bool
    row_len: int | None
    vocab: Vocab | None
    pad_id: int | None
    check_eos: bool  # an older flat layout checked with --tokenizer: the reader could not check EOS endings
    bad_segments: frozenset[str] = frozenset()  # shards (rel) whose segments failed the reader's check

    @property
    def rows(self) -> bool:
        """The packed checks can run."""
        return self.packed and self.row_len is not None


def check_shard(sh: Shard, ctx: ShardContext, tick: Callable[[int], None] = lambda n: None,
                stops: StopFindings | None = None) -> list[Problem]:
    """The content problems of one shard (``stops`` sees its chunks too)."""
    if ctx.rows:
        return check_packed_content(sh, ctx.vocab, ctx.pad_id, ctx.row_len, sh.rel not in ctx.bad_segments, tick,
                                    stops)
    if ctx.packed:
        return []
    bounds = episode_bounds(sh)
    found = check_eos(sh, bounds, ctx.vocab.markers) if ctx.check_eos else []
    return found + check_content(sh, bounds, ctx.vocab, tick, stops)


@dataclass
class ShardChecks:
    """What checking one shard away from the driver found (small: no data)."""

    problems: list[Problem]
    bytes_read: int  # token and mask bytes read by the content checks
    trained: int | None  # mask values that are not 0 (None: no mask)
    cannot_stop: dict[str, dict] = field(default_factory=dict)  # ``StopFindings.cannot_stop`` of this shard
    sha256: dict[str, str] = field(default_factory=dict)  # file (relative to the dataset) -> sha256
    ranges: dict | None = None  # ``data_ranges``; None when not measured (--quick, or proven by the checksums)


def shard_checks(sh: Shard, ctx: ShardContext, stops: StopFindings | None, jobs: list[Job], meta: dict | None,
                 meta_sealed: bool, quick: bool) -> ShardChecks:
    """Every check that reads ``sh``'s data: content (``check_shard``), trained tokens, the
    sha256 of ``jobs`` (its files), and the value ranges unless ``quick`` or proven by them."""
    read = [0]

    def tick(n: int) -> None:
        read[0] += n

    problems = check_shard(sh, ctx, tick, stops)
    trained = None if sh.mask is None else int(np.count_nonzero(sh.mask))
    sums = {fn: sha256_file(p) for fn, p, _, _ in jobs}
    ranges = None
    if meta is not None and not quick:
        hashed = [(fn, sums[fn], rec.get("sha256"), shard) for fn, _, rec, shard in jobs]
        if sh.rel not in proven_shards(meta, [sh], hashed, meta_sealed):
            ranges = data_ranges(sh)
    return ShardChecks(problems, read[0], trained, {} if stops is None else stops.cannot_stop, sums, ranges)
