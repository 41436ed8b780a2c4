"""Input records rendered again as ``prepare-pref`` / ``prepare-rl`` rendered them, by the
libraries installed now: what ``verify --retokenize`` holds a row dataset's sampled rows to
(``verify.rows.row_drift``; prepare's own is ``prepare.rerender``).

The records are read from the inputs the metadata records (``sources``), with the options
it records (tokenizer, template, format, truncation, reasoning, the record size limit),
through the same ``start_rows`` / ``finish_rows`` a run renders with, a batch at a time
(each batch tokenized while the next renders). An input that changed since (its sha256)
is not rendered: its records are returned as unread, with why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import RecordError, SftDataError
from ..sources import inspect_source, iter_all
from ..store.format import KIND_PROMPTS
from ..tasks import overlapped
from .options import PrefOptions
from .render import one_process_run
from .run import finish_rows, open_context, start_rows

ROW_BATCH = 512  # records rendered again at once


@dataclass
class RowRender:
    """One input record rendered now: its row's entries (ids, mask), or why it is rejected now."""

    where: str
    parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    rejected: str | None = None


def recorded_options(meta: dict) -> PrefOptions:
    """The options a row dataset records, as the run that made it took them."""
    return PrefOptions.from_recorded(meta.get("options") or {})


def rerender_rows(meta: dict, state: dict, records: Sequence[int]) -> tuple[dict[int, RowRender], dict[int, str]]:
    """Each input record of ``records`` (global record numbers) rendered now as a row, and
    why the others could not be (an input changed or gone). Raises ``SftDataError`` when
    the recorded tokenizer or template cannot be opened again."""
    ctx, _ = open_context(recorded_options(meta), meta.get("kind") == KIND_PROMPTS)
    wanted, unread, infos = set(int(r) for r in records), {}, []
    for s in meta.get("sources") or []:
        try:
            info = inspect_source(s["path"])
        except SftDataError as e:
            return {}, dict.fromkeys(wanted, f"its input {s.get('path')} cannot be read now ({e})")
        if s.get("sha256") and info.sha256 and info.sha256 != s["sha256"]:
            first, n = s.get("first_record", 0), s.get("records", 0)
            unread.update({r: f"its input {s['path']} changed since it was read" for r in wanted
                           if first <= r < first + n})
        infos.append(info)

    def batches():
        batch: list = []
        for raw, _ in iter_all(infos, ctx.opts.max_record_bytes):
            if raw.record in wanted and raw.record not in unread:
                batch.append(raw)
            if len(batch) >= ROW_BATCH:
                yield batch, batch
                batch = []
        if batch:
            yield batch, batch

    out: dict[int, RowRender] = {}
    with one_process_run() as pool:  # a batch tokenized as the next renders
        for started, batch in overlapped(batches(), lambda b: start_rows([(r.raw, r.where) for r in b], ctx, pool)):
            for raw, row in zip(batch, finish_rows(started, ctx)):
                out[raw.record] = RowRender(raw.where, rejected=f"{row.reason}: {row.detail}") \
                    if isinstance(row, RecordError) else RowRender(raw.where, list(row.parts))
    return out, unread
