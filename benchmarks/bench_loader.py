"""get_batch cost for batch 64 x block 2048 from a memory-mapped multi-shard dataset,
against a plain numpy copy of the same number of bytes, measured in the same run.

    python benchmarks/bench_loader.py [--episodes 8000] [--batch 64] [--block 2048] [--iters 200]

The dataset is synthetic (random uint32 tokens, lengths 200..6000, so some rows are
padded and some cut), written with DatasetWriter into a temporary folder. Timings are
the median over ``--iters`` consecutive steps after a warm-up that reads the files once
(page cache warm, as during training after the first pass).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from sftdata.loader import LoaderConfig, make_loader
from sftdata.store import TOKENIZER_FILE, DatasetWriter


def build(path: Path, episodes: int, shard_tokens: int, seed: int = 0) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(200, 6000, episodes)
    with DatasetWriter(path) as w:
        sw = w.split("train", np.dtype("<u4"), shard_tokens)
        for a in range(0, episodes, 1000):  # bounded memory
            lens = lengths[a:a + 1000]
            n = int(lens.sum())
            sw.add_many(rng.integers(0, 100_000, n, dtype=np.uint32), (rng.random(n) < 0.4).astype(np.uint8),
                        lens, np.arange(a, a + len(lens)))
        meta = sw.close()
        w.write_json(TOKENIZER_FILE, {"eos_id": 100257, "vocab_size": 100283})
        w.commit({"kind": "episodes", "token_dtype": "uint32", "splits": {"train": meta}})
    return int(lengths.sum()), len(meta["shards"])


def median_time(fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--shard-tokens", type=int, default=4_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bench_ds"
        t = time.perf_counter()
        tokens, shards = build(root, args.episodes, args.shard_tokens)
        print(f"dataset: {args.episodes:,} episodes, {tokens:,} tokens, {shards} shards "
              f"(built in {time.perf_counter() - t:.1f} s)")
        cfg = LoaderConfig(batch_size=args.batch, block_size=args.block, use_loss_mask=True, epoch_drop_last=False)
        results = {}
        for backend in ("numpy", "torch"):
            try:
                loader = make_loader(cfg, root, backend=backend)
            except Exception as e:  # torch not installed
                print(f"{backend}: skipped ({e})")
                continue
            for _ in range(-(-args.episodes // args.batch)):  # warm-up: one pass over the dataset
                loader.get_batch("train")
            results[backend] = median_time(lambda: loader.get_batch("train"), args.iters)
        x, y, m = make_loader(cfg, root, backend="numpy").get_batch("train")
        nbytes = x.nbytes + y.nbytes + m.nbytes
        src = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        ref_alloc = median_time(lambda: src.copy(), args.iters)
        ref_into = median_time(lambda: np.copyto(dst, src), args.iters)
        print(f"batch {args.batch} x block {args.block}: x, y int64 + mask float32 = {nbytes / 1e6:.2f} MB per batch")
        print(f"reference: numpy copy of {nbytes / 1e6:.2f} MB: {ref_alloc * 1e3:.3f} ms (new array), "
              f"{ref_into * 1e3:.3f} ms (into an existing array)")
        for backend, sec in results.items():
            print(f"get_batch ({backend:5s}): {sec * 1e3:.3f} ms = {sec / ref_alloc:.2f}x the copy into a new array, "
                  f"{sec / ref_into:.2f}x the copy into an existing one "
                  f"({args.batch * args.block / sec / 1e6:.0f}M tokens/s)")


if __name__ == "__main__":
    main()
