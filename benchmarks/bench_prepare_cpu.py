#!/usr/bin/env python3
"""Benchmark: prepare against tiktoken's BPE core by CPU time, for one or more source trees.

    python benchmarks/bench_prepare_cpu.py CORPUS[:chat|tool] ... [--tree DIR ...] [--repeat N]

For each corpus and each tree (default: this checkout; give an older checkout as another
``--tree`` to compare before and after), alternated ``--repeat`` times, in a child process:

* the CPU time of ``prepare`` at ``--workers 1`` (in-process) with ``--memo-mb 0`` and with
  the default memo, against the CPU time of the BPE core's ``encode_ordinary`` on exactly the
  texts prepare encodes (each record's whole system span, each message, each call), measured
  before and after each run in the same process (the better of the two);
* for each ``--memos`` value, a model of the 1 -> 2 worker speed-up on two idle cores (against
  the 1-worker run with the same memo), from CPU times (wall times on a
  shared machine say little: run ``--spin`` to see how much two plain Python processes gain
  there): ``--workers 2`` costs the workers' CPU, the parent's CPU while they run and the
  parent's CPU before the first chunk and after the last (serial); on two idle cores it takes
  about ``serial + (workers + parent while they run) / 2`` against the 1-worker CPU time.

Prints one line per run and the best CPU ratio of each (corpus, memo, tree). ``--overhead``
times instead what prepare does beside the core (its answers replayed), in parts. Corpora:
``benchmarks/_work/real_data_50mb_distinct.jsonl`` and the others ``bench_prepare.py`` writes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import pickle
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _prepare_module(name: str):
    """``sftdata.prepare.<name>``, or ``sftdata.prepare`` itself in a tree from before it became a package."""
    import importlib

    try:
        return importlib.import_module(f"sftdata.prepare.{name}")
    except ModuleNotFoundError:
        return importlib.import_module("sftdata.prepare")


def child(src: Path, mode: str, texts_file: Path, scaling: bool, memos: tuple = (0, 256)) -> dict:
    """Runs inside one tree (its sftdata first on sys.path)."""
    from sftdata.prepare import PrepareOptions, prepare
    # where prepare looks up its chunks' results and its curating (the driver's, or an older tree's run)
    try:
        prep = importlib.import_module("sftdata.prepare.driver")
    except ModuleNotFoundError:
        prep = _prepare_module("run")
    names = ("chunk_results", "curate") if hasattr(prep, "chunk_results") else ("local_results", "curate_result")
    from sftdata.chat.tokenizer import load_tokenizer

    texts = pickle.loads(texts_file.read_bytes())
    core = load_tokenizer()._enc._core_bpe.encode_ordinary
    val = 0.1 if mode == "chat" else 0.0

    def core_cpu() -> float:
        c = time.process_time()
        for t in texts:
            core(t)
        return time.process_time() - c

    def run(workers: int, memo: float) -> float:
        out = Path(f"/tmp/bench_prepare_cpu_{os.getpid()}")
        c = time.process_time()
        prepare([src], out, PrepareOptions(mode=mode, workers=workers, memo_mb=memo, overwrite=True, val_split=val))
        c = time.process_time() - c
        shutil.rmtree(out, ignore_errors=True)
        return c

    report = {}
    for memo in memos:
        before = core_cpu()
        cpu = run(1, memo)
        ref = min(before, core_cpu())
        report[f"memo{memo:g}"] = {"core_cpu": ref, "prepare_cpu": cpu, "ratio": ref / cpu}
    if scaling:
        marks: dict = {}
        real_results, real_curate = (getattr(prep, n) for n in names)

        def results(*a, **k):  # the engine starts: what came before (tokenizer, inputs) is serial
            marks["first"] = time.process_time()
            return real_results(*a, **k)

        def curate(*a):
            marks["last"] = time.process_time()
            return real_curate(*a)

        for n, f in zip(names, (results, curate)):
            setattr(prep, n, f)
        mb = src.stat().st_size / 1e6
        kids_before = 0.0
        for memo in memos:  # the 2-worker model of each memo setting, against its own 1-worker run
            c0 = time.process_time()
            parent = run(2, memo)
            while multiprocessing.active_children():  # the pool's processes, reaped: their CPU is counted
                time.sleep(0.02)
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            serial = (marks["first"] - c0) + (c0 + parent - marks["last"])
            workers = kids.ru_utime + kids.ru_stime - kids_before
            kids_before += workers
            one = report[f"memo{memo:g}"]["prepare_cpu"]
            report[f"two_workers_memo{memo:g}"] = {
                "workers_cpu": workers, "parent_cpu": parent, "serial_cpu": serial,
                "parent_ms_per_mb": 1000 * parent / mb, "parent_while_ms_per_mb": 1000 * (parent - serial) / mb,
                "parent_share": parent / (parent + workers), "extra_cpu": (workers + parent) / one - 1,
                "model_speedup": one / (serial + (workers + parent - serial) / 2)}
    return report


def wall_child(src: Path, mode: str, workers: int, memo: float = 0) -> dict:
    """One ``prepare`` at ``workers`` and ``--memo-mb memo``: wall time, this process's CPU and its workers'."""
    from sftdata.prepare import PrepareOptions, prepare

    out = Path(f"/tmp/bench_prepare_wall_{os.getpid()}")
    load = os.getloadavg()[0]
    t, c = time.perf_counter(), time.process_time()
    prepare([src], out, PrepareOptions(mode=mode, workers=workers, memo_mb=memo, overwrite=True,
                                       val_split=0.1 if mode == "chat" else 0.0))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    while multiprocessing.active_children():
        time.sleep(0.02)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": wall, "parent_cpu": cpu, "workers_cpu": kids.ru_utime + kids.ru_stime, "load": load}


def overhead_child(src: Path, mode: str, repeat: int) -> dict:
    """prepare's CPU at 1 worker, memo off, with the BPE core's answers replayed (each chunk's
    ids recorded in a first run), so only what prepare does beside the core is timed: the best
    of ``repeat`` runs, and that run split into parsing, rendering, the duplicate keys and the
    rest (reading, writing, checksums, the tokenizer's start-up)."""
    import sftdata.tokenize.joined as je
    prep, prep_chunk = _prepare_module("run"), _prepare_module("chunk")

    answers: dict = {}
    init = je.JoinedEncoder.__init__

    def replaying(self, *a, **k):
        init(self, *a, **k)
        core = self._encode
        self._encode = lambda text, allowed: answers.get(text) or answers.setdefault(text, core(text, allowed))

    je.JoinedEncoder.__init__ = replaying
    stages: dict = {}

    def timed(name: str, key: str) -> None:
        f = getattr(prep_chunk, name)

        def g(*a, **k):
            c = time.process_time()
            try:
                return f(*a, **k)
            finally:
                stages[key] = stages.get(key, 0.0) + time.process_time() - c
        setattr(prep_chunk, name, g)

    for name, key in (("parse_record", "parse"), ("render_chunk", "render"), ("conversation_keys", "keys")):
        timed(name, key)
    out = Path(f"/tmp/bench_prepare_overhead_{os.getpid()}")
    best: dict = {}
    for run in range(repeat + 1):  # the first run records the core's answers
        stages.clear()
        c = time.process_time()
        prep.prepare([src], out, prep.PrepareOptions(mode=mode, workers=1, memo_mb=0, overwrite=True,
                                                     val_split=0.1 if mode == "chat" else 0.0))
        cpu = time.process_time() - c
        if run and (not best or cpu < best["cpu"]):
            best = {"cpu": cpu, **stages, "rest": cpu - sum(stages.values())}
    shutil.rmtree(out, ignore_errors=True)
    return best


def spin(n: int = 15_000_000) -> None:
    x = 0
    for i in range(n):
        x += i


def spin_scaling() -> float:
    """Throughput of two processes of plain Python against one (2.0 on two idle cores; on
    this shared virtual machine it varies from run to run: ``--spin`` prints several)."""
    def run(k: int) -> float:
        ps = [multiprocessing.Process(target=spin) for _ in range(k)]
        t = time.perf_counter()
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        return time.perf_counter() - t
    return 2 * run(1) / run(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpora", nargs="*", help="CORPUS.jsonl[:chat|tool] (default mode: tool)")
    ap.add_argument("--tree", action="append", type=Path, help="a source tree (default: this checkout)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-scaling", action="store_true", help="skip the 2-worker CPU model")
    ap.add_argument("--spin", action="store_true", help="only measure how two plain Python processes scale here")
    ap.add_argument("--memos", default="0,256", help="--memo-mb values: each has its 1-worker run and its 2-worker "
                    "model (with --wall: its 1- and 2-worker wall times)")
    ap.add_argument("--wall", action="store_true", help="instead: wall time of 1 and 2 workers per tree and "
                    "--memos value, alternated --repeat times, with the load average")
    ap.add_argument("--overhead", action="store_true", help="instead: prepare's CPU beside the core (its answers "
                    "replayed), 1 worker, memo off, best of --repeat per tree, alternated --repeat times, with its "
                    "parts (parse, render, keys, rest)")
    ap.add_argument("--overhead-child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--wall-child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(Path(a.child[0]), a.child[1], Path(a.child[2]), a.child[3] == "1",
                               tuple(float(m) for m in a.child[4].split(",")))))
        return
    if a.overhead_child:
        print(json.dumps(overhead_child(Path(a.overhead_child[0]), a.overhead_child[1], int(a.overhead_child[2]))))
        return
    if a.overhead:
        for spec in a.corpora:
            path, _, mode = spec.partition(":")
            for run in range(a.repeat):
                for tree in ([t.resolve() for t in a.tree] if a.tree else [HERE.parent]):
                    res = subprocess.run([sys.executable, __file__, "--overhead-child", path, mode or "tool",
                                          str(a.repeat)], capture_output=True, text=True,
                                         env={**os.environ, "PYTHONPATH": str(tree)})
                    if res.returncode:
                        raise SystemExit(res.stderr[-2000:])
                    r = json.loads(res.stdout)
                    parts = ", ".join(f"{k} {r[k]:.2f} ({r[k] / r['cpu']:.0%})" for k in r if k != "cpu")
                    print(f"{Path(path).name} run {run + 1} [{tree}] load {os.getloadavg()[0]:.1f}: beside the core "
                          f"{r['cpu']:.2f} s CPU: {parts}", flush=True)
        return
    if a.wall_child:
        print(json.dumps(wall_child(Path(a.wall_child[0]), a.wall_child[1], int(a.wall_child[2]),
                                    float(a.wall_child[3]))))
        return
    if a.wall:
        for spec in a.corpora:
            path, _, mode = spec.partition(":")
            for run in range(a.repeat):
                for tree in ([t.resolve() for t in a.tree] if a.tree else [HERE.parent]):
                    for memo in a.memos.split(","):
                        got = []
                        for w in (1, 2):
                            res = subprocess.run([sys.executable, __file__, "--wall-child", path, mode or "tool", str(w),
                                                  memo], capture_output=True, text=True,
                                                 env={**os.environ, "PYTHONPATH": str(tree)})
                            if res.returncode:
                                raise SystemExit(res.stderr[-2000:])
                            got.append(json.loads(res.stdout))
                        one, two = got
                        print(f"{Path(path).name} memo {memo} run {run + 1} [{tree}] load {one['load']:.1f}-"
                              f"{two['load']:.1f}: 1 worker {one['wall']:.2f} s, 2 workers {two['wall']:.2f} s "
                              f"({one['wall'] / two['wall']:.2f}x; parent {two['parent_cpu']:.2f} s CPU, workers "
                              f"{two['workers_cpu']:.2f} s)", flush=True)
        return
    if a.spin:
        runs = []
        for _ in range(a.repeat):
            runs.append(spin_scaling())
            print(f"two plain Python processes: {runs[-1]:.2f}x one (load {os.getloadavg()[0]:.1f})", flush=True)
        if len(runs) > 1:
            print(f"median {sorted(runs)[len(runs) // 2]:.2f}x, range {min(runs):.2f}-{max(runs):.2f}x of {len(runs)} runs")
        return
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from bench_prepare import plan_texts, records_of
    from corpus import WORK, message_texts

    from sftdata.chat.tokenizer import load_tokenizer

    tok = load_tokenizer()
    trees = [t.resolve() for t in a.tree] if a.tree else [HERE.parent]
    best: dict = {}
    for spec in a.corpora:
        path, _, mode = spec.partition(":")
        src, mode = Path(path), mode or "tool"
        WORK.mkdir(exist_ok=True)  # a fresh checkout has no _work folder yet
        texts_file = WORK / f"texts_{src.stem}.pkl"
        if not texts_file.exists():
            texts = message_texts(src) if mode == "chat" else [t for r in plan_texts(records_of(src), tok, mode)
                                                                for t in r]
            texts_file.write_bytes(pickle.dumps(texts))
        for _ in range(a.repeat):
            for tree in trees:
                res = subprocess.run([sys.executable, __file__, "--child", str(src), mode, str(texts_file),
                                      "0" if a.no_scaling else "1", a.memos], capture_output=True, text=True,
                                     env={**os.environ, "PYTHONPATH": str(tree)})
                if res.returncode:
                    raise SystemExit(res.stderr[-2000:])
                r = json.loads(res.stdout)
                line = "  ".join(f"{k} {v['ratio']:.3f}x the core ({v['prepare_cpu']:.2f} s CPU)"
                                 for k, v in r.items() if k.startswith("memo"))
                for k, t in r.items():
                    if k.startswith("two_workers"):
                        line += (f"; 2 workers {k[len('two_workers_'):]}: {t['extra_cpu']:+.1%} CPU, serial "
                                 f"{t['serial_cpu']:.2f} s, parent {t['parent_cpu']:.2f} s ({t['parent_ms_per_mb']:.0f} "
                                 f"ms/MB, {t['parent_while_ms_per_mb']:.0f} ms/MB while the workers run, "
                                 f"{t['parent_share']:.1%} of the CPU), workers {t['workers_cpu']:.2f} s, model "
                                 f"{t['model_speedup']:.2f}x")
                        best.setdefault((src.name, k, str(tree)), []).append(t["model_speedup"])
                print(f"{src.name} [{tree}] {line} (load {os.getloadavg()[0]:.1f})", flush=True)
                for k, v in r.items():
                    if k.startswith("memo"):
                        best.setdefault((src.name, k, str(tree)), []).append(v["ratio"])
    print("best CPU ratio (BPE core / prepare) per corpus, memo, tree; two_workers_*: the modelled 1 -> 2 worker "
          "speed-up:")
    for (name, memo, tree), v in sorted(best.items()):
        print(f"  {name:36} {memo:8} {max(v):.3f}  runs {[round(x, 3) for x in v]}  {tree}")


if __name__ == "__main__":
    main()
