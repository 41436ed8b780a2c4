#!/usr/bin/env python3
"""Benchmark: the overhead of ``--engine ray`` over ``--engine local`` on the same data.

    python benchmarks/bench_engine_ray.py [--mb 200] [--cpus 2] [--rounds 2]

On a generated corpus (benchmarks/corpus.py, 200 MB by default) it runs ``prepare``
(val split 1%) alternately with the local engine (``--workers CPUS`` processes) and the
Ray engine on a local Ray cluster of ``CPUS`` CPUs, started once before timing (as a
user's ``ray start --head`` would be), ``--rounds`` times each, and reports:

* throughput (input MB/s) of each run and the ratio ray / local of the best runs (ratios
  measured within one run: this machine's cores are shared, absolute times are noisy);
* Ray's fixed costs: starting the cluster, and a run on a tiny input (task start-up,
  the tokenizer sent to each worker);
* (the driver copies no token: tasks write the final shards; benchmarks/bench_coordinator.py
  measures what the driver reads, writes and computes);
* that both datasets are byte-identical.

Ray starts its worker processes at nice 15 (below every other process of a shared machine);
sftdata's own local cluster, and this benchmark's, start them at 0 like ``--engine local``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from corpus import WORK, generated_corpus, identical  # noqa: E402

from sftdata.engine.prepare_ray import ray_prepare_executor  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare  # noqa: E402


def timed(src: Path, out: Path, opts: PrepareOptions, executor=None) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    prepare([src], out, opts, executor=executor)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import ray

    src = generated_corpus(args.mb)
    mb = src.stat().st_size / 1e6
    tiny = generated_corpus(0.05)
    os.environ.setdefault("RAY_worker_niceness", "0")  # as sftdata's own local cluster: workers not niced
    t = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    init_s = time.perf_counter() - t
    opts = PrepareOptions(workers=args.cpus, val_split=0.01)
    executor = ray_prepare_executor()
    out = WORK / "engine"
    tiny_local = timed(tiny, out / "tiny_local", opts)
    tiny_ray = timed(tiny, out / "tiny_ray", opts, executor)
    runs: dict[str, list[float]] = {"local": [], "ray": []}
    for _ in range(args.rounds):
        runs["local"].append(timed(src, out / "local", opts))
        runs["ray"].append(timed(src, out / "ray", opts, executor))
    same = identical(out / "local", out / "ray")
    best = {k: min(v) for k, v in runs.items()}
    result = {
        "input_mb": round(mb, 1), "cpus": args.cpus,
        "local_mb_per_s": [round(mb / s, 2) for s in runs["local"]],
        "ray_mb_per_s": [round(mb / s, 2) for s in runs["ray"]],
        "ray_over_local": round(best["local"] / best["ray"], 3),
        "ray_per_worker_mb_per_s": round(mb / best["ray"] / args.cpus, 2),
        "ray_cluster_start_s": round(init_s, 2),
        "tiny_input_s": {"local": round(tiny_local, 2), "ray": round(tiny_ray, 2)},
        "byte_identical": same,
    }
    print(json.dumps(result, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
