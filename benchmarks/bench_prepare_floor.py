#!/usr/bin/env python3
"""Benchmark: the floor under ``prepare`` at one worker, against tiktoken's BPE core.

    python benchmarks/bench_prepare_floor.py CORPUS[:chat|tool] [--repeat 3]

Issue 16 asks prepare at one worker, memo off, for 0.9x the BPE core's CPU time on the
same texts. That leaves ``core / 0.9 - core`` (11% of the core) for everything else. Part
of it no implementation can skip, whatever language it is written in; this measures that
part in a fresh process, by CPU time, on the corpus itself:

* the tokenizer's start-up (``load_tokenizer()`` from the warm cache, imports excluded);
* reading the file's lines and ``orjson.loads`` of each (the cheapest JSON parse there is
  in Python: no record is looked at);
* the input's sha256 (the dataset's provenance).

It prints the core's CPU, each part, the ceiling ``core / (core + floor)`` a prepare that did
nothing else would reach, what 0.9x leaves for the work per record (walking the records,
the rendered text and mask, the exact-duplicate key, writing), and what prepare spends on
that now (``prepare - core - floor``, memo off). Texts: the same files
``bench_prepare_cpu.py`` writes (``benchmarks/_work/texts_<corpus>.pkl``). ``--json`` prints
the figures as JSON (``benchmarks/run_all.py`` reads them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

STARTUP = ("import time\nfrom sftdata.chat.tokenizer import load_tokenizer\n"
           "c = time.process_time()\nload_tokenizer()\nprint(time.process_time() - c)")


def cpu(f) -> float:
    c = time.process_time()
    f()
    return time.process_time() - c


def child(src: Path, mode: str, texts_file: Path, repeat: int) -> dict:
    import orjson

    from sftdata.chat.tokenizer import load_tokenizer
    from sftdata.prepare import PrepareOptions, prepare

    texts = pickle.loads(texts_file.read_bytes())
    core = load_tokenizer()._enc._core_bpe.encode_ordinary

    def encode_all() -> None:
        for t in texts:
            core(t)

    def parse() -> None:
        with open(src, "rb") as f:
            for line in f:
                orjson.loads(line)

    def digest() -> None:
        h = hashlib.sha256()
        with open(src, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)

    out = Path(f"/tmp/bench_prepare_floor_{os.getpid()}")

    def run() -> None:
        prepare([src], out, PrepareOptions(mode=mode, workers=1, memo_mb=0, overwrite=True,
                                           val_split=0.1 if mode == "chat" else 0.0))

    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    best: dict = {}
    for _ in range(repeat):
        start = float(subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True,
                                     env=env, check=True).stdout)
        r = {"core": cpu(encode_all), "startup": start, "parse": cpu(parse), "sha256": cpu(digest),
             "prepare": cpu(run)}
        for k, v in r.items():  # the least disturbed of the runs, part by part
            best[k] = min(best.get(k, v), v)
    shutil.rmtree(out, ignore_errors=True)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="?", help="CORPUS.jsonl[:chat|tool] (default mode: tool)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(Path(a.child[0]), a.child[1], Path(a.child[2]), int(a.child[3]))))
        return
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from bench_prepare import plan_texts, records_of
    from corpus import WORK, message_texts

    from sftdata.chat.tokenizer import load_tokenizer

    path, _, mode = a.corpus.partition(":")
    src, mode = Path(path), mode or "tool"
    WORK.mkdir(exist_ok=True)  # a fresh checkout has no _work folder yet
    texts_file = WORK / f"texts_{src.stem}.pkl"
    if not texts_file.exists():
        tok = load_tokenizer()
        texts = message_texts(src) if mode == "chat" else [t for r in plan_texts(records_of(src), tok, mode)
                                                            for t in r]
        texts_file.write_bytes(pickle.dumps(texts))
    load = os.getloadavg()[0]
    res = subprocess.run([sys.executable, __file__, "--child", str(src), mode, str(texts_file), str(a.repeat)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    if res.returncode:
        raise SystemExit(res.stderr[-2000:])
    r = json.loads(res.stdout)
    floor = r["startup"] + r["parse"] + r["sha256"]
    core = r["core"]
    if a.json:
        print(json.dumps({"corpus": src.name, "mb": round(src.stat().st_size / 1e6, 1), "mode": mode, **r,
                          "floor": floor, "ceiling": core / (core + floor), "left_at_0_9": core / 0.9 - core - floor,
                          "prepare_ratio": core / r["prepare"], "load_average": load}))
        return
    print(f"{src.name} ({src.stat().st_size / 1e6:.0f} MB, prepare-{mode}, load {load:.1f}-{os.getloadavg()[0]:.1f}), "
          f"CPU seconds, best of {a.repeat}:")
    print(f"  BPE core on the same texts      {core:6.2f}")
    print(f"  floor: tokenizer start-up       {r['startup']:6.2f}")
    print(f"         lines read + orjson.loads {r['parse']:6.2f}")
    print(f"         sha256 of the input      {r['sha256']:6.2f}")
    print(f"  ceiling with nothing else       {core / (core + floor):6.3f}x the core")
    print(f"  0.9x leaves for the records     {core / 0.9 - core - floor:6.2f}")
    print(f"  prepare (memo off) spends there {r['prepare'] - core - floor:6.2f} "
          f"(prepare {r['prepare']:.2f} = {core / r['prepare']:.3f}x the core)")


if __name__ == "__main__":
    main()
