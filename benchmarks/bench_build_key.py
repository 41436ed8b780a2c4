#!/usr/bin/env python3
"""Benchmark: an unchanged build is up to date in under a second, on a ~1 GB input.

    python benchmarks/bench_build_key.py [--mb 1000] [--runs 5] [--pack] [--json]

1. A generated chat corpus of ``--mb`` MB (``_work/corpus_{mb}mb.jsonl``, seed 0, written
   once) is prepared once into ``_work/build_key_{mb}mb`` (skipped when it is up to date).
2. **Reuse**: ``sftdata prepare-chat CORPUS -o DATASET`` run again as a user runs it (a new
   process each time: start-up, imports, the tokenizer, the build key), ``--runs`` times:
   the wall time of each, and the same call in this process (``prepare()``, imports warm).
3. **Touched**: the input's mtime moved, its bytes unchanged: the stat no longer matches,
   so its sha256 is computed again (a read of the whole input) and the build is still up
   to date. This is what every reuse would cost without the recorded stat.
4. ``--pack``: the dataset packed once (``--block-size 2048``), then ``sftdata pack`` run
   again (the source's metadata is hashed, nothing else).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from corpus import WORK, generated_corpus  # noqa: E402

from sftdata.prepare import PrepareOptions, prepare  # noqa: E402

CPU: list[float] = []  # the CPU seconds (user + system) of each process cli() ran


def cli(*args: str) -> tuple[float, dict]:
    """Wall seconds of ``python -m sftdata ARGS --json`` in a new process, and its JSON (its
    CPU seconds are appended to ``CPU``: on a loaded machine the wall time is mostly waiting)."""
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "sftdata", *args, "--json", "--quiet"], capture_output=True, text=True,
                         env=env, cwd=HERE.parent)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise SystemExit(f"sftdata {' '.join(args)} failed: {out.stderr.strip()}")
    return wall, json.loads(out.stdout)


def summary(times: list[float], cpu: list[float] | None = None) -> dict:
    out = {"min_s": round(min(times), 3), "median_s": round(statistics.median(times), 3),
           "max_s": round(max(times), 3), "runs": len(times)}
    return out if cpu is None else {**out, "cpu_min_s": round(min(cpu), 3), "cpu_median_s": round(statistics.median(cpu), 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pack", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    corpus = generated_corpus(a.mb)
    dataset = WORK / f"build_key_{a.mb:g}mb"
    out: dict = {"input_bytes": corpus.stat().st_size, "load_average": round(os.getloadavg()[0], 2)}
    wall, first = cli("prepare-chat", str(corpus), "-o", str(dataset), "--overwrite")
    out["first"] = {"seconds": round(wall, 2), "up_to_date": first["up_to_date"], "records": first["records_read"],
                    "tokens": sum(first["tokens"].values()), "dataset_bytes": sum(
                        p.stat().st_size for p in dataset.rglob("*") if p.is_file())}
    walls = []
    del CPU[:]
    for _ in range(a.runs):
        wall, again = cli("prepare-chat", str(corpus), "-o", str(dataset))
        assert again["up_to_date"], again["changed"]
        walls.append(wall)
    out["reuse_cli"] = summary(walls, list(CPU))
    inproc = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        assert prepare([str(corpus)], dataset, PrepareOptions()).up_to_date
        inproc.append(time.perf_counter() - t0)
    out["reuse_in_process"] = summary(inproc)
    st = corpus.stat()
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: same bytes, another stat
    wall, touched = cli("prepare-chat", str(corpus), "-o", str(dataset))
    out["touched_cli"] = {"seconds": round(wall, 2), "up_to_date": touched["up_to_date"],
                          "hash_mb_per_s": round(st.st_size / 1e6 / wall, 0)}
    if a.pack:
        packed = WORK / f"build_key_{a.mb:g}mb_packed"
        wall, _ = cli("pack", str(dataset), "-o", str(packed), "--block-size", "2048", "--overwrite")
        out["pack_first_s"] = round(wall, 2)
        walls = []
        del CPU[:]
        for _ in range(a.runs):
            wall, again = cli("pack", str(dataset), "-o", str(packed), "--block-size", "2048")
            assert again["up_to_date"]
            walls.append(wall)
        out["pack_reuse_cli"] = summary(walls, list(CPU))
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        gb = out["input_bytes"] / 1e9
        print(f"input {gb:.2f} GB ({out['first']['records']:,} records, {out['first']['tokens']:,} tokens, dataset "
              f"{out['first']['dataset_bytes'] / 1e9:.2f} GB); load average {out['load_average']}")
        print(f"first prepare: {out['first']['seconds']} s (up to date: {out['first']['up_to_date']})")
        r = out["reuse_cli"]
        print(f"up to date, CLI (a new process): wall min {r['min_s']} s, median {r['median_s']} s, max {r['max_s']} s; "
              f"CPU min {r['cpu_min_s']} s, median {r['cpu_median_s']} s")
        r = out["reuse_in_process"]
        print(f"up to date, prepare() in this process: min {r['min_s']} s, median {r['median_s']} s")
        t = out["touched_cli"]
        print(f"input touched (its sha256 computed again): {t['seconds']} s, {t['hash_mb_per_s']:.0f} MB/s, up to date: "
              f"{t['up_to_date']}")
        if a.pack:
            r = out["pack_reuse_cli"]
            print(f"pack: first {out['pack_first_s']} s; up to date, CLI: wall min {r['min_s']} s, median "
                  f"{r['median_s']} s; CPU median {r['cpu_median_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
