"""Evaluation contamination: training records that share a long word n-gram with an
evaluation item (the overlap measure of GPT-3's contamination study: 13-grams).

Text is cut into words (runs of letters, digits and underscores, lowercased, so case,
punctuation and spacing do not hide an overlap); an n-gram is ``n`` consecutive words.
An evaluation item's text is every string in it (a prompt, with or without its answer;
a chat record's messages); an item shorter than ``n`` words has no n-gram and is
counted as too short (a smaller ``n`` reaches it). A training record's text is its
canonical text, all turns. The index is a sorted array of the n-grams' 64-bit hashes,
so a record is checked with one ``searchsorted`` over its n-grams.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import RecordError, UsageError
from ..records.conversation import decode_json
from ..sources import expand_inputs, inspect_source, iter_all
from .minhash import _P, mix64

DEFAULT_NGRAM = 13
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngram_hashes(ws: list[str], n: int) -> np.ndarray:
    """uint64 hash of every run of ``n`` consecutive words (none when fewer)."""
    if len(ws) < n:
        return np.empty(0, dtype=np.uint64)
    w = np.fromiter((zlib.crc32(x.encode()) for x in ws), dtype=np.uint64, count=len(ws))
    m = len(ws) - n + 1
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _P + w[j:j + m]
    return mix64(h)


def item_text(obj) -> str:
    """Every string in an evaluation item, in order, one per line."""
    out: list[str] = []

    def walk(v) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(obj)
    return "\n".join(out)


@dataclass
class EvalIndex:
    """The n-grams of every evaluation item: ``hashes`` sorted, ``owner[i]`` the item of
    ``hashes[i]`` (the first item holding it); ``items[k]`` = (file index, item number,
    where)."""

    n: int
    files: list[str]
    hashes: np.ndarray
    owner: np.ndarray
    items: list[tuple[int, int, str]]
    items_per_file: list[int] = field(default_factory=list)
    too_short_per_file: list[int] = field(default_factory=list)

    def first_hit(self, text: str) -> tuple[int, str] | None:
        """(item index, the shared words) of the first n-gram of ``text`` that an item holds."""
        ws = words(text)
        h = ngram_hashes(ws, self.n)
        if h.size == 0 or self.hashes.size == 0:
            return None
        pos = np.searchsorted(self.hashes, h)
        pos = np.minimum(pos, self.hashes.size - 1)
        hit = np.flatnonzero(self.hashes[pos] == h)
        if hit.size == 0:
            return None
        p = int(hit[0])
        return int(self.owner[pos[p]]), " ".join(ws[p:p + self.n])

    def describe(self) -> list[dict]:
        return [{"path": f, "items": self.items_per_file[i], "too_short": self.too_short_per_file[i]}
                for i, f in enumerate(self.files)]


def build_eval_index(files: list[tuple[str, list[tuple[int, str, str]]]], n: int = DEFAULT_NGRAM) -> EvalIndex:
    """The index of ``files``: (path, [(item number, where, text), ...]) each."""
    if n < 1:
        raise UsageError(f"--decontaminate-ngram must be >= 1, got {n}")
    hashes, owner, items, per_file, short = [], [], [], [], []
    for fi, (_, entries) in enumerate(files):
        too_short = 0
        for number, where, text in entries:
            h = ngram_hashes(words(text), n)
            if h.size == 0:
                too_short += 1
                continue
            hashes.append(h)
            owner.append(np.full(h.size, len(items), dtype=np.int64))
            items.append((fi, number, where))
        per_file.append(len(entries))
        short.append(too_short)
    h = np.concatenate(hashes) if hashes else np.empty(0, dtype=np.uint64)
    o = np.concatenate(owner) if owner else np.empty(0, dtype=np.int64)
    order = np.lexsort((o, h))  # by hash, then the first item
    h, o = h[order], o[order]
    first = np.concatenate([[True], h[1:] != h[:-1]]) if h.size else np.empty(0, dtype=bool)
    return EvalIndex(n, [f for f, _ in files], h[first], o[first], items, per_file, short)


def _magic(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read(4)


def _parquet_items(path: str) -> Iterator[tuple[int, str, str]]:
    """Every row of a Parquet file, whatever its columns (evaluation sets are rarely chats)."""
    try:
        import pyarrow.parquet as pq  # optional dependency: the parquet extra
    except ImportError:
        raise UsageError(f"evaluation file {path} is Parquet, which needs pyarrow: pip install 'sftdata[parquet]'") \
            from None
    k = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield k, f"{path}:row {k}", item_text(row)
            k += 1


def _items(path: str, max_record_bytes: int) -> Iterator[tuple[int, str, str]]:
    p = Path(path)
    if p.is_file() and _magic(p) == b"PAR1":
        yield from _parquet_items(path)
        return
    infos = [inspect_source(src) for src in expand_inputs([path])]
    first = None
    for rec, _ in iter_all(infos, max_record_bytes):
        first = rec.record if first is None else first
        if rec.reject is not None:
            raise UsageError(f"evaluation file {rec.where}: {rec.reject[1]}")
        try:
            obj = decode_json(rec.raw, rec.where)
        except RecordError as e:
            raise UsageError(f"evaluation file {rec.where}: {e.detail}; give JSONL, JSON or Parquet of evaluation "
                             f"items") from None
        yield rec.record - first, rec.where, item_text(obj)


def load_evals(paths: list[str | Path], n: int = DEFAULT_NGRAM, max_record_bytes: int = 64 << 20) -> EvalIndex:
    """Read the evaluation files (JSONL, JSON arrays, Parquet; prompts with or without
    answers) into an ``EvalIndex``."""
    if n < 1:
        raise UsageError(f"--decontaminate-ngram must be >= 1, got {n}")
    files = [(str(p), list(_items(str(p), max_record_bytes))) for p in paths]
    for path, entries in files:
        if not entries:
            raise UsageError(f"evaluation file {path} holds no item; give JSONL, JSON or Parquet of evaluation items")
    return build_eval_index(files, n)
