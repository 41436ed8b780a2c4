"""The driver's duplicate decision: one index over the whole run, fed in input order.

``Deduplicator.decide(keys)`` takes the records a chunk accepted (``chunk.RecordKeys``,
chunks in input order) and returns those to drop, each naming the record it repeats.
The first occurrence in input order is kept: a record is compared only with records
kept before it, so the decision is the same whatever the number of workers.

- ``exact``: equal canonical texts (``canonical.exact_key``);
- ``near``: exact first, then MinHash similarity: a record is dropped when a record kept
  before it shares an LSH band with it and their signatures agree on at least
  ``threshold`` of their values (the estimated Jaccard similarity of their token
  shingles); it names the first such record;
- ``off``: nothing is dropped, but exact duplicates are still counted (the summary says
  how many ``--dedup exact`` would drop).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .chunk import RecordKeys
from .minhash import NUM_PERM, band_keys, lsh_params

DEDUP_MODES = ("off", "exact", "near")
DEFAULT_THRESHOLD = 0.85


@dataclass(frozen=True)
class Drop:
    """A record dropped as a duplicate of an earlier kept record."""

    record: int
    where: str
    kind: str  # "exact" | "near"
    kept_record: int
    kept_where: str
    similarity: float  # 1.0 for exact

    def message(self) -> str:
        what = "the same conversation as" if self.kind == "exact" else \
            f"a near duplicate (estimated Jaccard similarity {self.similarity:.2f} of its token shingles) of"
        return f"{what} record {self.kept_record} ({self.kept_where}), which is kept (the first occurrence)"


class Deduplicator:
    """State of one run's duplicate decision (module docstring)."""

    def __init__(self, mode: str = "off", threshold: float = DEFAULT_THRESHOLD, num_perm: int = NUM_PERM):
        if mode not in DEDUP_MODES:
            raise UsageError(f"--dedup must be one of {', '.join(DEDUP_MODES)}, got {mode!r}")
        if not 0.0 < threshold <= 1.0:
            raise UsageError(f"--dedup-threshold must be in (0, 1], got {threshold}")
        self.mode, self.threshold, self.num_perm = mode, float(threshold), num_perm
        self.exact: dict[bytes, int] = {}  # key -> index into the kept records
        self.kept_records: list[int] = []
        self.kept_wheres: list[str] = []
        self.exact_duplicates = 0  # counted in every mode
        self.near_duplicates = 0
        if mode == "near":
            self.bands, self.rows = lsh_params(self.threshold, num_perm)
            self.need = int(np.ceil(self.threshold * num_perm - 1e-9))  # equal values to reach the threshold
            self.table: dict[int, int | list[int]] = {}  # band key -> kept index (or indices)
            self.sigs = np.empty((1024, num_perm), dtype=np.uint32)

    def _keep(self, record: int, where: str, key: bytes) -> int:
        k = len(self.kept_records)
        self.kept_records.append(record)
        self.kept_wheres.append(where)
        self.exact.setdefault(key, k)
        return k

    def decide(self, keys: RecordKeys) -> list[Drop]:
        """The records of ``keys`` to drop (all ``exact``/``near`` duplicates of earlier
        kept records); the others are kept and indexed."""
        if len(keys.records) == 0:  # a partitioned run's results carry none: decided over its staged keys
            return []
        if self.mode == "off":  # only counted: a set of the keys seen, no record kept by name
            seen = self.exact
            before = len(seen)
            seen.update(dict.fromkeys(keys.exact, 0))
            self.exact_duplicates += len(keys.exact) - (len(seen) - before)
            return []
        drops: list[Drop] = []
        bands = band_keys(keys.signatures, self.bands, self.rows) if self.mode == "near" else None
        for i, (record, where, key) in enumerate(zip(keys.records.tolist(), keys.wheres, keys.exact)):
            first = self.exact.get(key)
            if first is not None:
                self.exact_duplicates += 1
                if self.mode != "off":
                    drops.append(Drop(record, where, "exact", self.kept_records[first], self.kept_wheres[first], 1.0))
                    continue
            if self.mode == "near":
                hit = self._near(keys.signatures[i], bands[i])
                if hit is not None:
                    k, sim = hit
                    self.near_duplicates += 1
                    drops.append(Drop(record, where, "near", self.kept_records[k], self.kept_wheres[k], sim))
                    continue
                k = self._keep(record, where, key)
                self._index(k, keys.signatures[i], bands[i])
            elif first is None:
                self._keep(record, where, key)
        return drops

    def _near(self, sig: np.ndarray, bands: np.ndarray) -> tuple[int, float] | None:
        """The first kept record sharing a band with ``sig`` and at least ``threshold``
        equal signature values, with its similarity."""
        cands: set[int] = set()
        for b in bands.tolist():
            v = self.table.get(b)
            if v is not None:
                cands.update(v) if isinstance(v, list) else cands.add(v)
        if not cands:
            return None
        c = np.array(sorted(cands), dtype=np.int64)
        equal = np.count_nonzero(self.sigs[c] == sig, axis=1)
        ok = np.flatnonzero(equal >= self.need)
        return (int(c[ok[0]]), float(equal[ok[0]]) / self.num_perm) if ok.size else None

    def _index(self, k: int, sig: np.ndarray, bands: np.ndarray) -> None:
        if k >= self.sigs.shape[0]:
            self.sigs = np.concatenate([self.sigs, np.empty_like(self.sigs)])
        self.sigs[k] = sig
        for b in bands.tolist():
            v = self.table.get(b)
            if v is None:
                self.table[b] = k
            elif isinstance(v, list):
                v.append(k)
            else:
                self.table[b] = [v, k]

    def counts(self) -> dict:
        """What the summary and the metadata record."""
        out = {"mode": self.mode, "exact_duplicates": self.exact_duplicates}
        if self.mode == "near":
            out.update(near_duplicates=self.near_duplicates, threshold=self.threshold, num_perm=self.num_perm,
                       bands=self.bands, rows=self.rows)
        return out
