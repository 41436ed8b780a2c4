"""Duplicate keys grouped across tasks: the same decision as ``dedup.Deduplicator``
without one process seeing every key.

Each partition task sorts its records' keys (the exact key, and with ``near`` each LSH
band's key) and cuts them into ``buckets`` ranges of the key space (``sorted_keys``). A
group task takes one bucket from every partition (``groups``): records that share a key
are in the same bucket, so it finds every group of equal keys::

    partition 0  exact keys  |03 17 .. | 5a 5a 91 .. | c2 f0 ..|     bucket 1 of every
    partition 1  exact keys  |0b .. 3f | 5a 80 ..    | d4 ..   |  ─► partition: 5a x 3 =
                              bucket 0   bucket 1      bucket 2      records 12, 40, 77

- ``off``: the duplicates counted are the records of a group after its first;
- ``exact``: those records are dropped, each naming the group's first record (kept: with
  ``exact``, only an earlier equal key drops a record);
- ``near``: the records of any group (an exact key or a band shared with another record)
  are the *candidates*; the others are kept, and no later record can find them. The
  ``Deduplicator`` then decides the candidates alone, in input order, from their keys and
  signatures: what it decides for them is what it decides over all records.

Pure functions of numpy arrays; the answer does not depend on the number of buckets.
"""

from __future__ import annotations

import numpy as np

U64 = np.uint64


def bucket_offsets(sorted_keys: np.ndarray, buckets: int) -> np.ndarray:
    """``buckets + 1`` offsets cutting ``sorted_keys`` (uint64, ascending) into equal
    ranges of the key space (keys are hashes: uniform)."""
    bounds = [(g << 64) // buckets for g in range(1, buckets)]
    inner = np.searchsorted(sorted_keys, np.array(bounds, dtype=U64), side="left") if bounds else []
    return np.concatenate([[0], inner, [sorted_keys.shape[0]]]).astype(np.int64)


def sorted_keys(keys: np.ndarray, records: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, records, offsets): ``keys`` ((n,) uint64, or (n, 2) for 16-byte keys, the
    first column bucketing) sorted by key then record, and the bucket offsets."""
    keys = np.asarray(keys, dtype=U64)
    records = np.asarray(records, dtype=np.int64)
    cols = (records, keys[:, 1], keys[:, 0]) if keys.ndim == 2 else (records, keys)
    order = np.lexsort(cols)
    keys, records = keys[order], records[order]
    return keys, records, bucket_offsets(keys[:, 0] if keys.ndim == 2 else keys, buckets)


def groups(keys: np.ndarray, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, sizes) of the runs of equal keys among ``keys`` sorted with ``records``
    (several partitions' slices of one bucket: sorted here by key, then record)."""
    keys = np.asarray(keys, dtype=U64)
    records = np.asarray(records, dtype=np.int64)
    n = records.shape[0]
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    new = np.ones(n, dtype=bool)
    if keys.ndim == 2:
        new[1:] = (keys[1:, 0] != keys[:-1, 0]) | (keys[1:, 1] != keys[:-1, 1])
    else:
        new[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(new)
    return starts, np.diff(np.concatenate([starts, [n]]))


def in_key_order(keys: np.ndarray, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``keys`` and ``records`` sorted by key, then record."""
    keys = np.asarray(keys, dtype=U64)
    records = np.asarray(records, dtype=np.int64)
    cols = (records, keys[:, 1], keys[:, 0]) if keys.ndim == 2 else (records, keys)
    order = np.lexsort(cols)
    return keys[order], records[order]


def exact_repeats(keys: np.ndarray, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(records, firsts): every record whose exact key an earlier record has, and that
    earlier record (the first of the key), both sorted by record."""
    keys, records = in_key_order(keys, records)
    starts, sizes = groups(keys, records)
    if not starts.size:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    first = np.repeat(records[starts], sizes)
    later = np.ones(records.shape[0], dtype=bool)
    later[starts] = False
    order = np.argsort(records[later], kind="stable")
    return records[later][order], first[later][order]


def grouped_records(keys: np.ndarray, records: np.ndarray) -> np.ndarray:
    """The records that share their key with another record (sorted, unique)."""
    keys, records = in_key_order(keys, records)
    starts, sizes = groups(keys, records)
    return np.unique(records[np.repeat(sizes > 1, sizes)])
