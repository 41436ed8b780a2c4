"""``sftdata export`` of pairs, KTO rows and RL prompts: TRL's tokenized columns, one row
per pair (KTO row, prompt), with its input record number::

    pairs:    row, record, prompt_ids, chosen_ids, rejected_ids, chosen_mask, rejected_mask
    kto:      row, record, prompt_ids, completion_ids, completion_mask, label
    prompts:  row, record, prompt, columns

The names are TRL 1.x's (``DPOTrainer`` keeps ``prompt_ids``, ``chosen_ids`` and
``rejected_ids`` with its default ``remove_unused_columns=True``; ``KTOTrainer``
``prompt_ids``, ``completion_ids`` and ``label``; ``GRPOTrainer`` ``prompt``) and
``sftdata.torch.PairDataset``'s item keys, so a row of the export is an item of it.
``prompt_ids + chosen_ids`` is exactly the dataset's ``prompt + chosen`` (the split was
made in token space). ``*_mask`` is the completion's mask as prepared (1 = trained; a
template's tokens after its end of turn are 0, where TRL's own collator would train
every completion token: ``sftdata.torch.PreferenceCollator`` uses this mask; ``pretokenized``
keeps these columns). ``label`` is a boolean (TRL's KTO); ``prompt`` the RL prompt's ids;
``columns`` the RL row's other columns, the JSON object ``columns.jsonl`` holds, byte for
byte (a string column). ``record`` is null when unknown.

Exports of an earlier sftdata named these ``prompt_input_ids``, ``chosen_input_ids``,
``*_loss_mask``: ``PreferenceCollator`` still reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import orjson

from ..store.format import KIND_KTO, KIND_PAIRS, KIND_PROMPTS
from ..store.rows import RowSplit
from ..util.ranges import range_index

PARTS = {KIND_PAIRS: ("prompt", "chosen", "rejected"), KIND_KTO: ("prompt", "completion"), KIND_PROMPTS: ("prompt",)}


def ids_column(kind: str, part: str) -> str:
    """The column of a part's token ids: ``prompt_ids``, ``chosen_ids`` ... (an RL prompt's: ``prompt``)."""
    return "prompt" if kind == KIND_PROMPTS else f"{part}_ids"


def row_columns(kind: str) -> list[str]:
    """The columns of an export of ``kind``, in order."""
    parts = PARTS[kind]
    cols = ["row", "record"] + [ids_column(kind, p) for p in parts] + [f"{p}_mask" for p in parts[1:]]
    return cols + {KIND_KTO: ["label"], KIND_PROMPTS: ["columns"]}.get(kind, [])


@dataclass
class RowChunk:
    """Consecutive rows: per-row int64 ``scalars`` (-1 = unknown), list columns as
    ``(offsets, values)`` and, for prompts, the ``columns`` JSON texts."""

    scalars: dict[str, np.ndarray]
    lists: dict[str, tuple[np.ndarray, np.ndarray]]
    texts: dict[str, list[str]]
    labels: np.ndarray | None = None  # kto: bool per row

    @property
    def rows(self) -> int:
        return int(self.scalars["row"].shape[0])

    @property
    def token_count(self) -> int:
        """The rows' tokens as the dataset stores them (the prompt once, as prepare-pref counts)."""
        return sum(int(v.shape[0]) for k, (_, v) in self.lists.items() if not k.endswith("_mask"))

    @property
    def trained_count(self) -> int:
        return sum(int(np.count_nonzero(v)) for k, (_, v) in self.lists.items() if k.endswith("_mask"))


def row_chunks(rs: RowSplit, budget: int) -> Iterator[RowChunk]:
    """The rows of ``rs`` in row order, whole rows of up to about ``budget`` tokens a chunk
    (one Parquet row group), read with plain file reads."""
    sp, k, parts = rs.split, rs.entries, PARTS[rs.kind]
    records = rs.records
    for si, sh in enumerate(sp.shards):
        n = sh.num_items // k
        if not n:
            continue
        first = int(sp.item_offsets[si]) // k
        starts = sh.index[:, 0].astype(np.int64).reshape(n, k)
        lengths = sh.index[:, 1].astype(np.int64).reshape(n, k)
        row_tokens = np.cumsum(lengths.sum(axis=1))
        a = 0
        while a < n:
            base = int(row_tokens[a - 1]) if a else 0
            b = max(a + 1, int(np.searchsorted(row_tokens, base + budget, side="right")))
            b = min(b, n)
            lo, hi = int(starts[a, 0]), int(starts[b - 1, -1] + lengths[b - 1, -1])
            toks, mask = sh.read_range(lo, hi)
            rows = np.arange(first + a, first + b, dtype=np.int64)
            scalars = {"row": rows, "record": records[rows] if records is not None else np.full(b - a, -1, np.int64)}
            lists = {}
            for p, name in enumerate(parts):
                st, ln = starts[a:b, p] - lo, lengths[a:b, p]
                idx = range_index(st, ln)
                off = np.concatenate([[0], np.cumsum(ln)])
                lists[ids_column(rs.kind, name)] = (off, toks[idx].astype(np.int64))
                if p:
                    lists[f"{name}_mask"] = (off, (mask[idx] == 1).astype(np.int8))
            texts = {"columns": [t.decode() for t in rs.columns_text(rows)]} if rs.kind == KIND_PROMPTS else {}
            labels = rs.labels[rows].astype(bool) if rs.kind == KIND_KTO else None
            yield RowChunk(scalars, lists, texts, labels)
            a = b


class RowParquetSink:
    """One Parquet file of a row kind's columns; each chunk is one row group."""

    def __init__(self, path, kind: str, provenance: dict, key: bytes):
        import pyarrow as pa  # optional dependency: only for --format parquet
        import pyarrow.parquet as pq

        self.pa, self.pq = pa, pq
        kinds = {"row": pa.int64(), "record": pa.int64(), "label": pa.bool_(), "columns": pa.string()}
        fields = [(c, kinds.get(c, pa.list_(pa.int8() if c.endswith("_mask") else pa.int64())))
                  for c in row_columns(kind)]
        self.schema = pa.schema(fields, metadata={key: orjson.dumps(provenance)})
        self.path = path
        self._writer = None

    def __enter__(self) -> RowParquetSink:
        self._writer = self.pq.ParquetWriter(self.path, self.schema, compression="snappy")
        return self

    def write(self, c: RowChunk) -> None:
        pa = self.pa
        cols = {name: pa.array(v, mask=v < 0) for name, v in c.scalars.items()}
        for name, (off, values) in c.lists.items():
            cols[name] = pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), pa.array(values))
        for name, values in c.texts.items():
            cols[name] = pa.array(values, type=pa.string())
        if c.labels is not None:
            cols["label"] = pa.array(c.labels)
        table = pa.Table.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)
        self._writer.write_table(table, row_group_size=max(1, c.rows))

    def __exit__(self, *exc) -> None:
        if self._writer is not None:
            self._writer.close()


class RowJsonlSink:
    """One JSON object per line, the columns as keys in order (unknown record numbers as null)."""

    def __init__(self, path, kind: str, provenance: dict, key: bytes):
        self.path = path
        self.columns = row_columns(kind)
        self._f = None

    def __enter__(self) -> RowJsonlSink:
        self._f = open(self.path, "wb")
        return self

    def write(self, c: RowChunk) -> None:
        lines = []
        lists = {name: (off.tolist(), values.tolist()) for name, (off, values) in c.lists.items()}
        for i in range(c.rows):
            row = {}
            for name in self.columns:
                if name in c.scalars:
                    v = int(c.scalars[name][i])
                    row[name] = None if v < 0 else v
                elif name in lists:
                    off, values = lists[name]
                    row[name] = values[off[i]:off[i + 1]]
                elif name == "label":
                    row[name] = bool(c.labels[i])
                else:
                    row[name] = c.texts[name][i]
            lines.append(orjson.dumps(row))
        self._f.write(b"\n".join(lines) + b"\n")

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()
