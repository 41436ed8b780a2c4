"""Benchmark: near-duplicate detection for prepare --dedup near, at scale: MinHash
signatures of token shingles (what each worker computes per chunk) and the driver's one
LSH decision in input order, on synthetic conversations with planted duplicates.

    python benchmarks/bench_dedup.py [--n 100000] [--workers 2] [--tokens 300]

Conversations are random token sequences (lengths uniform in [tokens/2, 3*tokens/2]);
5% are planted near copies of an earlier conversation (a few tokens changed, Jaccard of
their 5-gram sets about 0.9) and 2% exact copies. Printed: seconds and records/s of the
signatures (one process, and ``--workers`` processes over the same chunks), of the LSH
decision, the peak memory of the driver's index, and how many planted copies were found.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sftdata.curate import Deduplicator, RecordKeys  # noqa: E402
from sftdata.curate.minhash import shingle_hashes, signatures  # noqa: E402

CHUNK = 512  # records per chunk, as prepare's CHUNK_RECORDS


def corpus(n: int, tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict]:
    """Token ids (flat) and lengths of ``n`` conversations, and the planted copies:
    {copy: (original, "near" | "exact")}; a copy has its original's length."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(tokens // 2, 3 * tokens // 2 + 1, n)
    kind = rng.random(n)
    kind[0] = 1.0
    source = np.array([int(rng.integers(0, i)) if kind[i] < 0.07 else -1 for i in range(n)])
    copy = source >= 0
    for i in np.flatnonzero(copy).tolist():  # in order: a copy of a copy gets the final length
        lengths[i] = lengths[source[i]]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    ids = rng.integers(0, 100_000, int(ends[-1]), dtype=np.uint32)
    planted = {}
    for i in np.flatnonzero(copy).tolist():
        j = int(source[i])
        ids[starts[i]:ends[i]] = ids[starts[j]:ends[j]]
        if kind[i] < 0.05:  # near: 3 tokens changed, spread over the copy
            ids[starts[i] + rng.integers(0, lengths[i], 3)] = rng.integers(0, 100_000, 3, dtype=np.uint32)
        planted[i] = (j, "near" if kind[i] < 0.05 else "exact")
    return ids, lengths, planted


def chunk_signatures(args):
    ids, lengths = args
    ends = np.cumsum(lengths)
    flat, offsets = shingle_hashes(ids, ends - lengths, ends)
    return signatures(flat, offsets)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    ids, lengths, planted = corpus(a.n, a.tokens)
    ends = np.cumsum(lengths)
    bounds = list(range(0, a.n, CHUNK)) + [a.n]
    chunks = [(ids[(ends[lo - 1] if lo else 0):ends[hi - 1]], lengths[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
    print(f"{a.n:,} conversations, {int(lengths.sum()):,} tokens (mean {lengths.mean():.0f}), {len(chunks):,} chunks "
          f"of {CHUNK}; planted: {sum(v[1] == 'near' for v in planted.values()):,} near, "
          f"{sum(v[1] == 'exact' for v in planted.values()):,} exact copies")
    t = time.perf_counter()
    sigs = [chunk_signatures(c) for c in chunks[:max(1, len(chunks) // 10)]]
    one = (time.perf_counter() - t) / sum(s.shape[0] for s in sigs)
    print(f"signatures, 1 process:      {one * 1e6:7.1f} us/record ({1 / one:,.0f} records/s; on a tenth)")
    t = time.perf_counter()
    with ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn")) as pool:  # rensa's threads: no fork
        sigs = list(pool.map(chunk_signatures, chunks, chunksize=4))
    sig_s = time.perf_counter() - t
    print(f"signatures, {a.workers} processes:    {sig_s:7.1f} s ({a.n / sig_s:,.0f} records/s)")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    d = Deduplicator("near", 0.85)
    t = time.perf_counter()
    found = {}
    rec = 0
    for s in sigs:
        k = s.shape[0]
        keys = RecordKeys(np.arange(rec, rec + k), [""] * k, [i.to_bytes(16, "little") for i in range(rec, rec + k)], s,
                          [])
        for drop in d.decide(keys):
            found[drop.record] = drop.kept_record
        rec += k
    lsh_s = time.perf_counter() - t
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"LSH decision (driver):      {lsh_s:7.1f} s ({a.n / lsh_s:,.0f} records/s), index +{rss:,.0f} MB peak RSS, "
          f"{d.bands} bands x {d.rows} rows")
    starts = ends - lengths
    above = below = hit_above = hit_below = 0
    for i, (j, _) in planted.items():  # the true Jaccard of each planted pair's 5-gram sets
        x = set(shingle_hashes(ids[starts[i]:ends[i]], [0], [lengths[i]])[0].tolist())
        y = set(shingle_hashes(ids[starts[j]:ends[j]], [0], [lengths[j]])[0].tolist())
        if len(x & y) / len(x | y) >= 0.85:
            above, hit_above = above + 1, hit_above + (i in found)
        else:
            below, hit_below = below + 1, hit_below + (i in found)
    false = sum(1 for i in found if i not in planted)
    print(f"planted copies with Jaccard >= 0.85 dropped: {hit_above:,} of {above:,}; below 0.85 (short conversations, "
          f"3 tokens changed) dropped: {hit_below:,} of {below:,}; records dropped that are no copy: {false:,}")
    print(f"total (signatures on {a.workers} processes + decision): {sig_s + lsh_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
