"""get_batch cost for batch 64 x block 2048 from a memory-mapped multi-shard dataset,
against a plain numpy copy of the same number of bytes, and against the pipeline Hugging
Face users run (a ``datasets`` dataset + ``DataCollatorForSeq2Seq``), in the same run.

    python benchmarks/bench_loader.py [--episodes 8000] [--batch 64] [--block 2048] [--iters 200] [--no-peer]

The peer: the same episodes (a synthetic chat dataset, ``bench_pack.synthetic_dataset``)
exported by ``sftdata export`` to Parquet, cut to ``--block`` tokens, opened with
``datasets.load_dataset("parquet")`` (memory-mapped Arrow, as ours is memory-mapped), and
batched in-process: ``collator([ds[i] for i in batch])`` padding to the longest row with
-100 labels, torch tensors out; ours: ``get_batch`` of the same episodes (torch backend).
Both in one thread, no DataLoader workers (bench_interop.py measures those).

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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sftdata.loader import LoaderConfig, make_loader  # noqa: E402
from sftdata.store import TOKENIZER_FILE  # noqa: E402
from sftdata.store.writer import DatasetWriter  # noqa: E402


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


def copy_reference(nbytes: int, iters: int, pool: int = 512 << 20) -> float:
    """Median seconds of a numpy copy of ``nbytes`` into a new array, each time from
    another place of a ``pool``-byte buffer larger than the CPU caches (as a batch's
    tokens come from another place of the dataset each step)."""
    src = np.full(pool, 7, dtype=np.uint8)
    places = iter(range(10**9))

    def copy() -> np.ndarray:
        at = next(places) * nbytes % (pool - nbytes)
        return src[at:at + nbytes].copy()

    return median_time(copy, iters)


def compare_with_datasets(episodes: int = 8000, batch: int = 64, block: int = 2048, iters: int = 50) -> dict | None:
    """Seconds per batch of ``batch`` x ``block``: sftdata's ``get_batch`` (torch backend),
    the ``datasets`` + ``DataCollatorForSeq2Seq`` peer on the same episodes, and a numpy
    copy of the bytes of our batch. None when datasets, transformers or torch is missing."""
    try:
        import datasets
        import torch  # noqa: F401
        import transformers
    except ImportError:
        return None
    from bench_interop import _cut_parquet, hf_tokenizer
    from bench_pack import synthetic_dataset

    from sftdata.interop.export import export
    from sftdata.torch import SFTDataset

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        synthetic_dataset(tmp / "episodes", episodes)
        export(tmp / "episodes", tmp / "export")
        _cut_parquet(tmp / "export" / "train.parquet", tmp / "cut.parquet", block)
        cfg = LoaderConfig(batch_size=batch, block_size=block, use_loss_mask=True, epoch_drop_last=False)
        loader = make_loader(cfg, tmp / "episodes", backend="torch")
        for _ in range(-(-episodes // batch)):  # warm: one pass, page cache and the loader's state
            loader.get_batch("train")
        ours = median_time(lambda: loader.get_batch("train"), iters)
        x, y, m = loader.get_batch("train")
        nbytes = x.numel() * x.element_size() + y.numel() * y.element_size() + m.numel() * m.element_size()
        hf = datasets.load_dataset("parquet", data_files={"train": str(tmp / "cut.parquet")}, split="train",
                                   cache_dir=str(tmp / "hf_cache")).select_columns(["input_ids", "labels",
                                                                                    "attention_mask"])
        collator = transformers.DataCollatorForSeq2Seq(hf_tokenizer(SFTDataset(tmp / "episodes").pad_id or 0), padding="longest",
                                                       label_pad_token_id=-100, return_tensors="pt")
        order = np.random.default_rng(0).permutation(len(hf))
        step = iter(range(10**9))

        def peer_batch():
            k = next(step) % (len(hf) // batch)
            return collator([hf[int(i)] for i in order[k * batch:(k + 1) * batch]])

        for _ in range(len(hf) // batch):  # warm the same way
            peer_batch()
        peer = median_time(peer_batch, iters)
        shape = tuple(peer_batch()["input_ids"].shape)
    return {"batch": batch, "block": block, "ours_s": ours, "peer_s": peer,
            "copy_s": copy_reference(nbytes, iters, 64 << 20 if episodes < 1000 else 512 << 20),
            "batch_mb": nbytes / 1e6, "peer_shape": list(shape)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--shard-tokens", type=int, default=4_000_000)
    ap.add_argument("--no-peer", action="store_true", help="skip the datasets + collator peer")
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
    if not args.no_peer:
        r = compare_with_datasets(args.episodes, args.batch, args.block, min(args.iters, 50))
        if r is None:
            print("peer: skipped (datasets, transformers or torch is not installed)")
        else:
            print(f"peer: datasets + DataCollatorForSeq2Seq {r['peer_s'] * 1e3:.2f} ms per batch {r['peer_shape']}, "
                  f"sftdata get_batch (torch) {r['ours_s'] * 1e3:.2f} ms -> {r['peer_s'] / r['ours_s']:.1f}x faster")


if __name__ == "__main__":
    main()
