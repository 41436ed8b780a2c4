#!/usr/bin/env python3
"""Benchmark: ``verify --engine ray`` of a dataset of few large shards, a task per shard
against tasks over parts of a shard (``verify.shards.shard_parts``).

    python benchmarks/bench_verify_pieces.py [--mb 50] [--cpus 2] [--rounds 3]

Prepares a generated corpus (benchmarks/corpus.py) once with ``--shard-tokens 100000000``
(one shard per split), then on a local Ray cluster of ``CPUS`` CPUs verifies it,
alternately ``--rounds`` times: a task per shard (``items_per_task`` larger than any
shard) against the default (each shard in parts of its episodes, a task each, and a task
hashing its files). Reports each run's wall and CPU seconds (this process and the cluster
it started, from /proc), the tasks, and that both reports equal the local one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_engine_ray_pack_verify import (  # noqa: E402
    alternate_rounds,
    data_bytes,
    local_ray,
    one_shard_dataset,
    report_dict,
    whole_against_pieces,
)

from sftdata.engine import ray_engine  # noqa: E402
from sftdata.store.reader import scan_dataset  # noqa: E402
from sftdata.tasks import TASKS_PER_CPU  # noqa: E402
from sftdata.verify import verify  # noqa: E402
from sftdata.verify.shards import ShardContext, shard_parts  # noqa: E402

BIG = 100_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import ray

    ds = one_shard_dataset("verify_pieces", args.mb, args.cpus)
    out = ds.parent
    local = report_dict(verify(out / "ds"))
    local_ray(args.cpus)
    whole, pieces = ray_engine(items_per_task=10**12), ray_engine()
    runs, reports = alternate_rounds(args.rounds, lambda: verify(out / "ds", executor=whole),
                                     lambda: verify(out / "ds", executor=pieces))
    same = all(report_dict(r) == local for r in reports)
    shards = scan_dataset(out / "ds").dataset.shards
    parts = shard_parts(shards, ShardContext(False, None, None, None, False), TASKS_PER_CPU * args.cpus)
    result = {
        "dataset_mb": round(data_bytes(out / "ds") / 1e6, 1), "cpus": args.cpus, "shards": len(shards),
        "tasks": {"whole": len(shards), "pieces": sum(1 if p is None else len(p) + 1 for p in parts)},
        **whole_against_pieces(runs),
        "reports_equal_local": same,
        "load_average": os.getloadavg()[0],
    }
    ray.shutdown()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
