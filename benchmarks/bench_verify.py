"""Benchmark: `verify` (with checksums, and --quick) and the `inspect` overview on a
synthetic dataset of about 1 GB, against plain sha256 of the same bytes in the same run.

    python benchmarks/bench_verify.py [--gb 1.0] [--runs 3] [--keep DIR]

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

from sftdata.chat.masking import loss_mask  # noqa: E402
from sftdata.chat.tokenizer import load_tokenizer  # noqa: E402
from sftdata.pack import PackOptions, pack  # noqa: E402
from sftdata.report import overview  # noqa: E402
from sftdata.store.format import iter_files, token_dtype_for  # noqa: E402
from sftdata.store.writer import DatasetWriter  # noqa: E402
from sftdata.util.hashing import sha256_file  # noqa: E402
from sftdata.verify import verify  # noqa: E402


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
    ap.add_argument("--runs", type=int, default=3, help="runs of each measurement (best and median shown)")
    ap.add_argument("--packed", action="store_true", help="also pack the dataset (bfd, block 2048) and verify that")
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

        def timed(fn, runs=args.runs):
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t0)
            return sorted(times), out

        def line(name, times, ref=None):
            best, med = times[0], times[len(times) // 2]
            s = f"{name:38s} best {best:5.2f} s {mb / best:7,.0f} MB/s   median {med:5.2f} s {mb / med:7,.0f} MB/s"
            return s + (f"   = {ref[len(ref) // 2] / med:.2f}x sha256 alone (medians)" if ref else "")

        t_sha, _ = timed(lambda: [sha256_file(p) for p in files])
        print(line("reference: sha256 of every file", t_sha))

        t_full, rep = timed(lambda: verify(root))
        assert rep.ok, [str(p) for p in rep.problems]
        print(line("verify (all checks, checksums)", t_full, t_sha))
        t_quick, rep = timed(lambda: verify(root, quick=True))
        assert rep.ok
        print(line("verify --quick (no checksums)", t_quick, t_sha))
        t_ov, ov = timed(lambda: overview(root, block_size=1024))
        print(f"{'inspect overview --block-size 1024':38s} best {t_ov[0]:5.2f} s   median {t_ov[len(t_ov) // 2]:5.2f} s"
              f"   ({ov.splits[0].episodes:,} episodes, {ov.splits[0].tokens:,} tokens)")
        if args.packed:
            pk = root.parent / (root.name + "_packed")
            t0 = time.perf_counter()
            pack(root, pk, PackOptions(block_size=2048, overwrite=True))
            pmb = sum(p.stat().st_size for p in iter_files(pk)) / 1e6
            print(f"packed copy: {pmb:,.0f} MB, packed in {time.perf_counter() - t0:.1f} s")
            t_pk, rep = timed(lambda: verify(pk))
            assert rep.ok, [str(p) for p in rep.problems]
            print(f"{'verify packed (all checks, checksums)':38s} best {t_pk[0]:5.2f} s {pmb / t_pk[0]:7,.0f} MB/s"
                  f"   median {t_pk[len(t_pk) // 2]:5.2f} s")
            if tmp is None:
                shutil.rmtree(pk, ignore_errors=True)
        worst_rate = mb / t_full[-1]
        print(f"verify >= 200 MB/s: {'met' if worst_rate >= 200 else 'NOT met'} (slowest run {worst_rate:,.0f} MB/s); "
              f"inspect < 3 s: {'met' if t_ov[-1] < 3 else 'NOT met'} (slowest run {t_ov[-1]:.2f} s)")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
