#!/usr/bin/env python3
"""Benchmark: what the coordinator (the Ray driver) reads, writes and computes while Ray
tasks prepare a dataset, on a local cluster of several raylets.

    python benchmarks/bench_coordinator.py [--mb 50 200 1000] [--raylets 2] [--old /tmp/old]

A ``ray.cluster_utils.Cluster`` of ``--raylets`` raylets of 1 CPU each (and a head of 0
CPUs: no task runs beside the driver) prepares generated chat corpora
(benchmarks/corpus.py) of each ``--mb`` size, with a 1% val split, and a corpus of the
smallest size whose texts are repeated 4 times (the same episodes, ~4x the tokens). For
each run it reports, for the driver process alone:

* ``io``: bytes it read and wrote through system calls (``/proc/self/io`` rchar and wchar:
  files, pipes and the sockets to Ray), and the same per dataset byte;
* ``task_bytes``: the pickled size of every task's arguments and result (what Ray carries
  between driver and tasks, through sockets or its shared-memory object store);
* ``cpu_s``: its CPU seconds (user + system, every thread: Ray's own threads in the driver
  too, which tick with the wall time), and per 1,000 episodes; ``main_thread_cpu_s``, the
  thread that runs sftdata's coordinator;
* the dataset's bytes, episodes and tokens, and the wall time.

With ``--old TREE`` (a checkout of the code before the change, e.g. ``git worktree add
/tmp/old main``), each corpus is also prepared by that code (``--workers 2``, in a
subprocess) and the two datasets are compared file by file: ``byte_identical_to_old``
(the metadata but for the ``block_sha256`` each input now records, and so its checksum).

``--pref`` runs prepare-pref instead (pairs from benchmarks/bench_pref.py's generator, of
each ``--mb`` size, partitioned like prepare-chat: ``sftdata.prepare.prepare_pref`` with the
Ray executor), and checks each dataset byte-identical to ``--engine local``'s
(``byte_identical_to_local``).

``--plan-only N`` times the coordinator's own steps on N synthetic episodes (no Ray, no
tokenizer): what its CPU grows with. Per episode, from 100 partitions' summaries: the
16 bytes each summary carries unpickled, the exact split (``split.split_assignment``),
the final shards planned (``plan.plan_shards``) at the default ``--shard-tokens``.

``--task-rates MB`` times, in this process, one core's rate of the two waves of tasks
around the partition tasks: ``scan_range`` (newlines counted, 4 MiB blocks hashed) over a
generated corpus of MB, and ``write_shard`` (one final shard written from staged episodes:
read, the split writer's checksums, write) over the dataset prepared from it.

The machine's cores are shared (this one has 2): times are noisy, bytes and episode
counts are not.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from corpus import WORK, generated_corpus  # noqa: E402

from sftdata.engine import prepare_ray  # noqa: E402
from sftdata.pref import PrefOptions  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare, prepare_pref  # noqa: E402

TASKS = {"args": 0, "results": 0, "count": 0}


class _Counted(prepare_ray.RayRunner):
    """The Ray runner, counting the pickled bytes of every task's arguments and result."""

    def submit(self, fn, args, doing):
        TASKS["args"] += len(pickle.dumps(args))
        TASKS["count"] += 1
        return super().submit(fn, args, doing)

    def result(self, ref, doing):
        out = super().result(ref, doing)
        TASKS["results"] += len(pickle.dumps(out))
        return out


def proc_io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def longer_corpus(src: Path, times: int) -> Path:
    """``src`` with every message text repeated ``times`` times: the same records and
    episodes, ~``times`` x the tokens."""
    out = src.with_name(f"{src.stem}_x{times}.jsonl")
    if not out.exists():
        with open(src, "rb") as f, open(out, "wb") as g:
            for line in f:
                rec = orjson.loads(line)
                for m in rec["messages"]:
                    m["content"] = " ".join([m["content"]] * times)
                g.write(orjson.dumps(rec) + b"\n")
    return out


def dataset_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def pairs_corpus(mb: float) -> Path:
    """Conversational pairs (bench_pref's generator) of about ``mb`` MB, JSONL."""
    from bench_pref import pairs

    out = WORK / f"pairs_{mb:g}mb.jsonl"
    if not out.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as f:
            seed = 0
            while f.tell() < mb * 1e6:
                f.write(b"".join(orjson.dumps(r) + b"\n" for r in pairs(1000, seed)))
                seed += 1
    return out


def same_tree(a: Path, b: Path) -> bool:
    """Every file of ``a`` byte-identical in ``b`` (the metadata but for its time and the build's timing)."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    if files != sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()):
        return False
    for rel in files:
        x, y = (a / rel).read_bytes(), (b / rel).read_bytes()
        if rel.name == "dataset_metadata.json":
            x, y = (orjson.loads(v) for v in (x, y))
            for m in (x, y):
                for k in ("build", "metadata_checksum", "files"):
                    m.pop(k, None)
        if x != y:
            return False
    return True


def measured_run(src: Path, out: Path, opts) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    TASKS.update(args=0, results=0, count=0)
    build = prepare_pref if isinstance(opts, PrefOptions) else prepare
    io0, c0, m0, t0 = proc_io(), cpu_s(), time.thread_time(), time.perf_counter()
    s = build([src], out, opts, executor=prepare_ray.ray_prepare_executor())
    wall, cpu, main_cpu, io1 = time.perf_counter() - t0, cpu_s() - c0, time.thread_time() - m0, proc_io()
    rchar, wchar = io1["rchar"] - io0["rchar"], io1["wchar"] - io0["wchar"]
    size = dataset_bytes(out)
    episodes = sum(s.rows.values() if isinstance(opts, PrefOptions) else s.episodes.values())
    return {
        "input_mb": round(src.stat().st_size / 1e6, 1), "episodes": episodes, "tokens": sum(s.tokens.values()),
        "dataset_mb": round(size / 1e6, 1), "wall_s": round(wall, 1),
        "io": {"read_mb": round(rchar / 1e6, 3), "written_mb": round(wchar / 1e6, 3),
               "share_of_dataset": round((rchar + wchar) / size, 5)},
        "task_bytes": {"tasks": TASKS["count"], "args_mb": round(TASKS["args"] / 1e6, 3),
                       "results_mb": round(TASKS["results"] / 1e6, 3),
                       "bytes_per_episode": round((TASKS["args"] + TASKS["results"]) / episodes, 1),
                       "share_of_dataset": round((TASKS["args"] + TASKS["results"]) / size, 5)},
        "cpu_s": round(cpu, 2), "cpu_ms_per_1k_episodes": round(1e6 * cpu / episodes, 2),
        "main_thread_cpu_s": round(main_cpu, 2),
    }


def same_as_old(new: Path, old: Path) -> bool:
    """Every file byte-identical, the metadata but for what the change adds to each input
    (``block_sha256``)."""
    meta = "dataset_metadata.json"
    fa = sorted(str(p.relative_to(new)) for p in new.rglob("*") if p.is_file())
    fb = sorted(str(p.relative_to(old)) for p in old.rglob("*") if p.is_file())
    if fa != fb or not all((new / f).read_bytes() == (old / f).read_bytes() for f in fa if f != meta):
        return False
    a, b = orjson.loads((new / meta).read_bytes()), orjson.loads((old / meta).read_bytes())
    for src in a["sources"]:
        src.pop("block_sha256", None)
    a.pop("metadata_checksum"), b.pop("metadata_checksum")  # the metadata's own sha256
    return a == b


def old_run(tree: Path, src: Path, out: Path, opts: PrepareOptions) -> None:
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "sftdata", "prepare-chat", str(src), "-o", str(out), "--val-split",
                    str(opts.val_split), "--shard-tokens", str(opts.shard_tokens), "--workers", "2", "--quiet"],
                   check=True, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)


def plan_only(n: int, parts: int = 100) -> dict:
    """The coordinator's per-episode steps on ``n`` synthetic episodes in ``parts`` parts."""
    from sftdata.prepare.plan import plan_shards
    from sftdata.prepare.results import StagedPart
    from sftdata.prepare.split import split_assignment
    from sftdata.store.format import DEFAULT_SHARD_TOKENS

    rng = np.random.default_rng(0)
    lengths = rng.lognormal(6.5, 0.8, n).astype(np.int64) + 20  # ~1,000 tokens, as the generated corpus
    cuts = np.linspace(0, n, parts + 1).astype(np.int64)
    blobs = [pickle.dumps((lengths[a:b], np.arange(a, b, dtype=np.int64))) for a, b in zip(cuts[:-1], cuts[1:])]
    out = {"episodes": n}
    t = time.process_time()
    staged = []
    for i, blob in enumerate(blobs):
        ls, srcs = pickle.loads(blob)
        staged.append(StagedPart(f"part_{i}", ls.shape[0], int(ls.sum()), 0, ls, srcs))
    out["summaries_s"] = round(time.process_time() - t, 3)
    t = time.process_time()
    is_val = split_assignment(n, 0.01, 1337)
    out["split_s"] = round(time.process_time() - t, 3)
    t = time.process_time()
    jobs = plan_shards(staged, is_val, DEFAULT_SHARD_TOKENS, ("train", "val"))
    out["plan_s"] = round(time.process_time() - t, 3)
    out["shards"] = len(jobs)
    total = out["summaries_s"] + out["split_s"] + out["plan_s"]
    out["us_per_episode"] = round(1e6 * total / n, 3)
    return out


def task_rates(mb: float) -> dict:
    """One core's rate of ``scan_range`` and ``write_shard`` (MB/s of what each reads)."""
    from sftdata.prepare.plan import Piece, ShardJob
    from sftdata.prepare.shard_task import write_shard
    from sftdata.sources.partitions import scan_range
    from sftdata.store.shard import Shard

    src = generated_corpus(mb)
    size = src.stat().st_size
    scan_range(str(src), 0, size, size)  # the page cache warm, as for the tasks right after the scans
    t = time.perf_counter()
    scan_range(str(src), 0, size, size)
    scan_s = time.perf_counter() - t
    out = WORK / "rates"
    shutil.rmtree(out, ignore_errors=True)
    prepare([src], out / "ds", PrepareOptions(workers=2, shard_tokens=1 << 40))
    shard = out / "ds" / "train" / "shard_00000"
    n = Shard(shard, np.dtype("uint32")).num_episodes
    staged = sum(p.stat().st_size for p in shard.iterdir())
    (out / "root" / "train").mkdir(parents=True)
    (out / "stage").mkdir()
    job = ShardJob("train", 0, (Piece(str(shard), 0, n, None, 0),), 0)
    t = time.perf_counter()
    write_shard(job, "uint32", str(out / "root"), str(out / "stage"), str(out))
    write_s = time.perf_counter() - t
    shutil.rmtree(out, ignore_errors=True)
    return {"scan_mb_per_s": round(size / 1e6 / scan_s, 1), "write_shard_mb_per_s": round(staged / 1e6 / write_s, 1),
            "input_mb": round(size / 1e6, 1), "shard_mb": round(staged / 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, nargs="+", default=[50, 200, 1000])
    ap.add_argument("--raylets", type=int, default=2)
    ap.add_argument("--old", type=Path, default=None, help="a checkout of the code before the change")
    ap.add_argument("--task-rates", type=float, default=0, metavar="MB", help="time scan and write tasks on MB")
    ap.add_argument("--pref", action="store_true", help="prepare-pref (pairs) instead of prepare-chat")
    ap.add_argument("--plan-only", type=int, default=0, metavar="N", help="time the coordinator's steps on N episodes")
    args = ap.parse_args()
    if args.plan_only:
        print(json.dumps(plan_only(args.plan_only), indent=2))
        return
    if args.task_rates:
        print(json.dumps(task_rates(args.task_rates), indent=2))
        return
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_worker_niceness", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(args.raylets):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    prepare_ray.RayRunner = _Counted
    opts = PrefOptions(val_split=0.01) if args.pref else PrepareOptions(val_split=0.01)
    out = WORK / "coordinator"
    sizes = sorted(args.mb)
    corpora = [pairs_corpus(mb) for mb in sizes] if args.pref else \
        [generated_corpus(mb) for mb in sizes] + [longer_corpus(generated_corpus(sizes[0]), 4)]
    build = prepare_pref if args.pref else prepare
    build([corpora[0]], out / "warm", opts, executor=prepare_ray.ray_prepare_executor())  # workers started
    runs = []
    for src in corpora:
        r = measured_run(src, out / "ray", opts)
        if args.pref:
            shutil.rmtree(out / "local", ignore_errors=True)
            prepare_pref([src], out / "local", opts)
            r["byte_identical_to_local"] = same_tree(out / "ray", out / "local")
        if args.old is not None:
            old_run(args.old, src, out / "old", opts)
            r["byte_identical_to_old"] = same_as_old(out / "ray", out / "old")
        runs.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    print(json.dumps({"raylets": args.raylets, "cores": os.cpu_count(), "runs": runs}, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
