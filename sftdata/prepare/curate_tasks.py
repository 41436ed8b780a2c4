"""The duplicate decision of a partitioned run, across tasks (``curate.groups`` has the
method): each partition task stages its records' keys beside its episodes, sorted and cut
into buckets of the key space; one group task per bucket reads that bucket of every
partition and finds the groups of equal keys; the coordinator gets the duplicates'
count (``off``), the repeats (``exact``) or the candidates (``near``), whose keys and
signatures a task per partition fetches for the one decision in input order.

Staged per partition, in ``part_N/keys/`` (the record numbers count from the start of
the input, as the episodes' do)::

    exact.npy  (n, 2) uint64   each record's exact key, in input order   (with records.npy)
    ek.npy er.npy eo.npy       the exact keys sorted, their records, the bucket offsets
    sigs.npy   (n, P) uint32   near: the MinHash signatures, in input order
    bk.npy br.npy bo.npy       near: each band's keys sorted (bands, n), records, offsets

What a coordinator receives grows with the duplicates, never with the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..curate import RecordKeys
from ..curate.groups import exact_repeats, grouped_records, sorted_keys
from ..curate.minhash import band_keys, lsh_params

KEYS_DIR = "keys"


def exact_array(exact: list[bytes]) -> np.ndarray:
    """16-byte keys as an (n, 2) uint64 array (and back: ``row.tobytes()``)."""
    return np.frombuffer(b"".join(exact), dtype="<u8").reshape(-1, 2) if exact else np.empty((0, 2), "<u8")


def stage_keys(folder: Path, keys: RecordKeys | None, buckets: int, mode: str, threshold: float) -> None:
    """Write ``keys`` (the partition's records that curating decides on: the contaminated
    ones left out) into ``folder``."""
    folder.mkdir()
    records = np.empty(0, np.int64) if keys is None else np.asarray(keys.records, dtype=np.int64)
    exact = exact_array([] if keys is None else keys.exact)
    np.save(folder / "records.npy", records)
    np.save(folder / "exact.npy", exact)
    for name, arr in zip(("ek", "er", "eo"), sorted_keys(exact, records, buckets)):
        np.save(folder / f"{name}.npy", arr)
    if mode != "near":
        return
    sigs = keys.signatures if keys is not None and keys.signatures is not None else np.empty((0, 0), np.uint32)
    np.save(folder / "sigs.npy", np.asarray(sigs, dtype=np.uint32))
    bands, rows = lsh_params(threshold)
    bk = band_keys(sigs, bands, rows) if sigs.shape[0] else np.empty((0, bands), np.uint64)
    out = [sorted_keys(bk[:, b], records, buckets) for b in range(bands)]
    for name, k in zip(("bk", "br", "bo"), range(3)):
        np.save(folder / f"{name}.npy", np.stack([o[k] for o in out]))


@dataclass
class BucketGroups:
    """What one group task found in its bucket (global record numbers)."""

    duplicates: int  # records whose exact key an earlier record has
    repeats: np.ndarray  # exact: those records ...
    firsts: np.ndarray  # ... and the first record of their key
    candidates: np.ndarray  # near: the records that share an exact key or a band key with another


def _slice(folder: Path, name: str, a: int, b: int, row: int | None = None) -> np.ndarray:
    arr = np.load(folder / f"{name}.npy", mmap_mode="r")
    return np.array(arr[a:b] if row is None else arr[row, a:b])


def group_bucket(parts: list[tuple[str, int]], bucket: int, mode: str) -> BucketGroups:
    """One group task: bucket ``bucket`` of every partition's staged keys (``parts``: its
    keys folder and the record number its input starts at)."""
    keys, records = [], []
    for path, offset in parts:
        folder = Path(path)
        eo = np.load(folder / "eo.npy")
        a, b = int(eo[bucket]), int(eo[bucket + 1])
        keys.append(_slice(folder, "ek", a, b))
        records.append(_slice(folder, "er", a, b) + offset)
    keys_all = np.concatenate(keys) if keys else np.empty((0, 2), np.uint64)
    recs = np.concatenate(records) if records else np.empty(0, np.int64)
    repeats, firsts = exact_repeats(keys_all, recs)
    empty = np.empty(0, np.int64)
    if mode != "near":
        return BucketGroups(int(repeats.shape[0]), repeats if mode == "exact" else empty,
                            firsts if mode == "exact" else empty, empty)
    found = [grouped_records(keys_all, recs)]
    offsets = [np.load(Path(path) / "bo.npy") for path, _ in parts]  # (bands, buckets + 1) each
    for band in range(offsets[0].shape[0] if offsets else 0):
        bkeys, brecs = [], []
        for (path, offset), bo in zip(parts, offsets):
            a, b = int(bo[band, bucket]), int(bo[band, bucket + 1])
            bkeys.append(_slice(Path(path), "bk", a, b, band))
            brecs.append(_slice(Path(path), "br", a, b, band) + offset)
        found.append(grouped_records(np.concatenate(bkeys), np.concatenate(brecs)))
    return BucketGroups(int(repeats.shape[0]), empty, empty, np.unique(np.concatenate(found)))


def fetch_keys(path: str, offset: int, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One task: the exact keys and signatures of ``records`` (global numbers, all staged
    in the keys folder at ``path``, whose input starts at record ``offset``)."""
    folder = Path(path)
    own = np.load(folder / "records.npy", mmap_mode="r")
    rows = np.searchsorted(own, np.asarray(records, dtype=np.int64) - offset)
    exact = np.load(folder / "exact.npy", mmap_mode="r")
    sigs = np.load(folder / "sigs.npy", mmap_mode="r")
    return np.array(exact[rows]), np.array(sigs[rows])
