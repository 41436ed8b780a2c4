#!/usr/bin/env python3
"""Benchmark: prepare-chat throughput against raw tiktoken, and peak memory.

    python benchmarks/bench_prepare.py [--mb 50] [--workers N]

On a generated corpus (benchmarks/corpus.py, at least 50 MB by default) it measures,
in the same run:

* reference A: tiktoken ``encode_ordinary_batch`` (num_threads=1) of exactly the
  message texts of the corpus (the reference prepare's throughput is measured against);
* reference B: the BPE core's ``encode_ordinary`` called per text, with no batching
  overhead (the strictest reference: pure tokenisation);
* ``prepare`` with 1 worker and with all cores (the whole pipeline: read, parse,
  validate, render, mask, split, write, checksum).

It reports throughput ratios (prepare / reference; 1.0 = as fast as the reference),
and peak RSS of a prepare run (1 worker, in a child process) on the corpus and on a
10x smaller one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from corpus import message_texts, write_corpus  # noqa: E402

from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from sftdata.tokenizer import load_tokenizer  # noqa: E402

WORK = HERE / "_work"

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork+exec from the (large) parent.
PEAK_SNIPPET = """
import sys
sys.path.insert(0, {root!r})
from sftdata.prepare import PrepareOptions, prepare
prepare([{src!r}], {out!r}, PrepareOptions(workers=1, overwrite=True, val_split=0.1))
print([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0])
"""


def corpus(mb: float) -> Path:
    WORK.mkdir(exist_ok=True)
    path = WORK / f"corpus_{mb:g}mb.jsonl"
    if not path.exists():
        write_corpus(path, int(mb * 1e6), seed=0)
    return path


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def peak_rss_mb(src: Path) -> float:
    out = WORK / "peak_out"
    code = PEAK_SNIPPET.format(root=str(HERE.parent), src=str(src), out=str(out))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    shutil.rmtree(out, ignore_errors=True)
    return int(res.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=50.0, help="corpus size in MB (default 50)")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    src = corpus(a.mb)
    small = corpus(a.mb / 10)
    texts = message_texts(src)
    tok = load_tokenizer()
    enc = tok._enc
    n_tokens = sum(len(x) for x in enc.encode_ordinary_batch(texts[:1000], num_threads=1))

    ref_batch = timed(lambda: enc.encode_ordinary_batch(texts, num_threads=1))
    core = enc._core_bpe.encode_ordinary
    ref_core = timed(lambda: [core(t) for t in texts])
    out = WORK / "out"
    results = {}
    for workers in sorted({1, a.workers}):
        opts = PrepareOptions(workers=workers, overwrite=True, val_split=0.1)
        secs = timed(lambda: prepare([src], out, opts))
        results[workers] = secs
    shutil.rmtree(out, ignore_errors=True)
    peak_small, peak_big = peak_rss_mb(small), peak_rss_mb(src)
    mb = src.stat().st_size / 1e6
    report = {
        "corpus_mb": round(mb, 1), "messages": len(texts), "sample_tokens": n_tokens,
        "ref_encode_ordinary_batch_s": round(ref_batch, 3), "ref_core_encode_s": round(ref_core, 3),
        "prepare_s": {str(k): round(v, 3) for k, v in results.items()},
        "ratio_vs_encode_ordinary_batch": {str(k): round(ref_batch / v, 3) for k, v in results.items()},
        "ratio_vs_core_encode": {str(k): round(ref_core / v, 3) for k, v in results.items()},
        "peak_rss_mb": {f"{small.stat().st_size / 1e6:.0f}MB": round(peak_small, 1),
                        f"{mb:.0f}MB": round(peak_big, 1)},
        "peak_growth_10x_input": round(peak_big / peak_small, 3),
        "cores": len(os.sched_getaffinity(0)),
    }
    if a.json:
        print(json.dumps(report, indent=2))
        return
    print(f"corpus: {mb:.1f} MB, {len(texts):,} messages")
    print(f"reference A  encode_ordinary_batch(num_threads=1): {ref_batch:6.2f} s  ({mb / ref_batch:5.1f} MB/s)")
    print(f"reference B  core encode_ordinary per text:         {ref_core:6.2f} s  ({mb / ref_core:5.1f} MB/s)")
    for w, secs in results.items():
        print(f"prepare-chat --workers {w}: {secs:6.2f} s  ({mb / secs:5.1f} MB/s)  "
              f"ratio vs A {ref_batch / secs:4.2f}  vs B {ref_core / secs:4.2f}")
    print(f"peak RSS: {peak_small:.0f} MB on {small.stat().st_size / 1e6:.0f} MB input, "
          f"{peak_big:.0f} MB on {mb:.0f} MB input (x{peak_big / peak_small:.2f} for 10x input)")


if __name__ == "__main__":
    main()
