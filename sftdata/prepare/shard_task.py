"""The second wave of a partitioned run: a worker (a ``--workers`` process, or a Ray task)
writes one final shard from the staged episodes the coordinator's plan names.

::

    _parts/part_000003/s/shard_00000 ─┐  episodes [4, 9) of part 3, those the plan takes
    _parts/part_000004/s/shard_00000 ─┴► _parts/train_000001.tmp-PID-RANDOM/s/shard_00000
                                          ──rename──► train/shard_00001   (its record back)

The shard is written by the split writer itself, so its bytes, sha256 and record are the
ones the single-process run writes at that place. With an object-store output the shard's
files go from the ``.tmp-`` folder straight to the bucket (``storage.object_upload``),
never through the coordinator. A task whose worker died leaves its ``.tmp-`` folder,
never renamed; a retry writes the shard again and replaces one that an
attempt completed but could not report.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from ..records.rejects import writing
from ..storage.fsops import check_owned_folder, make_owned_folder
from ..storage.object_upload import DirectUpload
from ..store.format import ENTRIES_PER_ROW, KIND_EPISODES, STOP_FILE, shard_name
from ..store.shard import Shard
from .plan import Piece, ShardJob
from .split import copy_rows, open_split


def copy_piece(piece: Piece, token_dtype: np.dtype, writer, kind: str = KIND_EPISODES) -> None:
    """The rows (of ``kind``) of ``piece`` appended to ``writer`` (``split.copy_rows``)."""
    route = None if piece.take is None else np.where(piece.take, 0, -1)
    copy_rows(Shard(Path(piece.path), token_dtype, entries=ENTRIES_PER_ROW.get(kind, 1)), kind, piece.first,
              piece.stop, route, [writer], piece.record_offset)


def write_shard(job: ShardJob, token_dtype: str, root: str, stage_dir: str, output: str,
                upload: DirectUpload | None = None, stage_id: dict | None = None, kind: str = KIND_EPISODES,
                first_row: int = 0, media: bool = False) -> dict | None:
    """One task: the shard ``job`` names, written under ``stage_dir`` and renamed to
    ``root/SPLIT/shard_NNNNN``, or, with ``upload`` (an object-store output), put straight
    into the bucket as ``SPLIT/shard_NNNNN/FILE`` (each object checked against its sha256)
    and its local copy removed; returns its record (the split writer's: counts, every
    file's bytes and sha256, value ranges). None when the run has stopped. ``output``: the
    run's output, named by a failed write; ``stage_id``: the identity of ``stage_dir`` the
    coordinator recorded (a task writes only inside that folder: ``fsops.make_owned_folder``);
    ``kind``: of the rows, ``first_row``: the split's rows in the shards before this one;
    ``media``: a vision model's dataset (the shard holds its media table)."""
    stop = Path(stage_dir) / STOP_FILE
    if stop.exists():
        return None
    dtype = np.dtype(token_dtype)
    name = shard_name(job.index)
    tmp = make_owned_folder(Path(stage_dir), f"{job.split}_{job.index:06d}", stage_id)  # never its parents
    writer = open_split(tmp, kind, "s", dtype, 1 << 62, media)
    if kind in ENTRIES_PER_ROW:
        writer.rows = first_row  # the number of its first row (columns.jsonl)
    with writing(tmp, output):
        for piece in job.pieces:
            if stop.exists():
                return None
            copy_piece(piece, dtype, writer, kind)
        record = writer.close()["shards"][0]
    if upload is not None:
        try:
            for fname, f in record["files"].items():
                if stop.exists():
                    return None
                upload.put(tmp / "s" / "shard_00000" / fname, f"{job.split}/{name}/{fname}", f["sha256"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return {**record, "name": name}
    final = Path(root) / job.split / name
    check_owned_folder(Path(stage_dir), stage_id)  # the run still owns its staging area: renamed within it
    if final.exists():  # an earlier attempt completed, but its answer was lost with its worker
        shutil.rmtree(final)
    os.rename(tmp / "s" / "shard_00000", final)
    shutil.rmtree(tmp, ignore_errors=True)
    return {**record, "name": name}
