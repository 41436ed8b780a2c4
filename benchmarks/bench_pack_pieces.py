#!/usr/bin/env python3
"""Benchmark: ``pack --engine ray`` of a dataset of few large shards, whole shards per task
against tasks over part of a shard (``pack.tasks.row_tasks``).

    python benchmarks/bench_pack_pieces.py [--mb 50] [--cpus 2] [--rounds 3] [--block-size 4096]

Prepares a generated corpus (benchmarks/corpus.py) once with ``--shard-tokens 100000000``
(one shard per split, as datasets before the 16M-token default), then on a local Ray
cluster of ``CPUS`` CPUs packs it with ``--shard-tokens 100000000`` (one output shard per
split), alternately ``--rounds`` times: ``shards_per_task=1`` (a task per shard: the train
split is one task) against the default (the shard cut into pieces of rows, a task each,
and a merge task). Reports each run's wall and CPU seconds (this process and the cluster
it started, from /proc), the tasks of the train split, and that every file of both packs
equals the local pack's.
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
    whole_against_pieces,
)
from corpus import identical  # noqa: E402

from sftdata.engine import ray_engine  # noqa: E402
from sftdata.pack import PackOptions, pack  # noqa: E402
from sftdata.pack.tasks import row_tasks  # noqa: E402

BIG = 100_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=4096)
    args = ap.parse_args()
    import ray

    ds = one_shard_dataset("pack_pieces", args.mb, args.cpus)
    out = ds.parent
    kopts = PackOptions(block_size=args.block_size, shard_tokens=BIG, force=True)  # rebuilt every run
    pack(out / "ds", out / "p_local", kopts)
    local_ray(args.cpus)
    whole, pieces = ray_engine(shards_per_task=1), ray_engine()
    runs, _ = alternate_rounds(args.rounds, lambda: pack(out / "ds", out / "p_whole", kopts, executor=whole),
                               lambda: pack(out / "ds", out / "p_pieces", kopts, executor=pieces))
    rows = json.loads((out / "p_local" / "dataset_metadata.json").read_bytes())["splits"]["train"]["rows"]
    per = BIG // args.block_size
    mb = data_bytes(out / "p_local") / 1e6
    result = {
        "dataset_mb": round(data_bytes(out / "ds") / 1e6, 1), "packed_mb": round(mb, 1), "cpus": args.cpus,
        "train_rows": rows, "train_shards": -(-rows // per),
        "train_tasks": {"whole": len(row_tasks(rows, per, args.cpus, shards_per_task=1)),
                        "pieces": sum(len(p) + (len(p) > 1) for _, _, p in row_tasks(rows, per, args.cpus))},
        **whole_against_pieces(runs),
        "byte_identical": identical(out / "p_local", out / "p_whole") and identical(out / "p_local", out / "p_pieces"),
        "load_average": os.getloadavg()[0],
    }
    ray.shutdown()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
