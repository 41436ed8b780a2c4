#!/usr/bin/env python3
"""Benchmark: ``pack`` and ``verify`` with ``--engine ray`` against ``--engine local``.

    python benchmarks/bench_engine_ray_pack_verify.py [--mb 200] [--cpus 2] [--rounds 3] [--shard-tokens 2M]

The sibling of bench_engine_ray.py (prepare). It prepares a generated corpus
(benchmarks/corpus.py, 200 MB by default) once with ``--engine local``, then on a local
Ray cluster of ``CPUS`` CPUs (started once before timing, as ``ray start`` would be) runs,
alternately, ``--rounds`` times each:

* ``pack`` (bfd, ``--block-size 4096``): local (one process: pack has no worker processes)
  against ray (tasks building ranges of whole output shards);
* ``verify`` (every check, checksums included) of the dataset and of the pack: local (this
  process, one hashing thread beside the content checks, as the CLI runs it) against ray
  (one task per shard; for the pack, the comparison with the source episodes too).

Both engines' parallelism is per shard, so the dataset and the pack are written with
``--shard-tokens`` (default 2M tokens: ~25 shards per split here). Figures: throughput in
MB of dataset bytes (tokens + mask) per second, the ratio ray / local of the best runs
and of the medians (ratios within one run: this machine's cores are shared), the CPU seconds
of each run (this process, plus for ray every process of the cluster it started: tasks, raylet,
GCS; read from /proc) and their ratio, the Ray driver's own CPU seconds (the work that does
not spread over the cluster),
the fixed cost of a run on a tiny dataset, and that both packs are byte-identical and
both verify reports equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from corpus import WORK, generated_corpus, identical  # noqa: E402

from sftdata.cli.options import parse_size  # noqa: E402
from sftdata.engine import ray_engine  # noqa: E402
from sftdata.pack import PackOptions, pack  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from sftdata.verify import verify  # noqa: E402


def data_bytes(ds: Path) -> int:
    return sum(p.stat().st_size for p in ds.rglob("*.bin"))


TICK = os.sysconf("SC_CLK_TCK")


def descendants_cpu() -> float:
    """CPU seconds (user + system) of every live descendant of this process: the local
    Ray cluster this benchmark started (its raylet, GCS and worker processes), never
    another user's processes."""
    parent, cpu = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d.name)] = int(f[1])
        cpu[int(d.name)] = (int(f[11]) + int(f[12])) / TICK
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - mine
        mine |= frontier
    return sum(cpu[p] for p in mine)


def timed(fn) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process and of the Ray cluster it started, result)."""
    t, c, r = time.perf_counter(), time.process_time(), descendants_cpu()
    out = fn()
    return time.perf_counter() - t, time.process_time() - c + descendants_cpu() - r, out


def one_shard_dataset(name: str, mb: float, cpus: int) -> Path:
    """WORK/name/ds: a generated corpus of ``mb`` prepared into one shard per split (100 M
    tokens a shard: the layout of older datasets, where a task per shard leaves CPUs idle)."""
    out = WORK / name
    shutil.rmtree(out, ignore_errors=True)
    prepare([generated_corpus(mb)], out / "ds", PrepareOptions(workers=cpus, val_split=0.01,
                                                               shard_tokens=100_000_000))
    return out / "ds"


def local_ray(cpus: int) -> None:
    """A local Ray cluster of ``cpus`` CPUs, its workers at the driver's priority."""
    import ray

    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)


def alternate_rounds(rounds: int, whole, pieces) -> tuple[dict[str, list[tuple[float, float]]], list]:
    """``whole()`` once to warm the cluster's workers, then ``rounds`` rounds of ``whole()``
    and ``pieces()`` alternated: each run's (wall, CPU) seconds by name, and every result."""
    whole()
    runs: dict[str, list[tuple[float, float]]] = {"whole": [], "pieces": []}
    results = []
    for _ in range(rounds):
        for name, fn in (("whole", whole), ("pieces", pieces)):
            w, c, r = timed(fn)
            runs[name].append((w, c))
            results.append(r)
    return runs, results


def whole_against_pieces(runs: dict[str, list[tuple[float, float]]]) -> dict:
    """The (wall, CPU) seconds of each round of ``whole`` and ``pieces``, and pieces' speed-up."""
    return {**{f"{k}_wall_s": [round(w, 2) for w, _ in v] for k, v in runs.items()},
            **{f"{k}_cpu_s": [round(c, 2) for _, c in v] for k, v in runs.items()},
            "pieces_over_whole_best": round(min(w for w, _ in runs["whole"]) / min(w for w, _ in runs["pieces"]), 3),
            "pieces_over_whole_median": round(statistics.median(w for w, _ in runs["whole"])
                                              / statistics.median(w for w, _ in runs["pieces"]), 3)}


def report_dict(r) -> dict:
    d = r.as_dict()
    d.pop("seconds")
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shard-tokens", default="2M")
    ap.add_argument("--block-size", type=int, default=4096)
    args = ap.parse_args()
    import ray

    shard_tokens = parse_size(args.shard_tokens)
    out = WORK / "engine_pv"
    shutil.rmtree(out, ignore_errors=True)
    src, tiny_src = generated_corpus(args.mb), generated_corpus(0.05)
    popts = PrepareOptions(workers=args.cpus, val_split=0.01, shard_tokens=shard_tokens)
    prepare([src], out / "ds", popts)
    prepare([tiny_src], out / "tiny", popts)
    mb = data_bytes(out / "ds") / 1e6
    os.environ.setdefault("RAY_worker_niceness", "0")  # as sftdata's own local cluster: workers not niced
    t = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    init_s = time.perf_counter() - t
    packer, checker = ray_engine(), ray_engine()
    kopts = PackOptions(block_size=args.block_size, shard_tokens=shard_tokens, overwrite=True)
    # warm the workers once (imports, first task), as a cluster in use would be
    pack(out / "tiny", out / "tiny_ray", kopts, executor=packer)
    verify(out / "tiny", executor=checker)
    tiny = {"pack_local_s": timed(lambda: pack(out / "tiny", out / "tiny_local", kopts))[0],
            "pack_ray_s": timed(lambda: pack(out / "tiny", out / "tiny_ray", kopts, executor=packer))[0],
            "verify_local_s": timed(lambda: verify(out / "tiny"))[0],
            "verify_ray_s": timed(lambda: verify(out / "tiny", executor=checker))[0]}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in ("pack_local", "pack_ray", "verify_local",
                                                                   "verify_ray", "verify_packed_local",
                                                                   "verify_packed_ray")}
    drivers: dict[str, list[tuple[float, float]]] = {"pack_ray": [], "verify_ray": [], "verify_packed_ray": []}
    def local_and_ray(name: str, local, ray_run) -> tuple:
        """Time ``local`` then ``ray_run`` into ``runs`` (and the driver's CPU of the Ray run);
        their results."""
        w, c, a = timed(local)
        runs[f"{name}_local"].append((w, c))
        d = time.process_time()
        w, c, b = timed(ray_run)
        runs[f"{name}_ray"].append((w, c))
        drivers[f"{name}_ray"].append((w, time.process_time() - d))
        return a, b

    same_reports = True
    for _ in range(args.rounds):
        local_and_ray("pack", lambda: pack(out / "ds", out / "p_local", kopts),
                      lambda: pack(out / "ds", out / "p_ray", kopts, executor=packer))
        for name, ds in (("verify", out / "ds"), ("verify_packed", out / "p_local")):
            a, b = local_and_ray(name, lambda: verify(ds), lambda: verify(ds, executor=checker))
            same_reports &= report_dict(a) == report_dict(b) and a.ok
    best = {k: min(w for w, _ in v) for k, v in runs.items()}
    median = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    shards = len(list((out / "ds" / "train").iterdir()))
    pmb = data_bytes(out / "p_local") / 1e6
    result = {
        "input_mb": round(src.stat().st_size / 1e6, 1), "dataset_mb": round(mb, 1), "cpus": args.cpus,
        "shards": {"dataset_train": shards, "pack_train": len(list((out / "p_ray" / "train").iterdir()))},
        "packed_mb": round(pmb, 1),
        **{f"{k}_mb_per_s": [round((pmb if "packed" in k else mb) / w, 1) for w, _ in v] for k, v in runs.items()},
        **{f"{k}_cpu_s": [round(c, 2) for _, c in v] for k, v in runs.items()},
        "pack_cpu_ray_over_local": round(statistics.median(c for _, c in runs["pack_local"])
                                         / statistics.median(c for _, c in runs["pack_ray"]), 3),
        "verify_cpu_ray_over_local": round(statistics.median(c for _, c in runs["verify_local"])
                                           / statistics.median(c for _, c in runs["verify_ray"]), 3),
        "verify_packed_cpu_ray_over_local": round(statistics.median(c for _, c in runs["verify_packed_local"])
                                                  / statistics.median(c for _, c in runs["verify_packed_ray"]), 3),
        **{f"{k}_driver_cpu_s": round(min(c for _, c in v), 2) for k, v in drivers.items()},
        "pack_ray_over_local": round(best["pack_local"] / best["pack_ray"], 3),
        "verify_ray_over_local": round(best["verify_local"] / best["verify_ray"], 3),
        "pack_ray_over_local_median": round(median["pack_local"] / median["pack_ray"], 3),
        "verify_ray_over_local_median": round(median["verify_local"] / median["verify_ray"], 3),
        "verify_packed_ray_over_local": round(best["verify_packed_local"] / best["verify_packed_ray"], 3),
        "verify_packed_ray_over_local_median": round(median["verify_packed_local"] / median["verify_packed_ray"],
                                                     3),
        "ray_cluster_start_s": round(init_s, 2),
        "tiny_dataset_s": {k: round(v, 2) for k, v in tiny.items()},
        "pack_byte_identical": identical(out / "p_local", out / "p_ray"),
        "verify_reports_equal": same_reports,
    }
    print(json.dumps(result, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
