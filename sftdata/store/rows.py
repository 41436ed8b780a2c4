"""Reading the row kinds (preference pairs, KTO rows, RL prompts): a split's index entries
seen as rows of ``format.ENTRIES_PER_ROW[kind]`` entries, and the refusal an SFT reader gives
one of them.

A pair is three consecutive entries of ``episodes.idx`` (prompt, chosen, rejected), never
across shards, so pair ``p`` of a split is entries ``3p, 3p + 1, 3p + 2`` of its global
numbering; a KTO row two (prompt, completion), an RL prompt one::

    entries (global ids)   0      1       2        3      4       5
    pairs                  prompt chosen  rejected | prompt chosen  rejected
    row                    0                       | 1
    sources.idx            record of row 0         | record of row 1

``prompt + chosen`` and ``prompt + rejected`` are what a trainer reads: the prompt's ids
start both sequences, its mask is 0, each completion's mask is the template's rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import orjson

from ..errors import DatasetError
from ..media.item import MediaSpan, span_from_row
from .format import COLUMNS_FILE, ENTRIES_PER_ROW, KIND_KTO, KIND_PAIRS, KIND_PROMPTS, MEDIA_FILE
from .reader import Dataset, require_row_kind
from .shard import Split

ROW_ITEMS = {KIND_PAIRS: "pairs", KIND_KTO: "rows", KIND_PROMPTS: "prompts"}  # what the order's ids name (logs, replay)
ROW_ID_COLUMN = {KIND_PAIRS: "pair", KIND_KTO: "row", KIND_PROMPTS: "prompt"}  # replay-order's id column


@dataclass
class Rows:
    """Rows of any kind, in input order: one concatenated ids/mask array, the length of each
    of its sequences (``per`` a row: an episode 1, a pair 3), each row's record, and its
    kind's extras (an episode's "last reply only" flag and media spans, a KTO row's label, an
    RL prompt's ``columns`` object; None where the kind has none)."""

    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    sources: np.ndarray
    per: int = 1
    flags: np.ndarray | None = None
    labels: np.ndarray | None = None
    columns: list[bytes] | None = None
    media: list | None = None  # episodes: each one's media spans (a tuple of MediaSpan); None: none has any

    @property
    def size(self) -> int:
        return int(self.sources.shape[0])

    def only(self, keep: np.ndarray) -> Rows:
        """The rows where ``keep`` (bool, one a row) is True."""
        row_len = self.lengths.reshape(-1, self.per).sum(axis=1)
        tokens = np.repeat(keep, row_len)
        return Rows(self.ids[tokens], self.mask[tokens], self.lengths[np.repeat(keep, self.per)], self.sources[keep],
                    self.per, None if self.flags is None else self.flags[keep],
                    None if self.labels is None else self.labels[keep],
                    None if self.columns is None else [c for c, k in zip(self.columns, keep.tolist()) if k],
                    None if self.media is None else [m for m, k in zip(self.media, keep.tolist()) if k])

    def without(self, records) -> Rows:
        """The rows of every record but ``records``."""
        return self.only(~np.isin(self.sources, np.fromiter(records, dtype=np.int64)))


@dataclass
class RowSplit:
    """One split of a row kind, by row id: the global entry ids of each row's parts, their
    lengths, the input record of each row, and (KTO) labels, (prompts) extra columns."""

    kind: str
    split: Split

    @property
    def entries(self) -> int:
        return ENTRIES_PER_ROW[self.kind]

    @property
    def num_rows(self) -> int:
        return self.split.num_items // self.entries

    def entry_ids(self, rows) -> np.ndarray:
        """(len(rows), entries) global entry ids: prompt first, then the completion(s)."""
        rows = np.asarray(rows, dtype=np.int64)
        return rows[:, None] * self.entries + np.arange(self.entries, dtype=np.int64)

    @cached_property
    def part_lengths(self) -> np.ndarray:
        """(num_rows, entries) token counts: prompt, then each completion."""
        return self.split.lengths[:self.num_rows * self.entries].reshape(-1, self.entries)

    @cached_property
    def sequence_lengths(self) -> np.ndarray:
        """(num_rows, sides) tokens of each sequence a trainer reads: prompt + each
        completion (a prompts row: the prompt)."""
        pl = self.part_lengths
        return pl if self.entries == 1 else pl[:, :1] + pl[:, 1:]

    @cached_property
    def records(self) -> np.ndarray | None:
        """The input record number of every row (int64), or None when not stored."""
        return self.split.sources

    @cached_property
    def labels(self) -> np.ndarray:
        """KTO: each row's label (1 desirable, 0 undesirable), int64."""
        if self.kind != KIND_KTO:
            raise DatasetError(f"split {self.split.name!r} holds {self.kind}, which have no labels")
        parts = []
        for sh in self.split.shards:
            if sh.labels is None:
                raise DatasetError(f"{sh.path}: labels.bin is missing; the dataset is incomplete. Re-create it "
                                   f"with `sftdata prepare-pref`")
            parts.append(np.asarray(sh.labels, dtype=np.int64))
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def part(self, row: int, k: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens and mask of part ``k`` (0 = prompt) of row ``row``; views."""
        return self.split.item(int(row) * self.entries + k)

    def sequence(self, row: int, side: int) -> tuple[np.ndarray, np.ndarray]:
        """``prompt + completion side`` (side 0: chosen, 1: rejected; KTO: 0) of ``row``,
        tokens and mask (a prompts row: side 0 is the prompt alone)."""
        p, pm = self.part(row, 0)
        pm = np.zeros(p.shape, np.uint8) if pm is None else pm
        if self.entries == 1:
            return np.asarray(p), np.asarray(pm)
        c, cm = self.part(row, 1 + side)
        cm = np.zeros(c.shape, np.uint8) if cm is None else cm
        return np.concatenate([p, c]), np.concatenate([pm, cm])

    def columns(self, rows) -> list[dict]:
        """RL prompts: each row's other columns, parsed (``columns_text``: as written)."""
        return [orjson.loads(t) for t in self.columns_text(rows)]

    def columns_text(self, rows) -> list[bytes]:
        """RL prompts: each row's ``columns`` object exactly as ``columns.jsonl`` holds it
        (the input's JSON text of every value, byte for byte)."""
        if self.kind != KIND_PROMPTS:
            raise DatasetError(f"split {self.split.name!r} holds {self.kind}, which have no columns")
        table = self._columns
        return [table[int(r)] for r in np.asarray(rows, dtype=np.int64)]

    @cached_property
    def _columns(self) -> list[bytes]:
        out: list[bytes] = []
        for sh in self.split.shards:
            path = sh.path / COLUMNS_FILE
            try:
                lines = path.read_bytes().splitlines()
            except FileNotFoundError:
                raise DatasetError(f"{path} is missing; the dataset is incomplete. Re-create it with "
                                   f"`sftdata prepare-rl`") from None
            first = int(sh.first_gid)
            for n, line in enumerate(lines, 1):
                out.append(_columns_of(line, first + n - 1, path, n))
            if len(lines) != sh.num_items:
                raise DatasetError(f"{path} holds {len(lines):,} rows, its shard {sh.num_items:,}; the file is "
                                   f"damaged. Re-create the dataset with `sftdata prepare-rl`")
        return out


def _columns_of(line: bytes, row: int, path, n: int) -> bytes:
    """The bytes of the ``columns`` object of one ``columns.jsonl`` line, checked: the line
    is ``{"row": row, "record": ..., "columns": {...}}`` (``columns`` last)."""
    try:
        obj = orjson.loads(line)
        ok = obj["row"] == row and isinstance(obj["columns"], dict)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        ok = False
    key = b'"columns":'
    at = line.find(key)
    text = line[at + len(key):].strip()[:-1].strip() if ok and at >= 0 else b""
    if not text.startswith(b"{") or not text.endswith(b"}"):
        raise DatasetError(f"{path}, line {n}: expected {{\"row\": {row}, \"record\": ..., \"columns\": {{...}}}}; "
                           f"the file is damaged. Re-create the dataset with `sftdata prepare-rl`")
    return text


def row_split(ds: Dataset, split: str) -> RowSplit:
    """The rows of ``split`` of a pairs, KTO or prompts dataset."""
    require_row_kind(ds, "this reader")
    return RowSplit(ds.kind, ds.split(split))


@contextmanager
def shard_columns(shard: Path) -> Iterator[Iterator[bytes]]:
    """The ``columns`` object of each row of the shard folder ``shard`` (RL prompts, as its
    ``columns.jsonl`` holds it, byte for byte), read a line at a time."""
    key = b'"columns": '
    with open(Path(shard) / COLUMNS_FILE, "rb") as f:
        yield (line[line.index(key) + len(key):line.rindex(b"}")] for line in f)


def shard_media(shard: Path, first: int, stop: int) -> list[tuple[MediaSpan, ...]] | None:
    """The media spans of episodes ``[first, stop)`` of the shard folder ``shard`` (one
    tuple each, from its ``media.jsonl``, episode numbers shard-local), or None when the
    shard has no media table."""
    try:
        lines = (Path(shard) / MEDIA_FILE).read_bytes().splitlines()
    except FileNotFoundError:
        return None
    out: list[list[MediaSpan]] = [[] for _ in range(stop - first)]
    for line in lines:
        episode, span = span_from_row(orjson.loads(line))
        if first <= episode < stop:
            out[episode - first].append(span)
    return [tuple(m) for m in out]
