"""``pack``'s rows as tasks (``--engine ray``; any ``tasks.TaskRunner``).

::

    driver: open the source, plan ──► one task per range of whole output shards ──► adopt each
            every split (bfd/stream:     builds its rows (``rows.build_rows``, the      task's shards
            lengths only, small)         function --engine local runs) from the source  in order, commit
                                         shards, writes them to _parts/SPLIT_K.tmp-PID,
                                         renamed to _parts/SPLIT_K when complete

Shards hold ``shard_tokens // row_len`` rows each, so the rows of every shard are known
from the plan: a task that starts at a shard boundary writes exactly the shards
``--engine local`` writes there, byte for byte. The driver renames them into the split's
folder (no copy), and the split's metadata is the writer's own summary of them.

A split of fewer shards than ``TASKS_PER_CPU`` per CPU (few large shards) is cut finer:
each shard into pieces of consecutive rows, a task each (the same ``build_shards``, a
one-shard split of its own), and one ``merge_shard`` task per shard that concatenates
the pieces' files and rebases their row numbers (``store.shard_merge``): the same bytes.

What crosses the network: to a task, its slice of the plan (the segments of its rows:
56 bytes each) and the source split's index (one object for all tasks, ``shared``); back,
its shards' records (sizes, sha256, counts) and three trained-token counts. Tokens go
from the source shards to the output's staging area without passing through the driver.

A task whose worker dies is retried by Ray; the dead attempt's ``.tmp-PID`` folder is
never renamed, so its partial files are never adopted. A run that stops early stops by
the runner's one rule (``tasks.runner``): STOP in ``_parts``, every task waited for, and
only then is ``_parts`` removed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..packing.plan import PackPlan
from ..storage.fsops import check_owned_folder, folder_identity, make_folder, make_owned_folder
from ..store.format import PARTS_DIR, STOP_FILE, shard_name
from ..store.shard_merge import merge_packed_pieces
from ..store.split_writer import PackedSplitWriter
from ..tasks import TASKS_PER_CPU, Engine, running
from .rows import RowsBuilt, build_rows

MIN_PIECE_ROWS = 64  # a task over part of a shard builds at least this many rows


@dataclass
class RowsPart:
    """What a rows task sends back (small: no tokens)."""

    first_shard: int
    path: str | None  # the folder holding its shards (None: the run stopped)
    shards: list[dict]
    built: RowsBuilt
    pieces: tuple[str, ...] = ()  # a merged shard: its pieces' folders, removed once it is adopted


def plan_slice(plan: PackPlan, r0: int, r1: int) -> PackPlan:
    """Rows ``r0 .. r1-1`` of ``plan`` as a plan of their own (rows 0 .. r1-r0-1)."""
    a, b = plan.segments.row_range(r0, r1)
    seg = plan.segments[a:b]
    seg.row = seg.row - r0
    p0 = int(plan.segments.prefix[:a].sum())
    prefix = plan.prefix_tokens[p0:p0 + int(seg.prefix.sum())] if plan.prefix_tokens.size else plan.prefix_tokens
    return PackPlan(plan.row_len, r1 - r0, np.empty(0, np.int64), seg, prefix)


def shard_ranges(num_rows: int, rows_per_shard: int, cpus: int, shards_per_task: int | None = None
                 ) -> list[tuple[int, int]]:
    """Ranges ``[k0, k1)`` of output shards, one per task: about ``TASKS_PER_CPU`` per CPU."""
    shards = -(-num_rows // rows_per_shard)
    per = shards_per_task or max(1, -(-shards // (TASKS_PER_CPU * cpus)))
    return [(k, min(shards, k + per)) for k in range(0, shards, per)]


def row_tasks(num_rows: int, rows_per_shard: int, cpus: int, shards_per_task: int | None = None,
              rows_per_task: int | None = None) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """The tasks of one split: ``(k0, k1, pieces)`` per unit of output shards ``[k0, k1)``,
    ``pieces`` the row ranges ``[r0, r1)`` its tasks build. A unit is a range of whole
    shards built by one task (``shard_ranges``); where the split has fewer shards than
    ``TASKS_PER_CPU`` per CPU (or ``rows_per_task`` asks), each shard is a unit of its own
    cut into pieces of about ``rows_per_task`` rows (at least ``MIN_PIECE_ROWS``), one
    task each, whose files one more task merges (``store.shard_merge``)."""
    shards = -(-num_rows // rows_per_shard)
    want = TASKS_PER_CPU * cpus
    if rows_per_task is None and shards_per_task is None and shards < want:
        rows_per_task = max(MIN_PIECE_ROWS, -(-num_rows // want))
    if rows_per_task is None or rows_per_task >= rows_per_shard:
        return [(k0, k1, [(k0 * rows_per_shard, min(num_rows, k1 * rows_per_shard))])
                for k0, k1 in shard_ranges(num_rows, rows_per_shard, cpus, shards_per_task)]
    out = []
    for k in range(shards):
        s0, s1 = k * rows_per_shard, min(num_rows, (k + 1) * rows_per_shard)
        out.append((k, k + 1, [(r, min(s1, r + rows_per_task)) for r in range(s0, s1, rows_per_task)]))
    return out


def build_shards(split, plan: PackPlan, seg_whole: np.ndarray, extra: np.ndarray, rule, pad_id: int,
                 token_dtype: str, row_len: int, shard_tokens: int, first_shard: int, stage_dir: str,
                 first_row: int | None = None, stage_id: dict | None = None) -> RowsPart:
    """One task: the rows of ``plan`` (a slice starting at output shard ``first_shard``,
    or, with ``first_row``, a piece of that shard starting at that row) into shard folders
    of its own under ``stage_dir`` (the folder of ``stage_id``: ``fsops.make_owned_folder``)."""
    stop = Path(stage_dir) / STOP_FILE
    if stop.exists():
        return RowsPart(first_shard, None, [], RowsBuilt())
    name = f"{split.name}_{first_shard:06d}" + ("" if first_row is None else f"_row_{first_row:012d}")
    final = Path(stage_dir) / name
    tmp = make_owned_folder(Path(stage_dir), name, stage_id)  # never its parents: a removed staging area stays so
    writer = PackedSplitWriter(tmp, "s", np.dtype(token_dtype), row_len, shard_tokens)
    built = build_rows(split, plan, seg_whole, writer, rule, pad_id, extra, stopped=stop.exists)
    shards = writer.close()["shards"]
    if stop.exists():
        return RowsPart(first_shard, None, [], RowsBuilt())
    check_owned_folder(Path(stage_dir), stage_id)
    if final.exists():  # an earlier attempt completed, but its answer was lost with its worker
        shutil.rmtree(final)
    os.rename(tmp, final)
    return RowsPart(first_shard, str(final / "s"), shards, built)


def merge_shard(split_name: str, first_shard: int, row_len: int, stage_dir: str, stage_id: dict | None,
                *parts: RowsPart) -> RowsPart:
    """One task: output shard ``first_shard`` from the pieces ``parts`` built (each a
    one-shard folder of consecutive rows), byte-identical to building its rows at once."""
    stop = Path(stage_dir) / STOP_FILE
    if stop.exists() or any(p.path is None for p in parts):
        return RowsPart(first_shard, None, [], RowsBuilt())
    name = f"{split_name}_{first_shard:06d}"
    final = Path(stage_dir) / name
    tmp = make_owned_folder(Path(stage_dir), name, stage_id)
    (tmp / "s").mkdir()
    record = merge_packed_pieces([(Path(p.path) / p.shards[0]["name"], p.shards[0]) for p in parts], row_len,
                                 tmp / "s" / shard_name(0), shard_name(0))
    check_owned_folder(Path(stage_dir), stage_id)
    if final.exists():  # an earlier attempt completed, but its answer was lost with its worker
        shutil.rmtree(final)
    os.rename(tmp, final)
    built = RowsBuilt(sum(p.built.trained for p in parts), sum(p.built.trained_whole for p in parts),
                      sum(p.built.trained_extra for p in parts))
    return RowsPart(first_shard, str(final / "s"), [record], built, tuple(str(Path(p.path).parent) for p in parts))


def run_rows(engine: Engine, split, plan: PackPlan, seg_whole: np.ndarray, writer: PackedSplitWriter, rule,
             pad_id: int, extra: np.ndarray, on_rows: Callable[[int], None] | None = None) -> RowsBuilt:
    """One split's rows built by ``engine``'s tasks: a task per range of shards (or per
    piece of a shard, and a merge task per shard: ``row_tasks``), their shards adopted
    into ``writer``'s split folder in order; ``on_rows(r1)`` once rows up to ``r1`` are in."""
    per = writer.rows_per_shard
    stage_dir = writer.dir.parent / PARTS_DIR
    make_folder(stage_dir)
    stage_id = folder_identity(stage_dir)  # what every task checks the folder it writes in by
    out = RowsBuilt()
    with running(engine.start(stage_dir)) as runner:
        units = row_tasks(plan.num_rows, per, runner.cpus, engine.size("shards_per_task"), engine.size("rows_per_task"))
        split_ref, rule_ref = runner.shared(split), runner.shared(rule)
        # the episodes each build task counts
        extras = iter(np.array_split(np.asarray(extra, np.int64), sum(len(pieces) for _, _, pieces in units)))
        shard_tokens = per * plan.row_len
        refs = []  # per unit, the task giving its shards
        for k0, _, pieces in units:
            built = []
            for r0, r1 in pieces:
                a, b = plan.segments.row_range(r0, r1)
                built.append(runner.submit(build_shards, (split_ref, plan_slice(plan, r0, r1), seg_whole[a:b],
                                                          next(extras), rule_ref, pad_id, writer.token_dtype.name,
                                                          plan.row_len, shard_tokens, k0, str(stage_dir),
                                                          r0 if len(pieces) > 1 else None, stage_id), "packing"))
            refs.append(built[0] if len(pieces) == 1 else runner.submit(
                merge_shard, (split.name, k0, plan.row_len, str(stage_dir), stage_id, *built), "packing"))
        make_folder(writer.dir)
        for (k0, k1, _), ref in zip(units, refs):
            _adopt(runner.result(ref, "packing"), k0, writer, out)
            if on_rows:
                on_rows(min(plan.num_rows, k1 * per))
    shutil.rmtree(stage_dir, ignore_errors=True)
    return out


def _adopt(part: RowsPart, k0: int, writer: PackedSplitWriter, out: RowsBuilt) -> None:
    """A task's shards renamed into the split's folder (its shard i is the split's shard
    ``k0 + i``), its pieces' folders removed, its counts added to ``out``."""
    for i, rec in enumerate(part.shards):
        name = shard_name(k0 + i)
        os.rename(Path(part.path) / rec["name"], writer.dir / name)
        writer.shards.append({**rec, "name": name})
    for piece in part.pieces:
        shutil.rmtree(piece, ignore_errors=True)
    out.trained += part.built.trained
    out.trained_whole += part.built.trained_whole
    out.trained_extra += part.built.trained_extra
