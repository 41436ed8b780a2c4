#!/usr/bin/env python3
"""Benchmark: the hostile model files of issue 32, at full size: chat templates that loop,
allocate, recurse or double a string, and tokenizer files that are too large or whose
regex backtracks. Each runs as ``prepare-chat -j 1`` of three short records in a child
process, under a wall-clock limit and an address-space limit (so a run of an older sftdata
cannot take the machine): its outcome (the first line it printed), seconds and peak memory.

    python benchmarks/bench_hostile_models.py [--root CHECKOUT] [--timeout 120] [--limit-gb 6] [--only NAMES]

``--root``: the sftdata checkout to run (default: this one); give an older checkout to
measure before a change, with the same files. The files are made by
tests/helpers/hostile_tokenizers.py and this script (a tiny trained tokenizer with Llama
3's special tokens carries each template).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

TEMPLATES = {
    "x*10M": "{{ 'x' * 10000000 }}",
    "nested range(100000)": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "~ doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
}


def records(path: Path) -> Path:
    rows = [{"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
            for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# a child that runs the command under the limits and reports the command's own peak (RUSAGE_CHILDREN
# of this script would hold the largest of every case so far)
_MEASURE = """
import json, resource, subprocess, sys, time
cap, timeout = int(sys.argv[1]), float(sys.argv[2])
def limit():
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
t = time.perf_counter()
try:
    p = subprocess.run(sys.argv[3:], capture_output=True, timeout=timeout, preexec_fn=limit)
    code, err = p.returncode, p.stderr.decode(errors="replace")
except subprocess.TimeoutExpired:
    code, err = None, ""
print(json.dumps({"code": code, "stderr": err, "seconds": time.perf_counter() - t,
                  "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def measure(root: Path, args: list[str], timeout: float, limit_gb: float, env: dict | None = None,
            cwd: Path | None = None) -> dict:
    """``python -m sftdata ARGS`` from ``root`` under ``limit_gb`` of address space and
    ``timeout`` seconds: its outcome (its last line on stderr), the lines it printed there,
    seconds and peak resident MiB (of it and its workers)."""
    full_env = {**os.environ, "PYTHONPATH": str(root), **(env or {})}
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(int(limit_gb * (1 << 30))), str(timeout),
                          sys.executable, "-m", "sftdata", *args], capture_output=True, env=full_env, check=True,
                         cwd=cwd)  # not this checkout's folder: python -m would import sftdata from there
    res = json.loads(out.stdout)
    err = res["stderr"].strip().splitlines()
    if res["code"] is None:
        outcome = f"still running after {timeout:.0f} s: killed"
    else:
        outcome = f"exit {res['code']}: " + (err[-1] if err else "(nothing on stderr)")
    return {"outcome": outcome, "stderr_lines": len(err), "seconds": round(res["seconds"], 2),
            "peak_mib": round(res["peak_kib"] / 1024)}


def template_folder(folder: Path, prefix: str, preset: str) -> Path:
    from tests.helpers.hostile_tokenizers import big_tokenizer

    return big_tokenizer(folder, merges=200, chat_template=prefix + preset)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--limit-gb", type=float, default=6)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    from sftdata.template import PRESETS
    from tests.helpers.hostile_tokenizers import big_tokenizer, split_tokenizer

    only = {x.strip() for x in a.only.split(",") if x.strip()}
    rows = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        src = records(d / "chats.jsonl")
        cases = []
        for name, text in TEMPLATES.items():
            folder = template_folder(d / f"t{len(cases)}", text, PRESETS["llama3"])
            cases.append((f"template {name}", ["--tokenizer", str(folder)], {}))
        big = big_tokenizer(d / "big", merges=1_500_000, symbols=10)
        size = (big / "tokenizer.json").stat().st_size
        cases.append((f"tokenizer.json {size / 1e6:.0f} MB, 1.5 M merges",
                      ["--tokenizer", str(big), "--chat-template", "llama3"], {}))
        cases.append((f"tokenizer.json {size / 1e6:.0f} MB, 1.5 M merges, caps raised",
                      ["--tokenizer", str(big), "--chat-template", "llama3"],
                      {"SFTDATA_MAX_TOKENIZER_MB": "64", "SFTDATA_MAX_TOKENIZER_MERGES": "2000000"}))
        nested = split_tokenizer(d / "nested", r"(a+)+$")
        cases.append(("Split regex (a+)+$", ["--tokenizer", str(nested), "--chat-template", "llama3"], {}))
        alt = split_tokenizer(d / "alt", r"(a|a)+$")
        long = d / "long.jsonl"
        long.write_text(src.read_text() + json.dumps({"messages": [{"role": "user", "content": "a" * 40 + "b"},
                                                                   {"role": "assistant", "content": "ok"}]}) + "\n")
        cases.append(("Split regex (a|a)+$, one record aaa...ab", ["--tokenizer", str(alt), "--chat-template",
                                                                    "llama3", "-j", "2"], {"RUST_BACKTRACE": "1"}))
        for name, args, env in cases:
            if only and not any(o in name for o in only):
                continue
            out = d / f"out{len(rows)}"
            inp = long if "aaa" in name else src
            r = measure(a.root, ["prepare-chat", str(inp), "-o", str(out), "-j", "1", "-q", *args], a.timeout,
                        a.limit_gb, env, cwd=d)
            rows.append({"case": name, **r})
            print(f"{name:55} {r['seconds']:7.2f} s  peak {r['peak_mib']:6,} MiB  "
                  f"{r['stderr_lines']:4} stderr line(s)  {r['outcome'][:160]}", flush=True)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
