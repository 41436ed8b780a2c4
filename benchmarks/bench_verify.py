"""Benchmark: `verify` (with checksums, and --quick) and the `inspect` overview on a
synthetic dataset of about 1 GB, against plain sha256 of the same bytes in the same run.

    python benchmarks/bench_verify.py [--gb 1.0] [--keep DIR]

The dataset is generated quickly (vectorised episodes of 1-4 user/assistant pairs, the
mask from ``masking.loss_mask``) with ``store.DatasetWriter`` in a temporary folder that
is deleted at the end. Figures are for a warm page cache (the files were just written).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sftdata.masking import loss_mask  # noqa: E402
from sftdata.store import DatasetWriter, iter_files, sha256_file, token_dtype_for  # noqa: E402
from sftdata.tokenizer import load_tokenizer  # noqa: E402


def episodes_block(rng: np.random.Generator, n_ep: int, m) -> tuple[np.ndarray, np.ndarray]:
    """``n_ep`` rendered-like episodes: ids (uint32) and their lengths."""
    k = rng.integers(1, 5, n_ep)
    u = rng.integers(5, 120, int(k.sum()))
    a = rng.integers(10, 400, int(k.sum()))
    first_pair = np.concatenate([[0], np.cumsum(k)[:-1]])
    is_last = np.zeros(u.size, bool)
    is_last[np.cumsum(k) - 1] = True
    pair_len = u + a + 4
    piece = pair_len + is_last
    start = np.concatenate([[0], np.cumsum(piece)[:-1]])
    ids = rng.integers(0, 100_000, int(piece.sum()), dtype=np.uint32)
    ids[start] = m.user
    ids[start + u + 1] = m.end
    ids[start + u + 2] = m.assistant
    ids[start + u + 3 + a] = m.end
    ids[(start + pair_len)[is_last]] = m.eos
    return ids, np.add.reduceat(piece, first_pair)


def generate(target: Path, gb: float) -> float:
    tok = load_tokenizer()
    dtype = token_dtype_for(tok.vocab_size)
    rng = np.random.default_rng(0)
    blocks = [episodes_block(rng, 8_000, tok.ids) for _ in range(4)]
    blocks = [(ids, loss_mask(ids, tok.ids), lens) for ids, lens in blocks]
    goal = int(gb * 1e9) // (dtype.itemsize + 1)
    t0 = time.perf_counter()
    with DatasetWriter(target, overwrite=True) as w:
        sw = w.split("train", dtype)
        done = rec = i = 0
        while done < goal:
            ids, mask, lens = blocks[i % len(blocks)]
            sw.add_many(ids, mask, lens, np.arange(rec, rec + lens.size))
            done += ids.size
            rec += lens.size
            i += 1
        split = sw.close()
        w.write_json("tokenizer_state.json", tok.state())
        w.commit({"kind": "episodes", "token_dtype": dtype.name, "tokenizer": tok.summary(),
                  "splits": {"train": split}, "sources": [], "options": {},
                  "counts": {"records_read": rec, "episodes": split["episodes"], "rejected": {}}})
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--keep", type=Path, default=None, help="write the dataset here and keep it")
    args = ap.parse_args()
    tmp = None
    if args.keep:
        root = args.keep
    else:
        tmp = Path(tempfile.mkdtemp(prefix="sftdata-bench-"))
        root = tmp / "ds"
    try:
        gen = generate(root, args.gb)
        files = [p for p in iter_files(root)]
        size = sum(p.stat().st_size for p in files)
        mb = size / 1e6
        print(f"dataset: {mb:,.0f} MB in {len(files)} files, generated in {gen:.1f} s")

        t0 = time.perf_counter()
        for p in files:
            sha256_file(p)
        t_sha = time.perf_counter() - t0
        print(f"reference  sha256 of every file        {t_sha:6.2f} s  {mb / t_sha:8,.0f} MB/s")

        from sftdata.verify import verify

        t0 = time.perf_counter()
        rep = verify(root)
        t_full = time.perf_counter() - t0
        assert rep.ok, [str(p) for p in rep.problems]
        print(f"verify     (all checks, checksums)     {t_full:6.2f} s  {mb / t_full:8,.0f} MB/s  "
              f"= {t_sha / t_full:.2f}x sha256 alone")
        t0 = time.perf_counter()
        rep = verify(root, quick=True)
        t_quick = time.perf_counter() - t0
        assert rep.ok
        print(f"verify --quick (no checksums)          {t_quick:6.2f} s  {mb / t_quick:8,.0f} MB/s  "
              f"= {t_sha / t_quick:.2f}x sha256 alone")
        try:
            from sftdata.inspect import overview
        except ImportError:
            overview = None
        if overview is not None:
            t0 = time.perf_counter()
            ov = overview(root, block_size=1024)
            t_ov = time.perf_counter() - t0
            print(f"inspect overview (--block-size 1024)   {t_ov:6.2f} s  "
                  f"({ov.splits[0].episodes:,} episodes, {ov.splits[0].tokens:,} tokens)")
        print(f"verify target >= 200 MB/s: {'met' if mb / t_full >= 200 else 'NOT met'}"
              + ("" if overview is None else f"; inspect target < 3 s: {'met' if t_ov < 3 else 'NOT met'}"))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
