#!/usr/bin/env python3
"""Benchmark: reading inputs. Speed of each reader, peak memory per input format, and the
hostile inputs of tests/safety/test_adversarial.py at full size.

    python benchmarks/bench_inputs.py [--mb 256] [--bomb-gib 2] [--skip-formats] [--skip-hostile]

1. **Readers** (in-process, no tokenising): MB/s of text read into records for JSONL,
   JSONL.gz, a JSON array, Parquet, and a gzip of blank lines (decompressed MB/s).
2. **Formats** (``prepare-chat -j 1`` in a child, peak RSS): the same ``--mb`` of
   records as JSONL, JSONL.gz, a JSON array and Parquet twice: as pyarrow writes it by
   default (``parquet``: pages of 1,024 rows, 11 MB with these 11 KB rows) and as
   ``datasets``' ``to_parquet`` writes it (``parquet hf``: pages of 256 KiB-1 MiB, row
   groups of about 100 MB; only when ``datasets`` is installed). Most records have no
   assistant turn (rejected after parsing, not tokenised), so the run measures reading,
   not the tokenizer; the issue's goal is Parquet within 1.2x of JSONL's peak.

   The peak is the child's ``ru_maxrss`` (Linux: the largest resident set, anonymous +
   file-backed + shared memory pages, in KiB; what the goal measures). On Linux the
   child is also sampled (``/proc/PID/status`` and, at each new high, ``smaps``): the
   line says the resident set at the sampled peak split into anonymous and file-backed
   pages, how much of it is pages of pyarrow's libraries, and the largest anonymous
   set (a second measure, never the goal's). CPU is the child's user + system time.
3. **Hostile inputs** (``prepare-chat -j 1`` in a child): outcome, peak RSS, seconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sftdata.sources import expand_inputs, inspect_source, iter_all  # noqa: E402
from tests.helpers.hostile import gzip_repeated, record, run_measured  # noqa: E402

WORDS = "the of and to in is you that it he was for on are as with his they I at be this have from".split()


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) + ("\n" if rng.random() < 0.03 else "") for _ in range(n))


def records(target: int, seed: int = 0):
    """Records of about ``target`` bytes in all: 1 in 50 a normal chat, the others a long
    user turn with no assistant turn (rejected by the parser, never tokenised)."""
    rng = random.Random(seed)
    size = i = 0
    while size < target:
        if i % 50 == 0:
            rec = {"messages": [{"role": "user", "content": text(rng, 20)}, {"role": "assistant", "content": text(rng, 40)}]}
        else:
            rec = {"messages": [{"role": "user", "content": text(rng, 3000)}]}
        size += len(json.dumps(rec)) + 1
        i += 1
        yield rec


FORMATS = ("jsonl", "jsonl.gz", "json array", "parquet", "parquet hf")


def write_formats(folder: Path, mb: int, formats=FORMATS) -> dict[str, Path]:
    """The same ``mb`` MB of records in each of ``formats`` (JSONL always)."""
    jsonl = folder / "c.jsonl"
    with open(jsonl, "w") as f:
        for r in records(mb << 20):
            f.write(json.dumps(r) + "\n")
    out = {"jsonl": jsonl}
    if "jsonl.gz" in formats:
        out["jsonl.gz"] = gz = folder / "c.jsonl.gz"
        with open(jsonl, "rb") as src, gzip.open(gz, "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    if "json array" in formats:
        out["json array"] = arr = folder / "c.json"
        with open(jsonl, "rb") as src, open(arr, "wb") as dst:
            dst.write(b"[")
            for k, line in enumerate(src):
                dst.write((b",\n" if k else b"") + line.rstrip(b"\n"))
            dst.write(b"]")
    if "parquet" in formats:
        out["parquet"] = write_parquet(jsonl, folder / "c.parquet")
    if "parquet hf" in formats:
        try:
            out["parquet hf"] = write_parquet_hf(jsonl, folder / "c_hf.parquet")
        except ImportError:
            print("   (no datasets installed: the 'parquet hf' file is left out)")
    return out


def write_parquet(jsonl: Path, pqf: Path) -> Path:
    """The records of ``jsonl`` as a Parquet file (a ``messages`` column of structs, row
    groups of 2,000 rows, pyarrow's defaults otherwise: ``pq.write_table`` makes the same
    pages, 1,024 rows each, in one row group)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    batch = []
    with open(jsonl, "rb") as src:
        for line in src:
            batch.append(json.loads(line)["messages"])
            if len(batch) == 2000:
                t = pa.table({"messages": batch})
                writer = writer or pq.ParquetWriter(pqf, t.schema)
                writer.write_table(t)
                batch = []
    if batch:
        t = pa.table({"messages": batch})
        writer = writer or pq.ParquetWriter(pqf, t.schema)
        writer.write_table(t)
    writer.close()
    return pqf


def write_parquet_hf(jsonl: Path, pqf: Path) -> Path:
    """The records of ``jsonl`` as ``datasets`` writes them (``Dataset.to_parquet`` with its
    defaults: content-defined pages of 256 KiB-1 MiB, row groups of about 100 MB)."""
    import datasets

    datasets.disable_progress_bars()
    cache = pqf.parent / "hf_cache"
    try:
        datasets.Dataset.from_json(str(jsonl), cache_dir=str(cache)).to_parquet(str(pqf))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return pqf


def read_speed(path: Path) -> tuple[float, int]:
    infos = [inspect_source(i) for i in expand_inputs([path])]
    t = time.perf_counter()
    n = sum(1 for _ in iter_all(infos))
    return time.perf_counter() - t, n


def hostile(folder: Path, bomb_gib: int) -> list[tuple[str, Path, list[str], str]]:
    """(name, input, extra options, expected outcome)."""
    out = []
    bomb = folder / "bomb.jsonl.gz"
    gzip_repeated(bomb, record(0) + b'\n{"messages": [{"role": "user", "content": "', b"a" * (1 << 20),
                  1024 * bomb_gib, b'"}, {"role": "assistant", "content": "a"}]}\n')
    out.append((f"gzip bomb: one line of {bomb_gib} GiB ({bomb.stat().st_size >> 10:,} KiB file)", bomb, [],
                "1 record_too_large, 1 episode"))
    blank = folder / "blank.jsonl.gz"
    gzip_repeated(blank, b"", b"\n" * (1 << 20), 1024, record(1) + b"\n")
    out.append(("gzip of 1 Gi blank lines, then a record", blank, [], "1 episode, record number 1,073,741,824"))
    pad = b"p" * ((1 << 20) - 200)
    item = b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "pad": "'
    arr = folder / "array.json.gz"
    gzip_repeated(arr, b"[", item + pad + b'"},\n', 1024, record(9) + b"]")
    out.append(("JSON array of 1 GiB (1,025 items of 1 MiB)", arr, [], "1,025 episodes"))
    cut = folder / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(b"\n".join(record(i) for i in range(100_000)))[:-5000])
    out.append(("truncated .gz", cut, [], "error naming the last complete line"))
    small = [
        ("JSON nested 100,000 deep", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "invalid_json"),
        ("an integer of 10,000 digits", b'{"n": ' + b"9" * 10_000 + b', "messages": []}', "invalid_json"),
        ("NUL byte in a string", record(3).replace(b"question", b"ques\x00tion"), "invalid_json"),
        ("invalid UTF-8", record(4).replace(b"question", b"ques\xfftion"), "invalid_utf8"),
        ("lone surrogate (escaped)", record(5).replace(b"question", b"ques\\ud800tion"), "invalid_json"),
        ("lone surrogate (CESU-8 bytes)", record(6).replace(b"question", b"ques\xed\xa0\x80tion"), "invalid_utf8"),
    ]
    for k, (name, line, reason) in enumerate(small):
        p = folder / f"small{k}.jsonl"
        p.write_bytes(b"\n" * 1100 + line + b"\n" + record(0) + b"\n")
        out.append((name, p, [], f"1 {reason}, 1 episode"))
    return out


STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile")


def _status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of a process (KiB), from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: int(fields[k].split()[0]) for k in STATUS_KEYS}


def _pyarrow_kib(pid: int) -> int:
    """Resident KiB of the mappings of pyarrow's files (its C++ libraries and modules)."""
    kib, mine = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                mine = "/pyarrow/" in line
            elif mine and line.startswith("Rss:"):
                kib += int(line.split()[1])
    return kib


# the child that runs the command: it writes the command's pid, then (when it ends) its exit
# code, peak and CPU. ru_maxrss of a process counts the resident set of the image it was
# forked from until its exec, so the command is started from this small process, never from
# the benchmark (which holds the corpora it wrote and read: its own resident set would be the peak)
_SAMPLED = """
import json, os, resource, subprocess, sys
out = os.fdopen(int(sys.argv[1]), "w")
p = subprocess.Popen(sys.argv[2:])
out.write(f"{p.pid}\\n")
out.flush()
p.wait()
u = resource.getrusage(resource.RUSAGE_CHILDREN)
out.write(json.dumps({"code": p.returncode, "peak_kib": u.ru_maxrss, "cpu": u.ru_utime + u.ru_stime}) + "\\n")
"""


def run_sampled(args: list[str]) -> dict:
    """``python -m sftdata ARGS`` in a child, sampled every few milliseconds: exit code,
    stdout, stderr, seconds, ``cpu`` (user + system), ``peak_mib`` (its ``ru_maxrss``), and
    at the largest sampled resident set its anonymous and file-backed MiB, the MiB of
    pyarrow's files among them, and the largest anonymous MiB sampled."""
    env = {**os.environ, "PYTHONPATH": str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t = time.perf_counter()
    report_r, report_w = os.pipe()
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se, os.fdopen(report_r) as report:
        runner = subprocess.Popen([sys.executable, "-c", _SAMPLED, str(report_w), sys.executable, "-m", "sftdata", *args],
                                  stdout=so, stderr=se, env=env, pass_fds=(report_w,))
        os.close(report_w)
        pid = int(report.readline())
        top, peak, anon_max = 0, {"VmRSS": 0, "RssAnon": 0, "RssFile": 0, "pyarrow": 0}, 0
        while runner.poll() is None:
            try:
                st = _status(pid)
                anon_max = max(anon_max, st["RssAnon"])
                if st["VmRSS"] > top + 512:  # a new high: where its pages are (smaps is slow; not every sample)
                    top = st["VmRSS"]
                    peak = {**st, "pyarrow": _pyarrow_kib(pid)}
            except (OSError, ValueError, KeyError):  # the command has just ended
                pass
            time.sleep(0.005)
        res = json.loads(report.readline())
        so.seek(0), se.seek(0)
        return {"code": res["code"], "stdout": so.read().decode(errors="replace"),
                "stderr": se.read().decode(errors="replace"), "seconds": time.perf_counter() - t,
                "cpu": res["cpu"], "peak_mib": res["peak_kib"] / 1024,
                "anon_mib": peak["RssAnon"] / 1024, "file_mib": peak["RssFile"] / 1024,
                "pyarrow_mib": peak["pyarrow"] / 1024, "anon_max_mib": anon_max / 1024}


def format_peaks(files: dict[str, Path], folder: Path) -> dict[str, dict]:
    """``prepare-chat -j 1`` of each file in a child: peak RSS (MiB), seconds, CPU, outcome,
    and (Linux) the parts of the peak."""
    sampled = sys.platform.startswith("linux") and Path("/proc/self/smaps").exists()
    out = {}
    for name, path in files.items():
        dest = folder / f"out_{name.replace(' ', '_')}"
        args = ["prepare-chat", str(path), "-o", str(dest), "-j", "1", "-q", "--json"]
        res = run_sampled(args) if sampled else run_measured(args)
        out[name] = {**res, "outcome": outcome(res)}
        shutil.rmtree(dest, ignore_errors=True)
    return out


def outcome(res: dict) -> str:
    if res["code"]:
        return res["stderr"].strip().splitlines()[-1][:110]
    s = json.loads(res["stdout"])
    rej = ", ".join(f"{n} {r}" for r, n in s["rejected"].items())
    return f"{s['episodes'].get('train', 0):,} episodes" + (f", rejected: {rej}" if rej else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=256, help="size of the format comparison corpus (default 256)")
    ap.add_argument("--bomb-gib", type=int, default=2, help="decompressed size of the gzip bomb (default 2)")
    ap.add_argument("--skip-formats", action="store_true", help="only the hostile inputs")
    ap.add_argument("--skip-hostile", action="store_true", help="only the readers and the formats")
    a = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_inputs_"))
    try:
        if not a.skip_formats:
            files = write_formats(folder, a.mb)
            text_bytes = files["jsonl"].stat().st_size
            print(f"1. readers: {text_bytes / 1e6:,.0f} MB of records read into raw records, no tokenising")
            for name, path in files.items():
                secs, n = read_speed(path)
                print(f"   {name:12s} {text_bytes / secs / 1e6:8.1f} MB/s of text  ({n:,} records, {secs:.1f} s)")
            blank = folder / "blank_speed.jsonl.gz"
            gzip_repeated(blank, b"", b"\n" * (1 << 20), 1024, record(1) + b"\n")
            secs, _ = read_speed(blank)
            print(f"   {'blank lines':12s} {(1 << 30) / secs / 1e6:8.1f} MB/s of decompressed text (1 GiB of "
                  f"newlines in a {blank.stat().st_size >> 10:,} KiB gzip)")
            load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"2. formats: prepare-chat -j 1, {a.mb} MB of records (2% kept and tokenised; load average {load})")
            peaks = format_peaks(files, folder)
            base = peaks["jsonl"]
            for name, res in peaks.items():
                print(f"   {name:12s} peak {res['peak_mib']:7.1f} MiB ({res['peak_mib'] / base['peak_mib']:.2f}x "
                      f"JSONL)  {res['seconds']:6.1f} s  {res['outcome']}")
                if "cpu" in res:
                    print(f"   {'':12s} CPU {res['cpu']:.2f} s ({res['cpu'] / base['cpu']:.2f}x JSONL); at the peak: "
                          f"anonymous {res['anon_mib']:.1f} MiB, file-backed {res['file_mib']:.1f} MiB (pyarrow's "
                          f"files {res['pyarrow_mib']:.1f}); second measure, largest anonymous set "
                          f"{res['anon_max_mib']:.1f} MiB ({res['anon_max_mib'] / base['anon_max_mib']:.2f}x JSONL's)")
        if a.skip_hostile:
            return
        print("3. hostile inputs: prepare-chat -j 1 (peak RSS of the whole run)")
        for name, path, extra, want in hostile(folder, a.bomb_gib):
            out = folder / "out_h"
            res = run_measured(["prepare-chat", str(path), "-o", str(out), "-j", "1", "-q", "--json", *extra])
            print(f"   {name:48s} peak {res['peak_mib']:5.0f} MiB  {res['seconds']:6.1f} s  {outcome(res)}  "
                  f"(expected: {want})")
            shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
