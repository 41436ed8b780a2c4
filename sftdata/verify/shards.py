"""The checks of ``verify`` that read one shard's data: the unit an engine runs per shard.

``check_shard`` runs the content checks of one shard (token ids, mask values, the mask
rule, the stops; packed: per segment, and the padding; an older flat layout: the EOS
endings) in this process, as ``--engine local`` does shard after shard. ``shard_checks``
is all the reading of one shard a remote task does (``--engine ray``): the content
checks, the trained-token count, the sha256 of its files and, where the checksums do not
prove them, its value ranges; it returns problems and small figures, no data. The driver
merges them in shard order, so the report is the one ``--engine local`` gives. A large
shard can also be checked in parts (``shard_parts``, ``piece_checks``, ``merge_pieces``:
ranges of its episodes or rows, merged into the same problems), its files hashed whole.

The checksums: sha256 of every file the metadata records, compared
with the record (hashing runs in threads beside the content checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..storage import METADATA_FILE
from ..store.format import RECREATE, Problem, recorded_files, shard_record
from ..store.shard import Shard
from ..store.structure import check_eos, episode_bounds
from ..util.hashing import sha256_file
from .content import (
    Part,
    Tally,
    Vocab,
    check_content,
    check_packed_content,
    content_problems,
    content_tally,
    packed_problems,
    packed_tally,
)
from .metadata import data_ranges, proven_shards
from .rows import column_problems, label_problems, row_mask_problems
from .stops import StopFindings

Job = tuple[str, Path, dict, str | None]  # (file relative to the dataset, path, its record, shard rel or None)


def checksum_jobs(root: Path, meta: dict, shards: list[Shard]) -> tuple[list[Job], list[Problem], list[Problem]]:
    """The files to hash: those whose size matches the record (a size mismatch is
    already a problem: no need to hash). Also the problems of the top-level files (the
    reader checks the shards' files): missing (``files``) and resized (``sizes``)."""
    jobs, missing, resized = [], [], []
    for fn, p, rec, shard in recorded_files(root, meta, shards):
        if shard is not None:
            if p.is_file() and p.stat().st_size == rec.get("bytes", p.stat().st_size):
                jobs.append((fn, p, rec, shard))
        elif not p.is_file():
            missing.append(Problem("files", fn, "", f"{fn} is missing", "restore it, or " + RECREATE))
        elif rec.get("bytes") not in (None, p.stat().st_size):
            resized.append(Problem("sizes", fn, "", f"{fn} is {p.stat().st_size:,} bytes; {METADATA_FILE} "
                                   f"recorded {rec['bytes']:,}: it changed after prepare", RECREATE))
        else:
            jobs.append((fn, p, rec, None))
    return jobs, missing, resized


def checksum_problems(results: list[tuple[str, str, str, str | None]], meta: dict,
                      shards: list[Shard]) -> list[Problem]:
    """One problem per changed file, or one per shard when every file of it changed.
    ``results``: (file, sha256 found, sha256 recorded, shard rel or None)."""
    bad = [r for r in results if r[1] != r[2]]
    out = []
    for sh in shards:
        recorded = list((shard_record(meta, sh.split, sh.name) or {}).get("files") or {})
        mine = [r for r in bad if r[3] == sh.rel]
        if len(recorded) >= 2 and len(mine) == len(recorded):
            out.append(Problem("checksums", sh.rel, "", f"every file of {sh.rel} ({', '.join(recorded)}) differs "
                               f"from the sha256 recorded in {METADATA_FILE}: the shard was replaced, e.g. by a "
                               "shard of another dataset", "restore this shard from this dataset's copy, or "
                               + RECREATE))
            bad = [r for r in bad if r[3] != sh.rel]
    for fn, got, want, _ in bad:
        out.append(Problem("checksums", fn, "", f"sha256 is {got[:16]}..., {METADATA_FILE} recorded "
                           f"{str(want)[:16]}...: the file changed after prepare (a flipped bit, a partial "
                           "copy or an edit)", "restore the file from a good copy, or " + RECREATE))
    return out


@dataclass(frozen=True)
class ShardContext:
    """What the content checks of every shard need to know of the dataset."""

    packed: bool
    row_len: int | None
    vocab: Vocab | None
    pad_id: int | None
    check_eos: bool  # an older flat layout checked with --tokenizer: the reader could not check EOS endings
    bad_segments: frozenset[str] = frozenset()  # shards (rel) whose segments failed the reader's check
    row_kind: str | None = None  # a row dataset's kind (pairs, kto, prompts): its mask rule, labels, columns by row

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
    if ctx.row_kind:
        return check_content(sh, bounds, ctx.vocab, tick, stops, rule=False) + label_problems(sh) + \
            column_problems(sh, ctx.row_kind) + row_mask_problems(sh, None if ctx.vocab is None else ctx.vocab.rule)
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
    sums, ranges = file_checks(sh, jobs, meta, meta_sealed, quick)
    return ShardChecks(problems, read[0], trained, {} if stops is None else stops.cannot_stop, sums, ranges)


def file_checks(sh: Shard, jobs: list[Job], meta: dict | None, meta_sealed: bool, quick: bool
                ) -> tuple[dict[str, str], dict | None]:
    """The sha256 of ``jobs`` (``sh``'s files: one sequential pass each, never split), and
    ``sh``'s value ranges unless ``quick`` or proven by those sums (``ShardChecks.ranges``)."""
    sums = {fn: sha256_file(p) for fn, p, _, _ in jobs}
    ranges = None
    if meta is not None and not quick:
        hashed = [(fn, sums[fn], rec.get("sha256"), shard) for fn, _, rec, shard in jobs]
        if sh.rel not in proven_shards(meta, [sh], hashed, meta_sealed):
            ranges = data_ranges(sh)
    return sums, ranges


# A shard cut into parts (an engine's tasks over part of a shard, ``--engine ray``):
#
#   shard:  [ep 0 ... ep 999][ep 1000 ... ep 1999][ep 2000 ... end]   + its files' sha256 (one task, whole files)
#   parts:   piece_checks 0    piece_checks 1       piece_checks 2
#   merge:   Tally.merge and StopFindings.absorb_part in part order  ->  the problems check_shard gives
#
# A check's first problem is the first part's that has one, its counts add up, and the trained
# tokens are counted over a partition of mask.bin; so the report is the whole shard's.

MIN_PART_ITEMS = 256  # a part checks at least this many episodes (rows)


def splittable(ctx: ShardContext) -> bool:
    """Whether a shard's content checks can run as parts: not the EOS endings of an older
    flat layout (``check_eos`` reports over the whole shard), nor a row dataset's (its rows
    are checked a shard at a time), nor a packed dataset whose row length is unknown
    (nothing to check)."""
    return not ctx.check_eos and not ctx.row_kind and (ctx.rows or not ctx.packed)


def shard_parts(shards: list[Shard], ctx: ShardContext, want: int, items_per_part: int | None = None
                ) -> list[list[Part] | None]:
    """Per shard, its parts (None: checked whole). Shards are cut only when there are
    fewer than ``want`` of them (or ``items_per_part`` asks): into parts of about
    ``items_per_part`` episodes (rows), by default enough for ``want`` tasks over all the
    shards, at least ``MIN_PART_ITEMS``. The last part runs to the shard's end."""
    if not splittable(ctx) or (items_per_part is None and len(shards) >= want):
        return [None] * len(shards)
    per = items_per_part or max(MIN_PART_ITEMS, -(-sum(sh.num_items for sh in shards) // max(1, want)))
    out: list[list[Part] | None] = []
    for sh in shards:
        n = sh.num_items
        out.append(None if n <= per else [(lo, lo + per if lo + per < n else None) for lo in range(0, n, per)])
    return out


@dataclass
class PieceChecks:
    """What checking part of a shard found (``piece_checks``): findings, not yet problems."""

    tally: Tally
    stops: tuple[dict, dict] | None  # ``StopFindings.part_state``
    cannot_stop: dict[str, dict]
    bytes_read: int
    trained: int | None  # mask values that are not 0 in this part's share of mask.bin


def piece_checks(sh: Shard, ctx: ShardContext, stops: StopFindings | None, part: Part, k: int, n: int
                 ) -> PieceChecks:
    """The content checks of ``part`` of ``sh`` (part ``k`` of ``n``; ``stops``: the rule and
    options, its findings so far ignored); the trained tokens of mask.bin's ``k``-th of ``n`` equal slices."""
    read = [0]

    def tick(b: int) -> None:
        read[0] += b

    stops = None if stops is None else stops.fresh()  # this part's findings only
    if ctx.rows:
        tally = packed_tally(sh, ctx.vocab, ctx.pad_id, ctx.row_len, sh.rel not in ctx.bad_segments, tick, stops,
                             part)
    else:
        tally = content_tally(sh, episode_bounds(sh), ctx.vocab, tick, stops, part)
    trained = None
    if sh.mask is not None:
        size = sh.mask.size
        trained = int(np.count_nonzero(sh.mask[k * size // n:(k + 1) * size // n]))
    return PieceChecks(tally, None if stops is None else stops.part_state(),
                       {} if stops is None else stops.cannot_stop, read[0], trained)


def merge_pieces(sh: Shard, ctx: ShardContext, stops: StopFindings | None, pieces: list[PieceChecks],
                 files: tuple[dict[str, str], dict | None]) -> ShardChecks:
    """The ``ShardChecks`` of ``sh`` from its parts' checks (in part order) and its
    ``file_checks``: equal to ``shard_checks`` of the whole shard."""
    tally = Tally()
    st = None if stops is None else stops.fresh()
    for p in pieces:
        tally.merge(p.tally)
        if st is not None:
            st.absorb_part(p.stops, p.cannot_stop)
    found = packed_problems(sh, ctx.vocab, ctx.pad_id, ctx.row_len, tally) if ctx.rows else \
        content_problems(sh, ctx.vocab, tally)
    problems = found + ([] if st is None else st.shard_problems(sh))
    trained = None if sh.mask is None else sum(p.trained for p in pieces)
    return ShardChecks(problems, sum(p.bytes_read for p in pieces), trained,
                       {} if st is None else st.cannot_stop, *files)
