"""Near-duplicate signatures: token shingles, MinHash (``rensa``), and LSH bands.

A record's shingles are the hashes of every run of ``SHINGLE`` consecutive token ids of
what it rendered (a shorter record is one shingle); its signature is the MinHash of
that set, ``NUM_PERM`` 32-bit values computed by ``rensa`` (a Rust MinHash library) for
a whole chunk at once. The share of equal values of two signatures estimates the
Jaccard similarity of their shingle sets. LSH cuts a signature into ``bands`` of
``rows`` values; two records become candidates when a band is equal, and ``lsh_params``
chooses the cut, favouring recall (a candidate is checked on its signature anyway).
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import UsageError

# NumPy 2 renamed trapz (NumPy 1.x, a floor this package declares and CI tests) to trapezoid
_trapezoid = getattr(np, "trapezoid", None) or np.trapz

SHINGLE = 5  # tokens per shingle
NUM_PERM = 128
MINHASH_SEED = 1
_M1, _M2, _P = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x100000001B3)


def mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every output bit depends on every input bit."""
    h = np.asarray(h, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = (h ^ (h >> np.uint64(30))) * _M1
        h = (h ^ (h >> np.uint64(27))) * _M2
    return h ^ (h >> np.uint64(31))


def shingle_hashes(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, k: int = SHINGLE
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes of the token ranges ``[starts[i], ends[i])`` of ``ids``, flat, and
    the row offsets (``len(starts) + 1`` of them) that cut them per range."""
    ids = np.asarray(ids, dtype=np.uint64)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    n = ids.shape[0]
    h = np.zeros(max(n - k + 1, 0), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):  # polynomial hash of ids[p : p + k], for every start p
            h = h * _P + ids[j:j + h.shape[0]]
    h = mix64(h)
    count = np.maximum(ends - starts - k + 1, 0)
    short = count == 0  # fewer than k tokens: the whole range is one shingle
    offsets = np.concatenate([[0], np.cumsum(np.where(short, 1, count))]).astype(np.uint64)
    out = np.empty(int(offsets[-1]), dtype=np.uint64)
    for i in np.flatnonzero(~short).tolist():  # one slice per record, not per token
        out[offsets[i]:offsets[i + 1]] = h[starts[i]:starts[i] + count[i]]
    for i in np.flatnonzero(short).tolist():
        v = np.uint64(0)
        with np.errstate(over="ignore"):
            for t in ids[starts[i]:ends[i]]:
                v = v * _P + t
        out[offsets[i]] = mix64(np.array([v + np.uint64(ends[i] - starts[i])]))[0]
    return out, offsets


def signatures(flat: np.ndarray, offsets: np.ndarray, num_perm: int = NUM_PERM, seed: int = MINHASH_SEED
               ) -> np.ndarray:
    """``(rows, num_perm)`` uint32 MinHash signatures of the shingle sets cut by ``offsets``."""
    try:
        import rensa  # optional dependency: the dedup extra
    except ImportError:
        raise UsageError("--dedup near needs the rensa package (MinHash in Rust): pip install 'sftdata[dedup]'") \
            from None
    rows = offsets.shape[0] - 1
    if rows == 0:
        return np.empty((0, num_perm), dtype=np.uint32)
    m = rensa.RMinHash.digest_matrix_from_flat_token_hashes(np.ascontiguousarray(flat, dtype=np.uint64),
                                                            np.ascontiguousarray(offsets, dtype=np.uint64),
                                                            num_perm, seed)
    return np.asarray(m.to_rows(), dtype=np.uint32).reshape(rows, num_perm)


FN_WEIGHT = 0.9  # a missed duplicate stays in the data; a false candidate only costs one signature comparison


@functools.cache
def lsh_params(threshold: float, num_perm: int = NUM_PERM) -> tuple[int, int]:
    """``(bands, rows)`` with ``bands * rows <= num_perm`` minimising ``FN_WEIGHT`` x the
    chance of missing a pair above ``threshold`` plus the rest x the chance of a candidate
    pair below it. Candidates are checked against the threshold on their signatures, so
    recall is what counts: at 0.85, 11 bands of 11 rows find 98% of the pairs at 0.9."""
    best, arg = None, (1, num_perm)
    x = np.linspace(0.0, 1.0, 1001)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            p = 1 - (1 - x ** r) ** b  # the chance that a pair of similarity x is a candidate
            fp = _trapezoid(np.where(x < threshold, p, 0), x)
            fn = _trapezoid(np.where(x >= threshold, 1 - p, 0), x)
            cost = (1 - FN_WEIGHT) * fp + FN_WEIGHT * fn
            if best is None or cost < best:
                best, arg = cost, (b, r)
    return arg


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``(n, bands)`` uint64: each band's values hashed, salted by the band number."""
    sig = np.asarray(sig, dtype=np.uint64)
    n = sig.shape[0]
    out = np.zeros((n, bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(rows):
            out = out * _P + sig[:, j:bands * rows:rows][:, :bands]
    return mix64(out + np.arange(bands, dtype=np.uint64) * _M2)
