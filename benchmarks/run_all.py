#!/usr/bin/env python3
"""Every benchmark's headline ratio in one table: sftdata against the tools users would
otherwise run (TRL, Hugging Face ``datasets``) and against physical references (the BPE
core, sha256, a memory copy), measured in one run, with the machine and library versions.

    python benchmarks/run_all.py            # full sizes (tens of minutes on 2 cores)
    python benchmarks/run_all.py --quick    # small sizes (a few minutes)
    python benchmarks/run_all.py --smoke    # tiny sizes, no child processes (seconds; the tests run it)
    python benchmarks/run_all.py --json     # the rows and the machine as JSON (--save FILE: as well as the table)
    python benchmarks/run_all.py --only pack,load

Peers are not dependencies of sftdata: ``bash benchmarks/install_peers.sh`` installs them.
A section whose peer is missing is reported as skipped, not failed. Ratios are what to
read (absolute times move with the machine's load); each row's ``command`` reruns its
benchmark alone.

Ratio kinds: ``speed`` = reference time / our time (above 1: ours is faster); ``memory``
= our peak / the reference's peak (below 1: ours needs less); ``rows`` = our rows / the
peer's rows (below 1: ours packs tighter).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

SECTIONS = ("pack", "prepare", "load", "verify", "inputs")
REAL_DATA = Path("/work/shared/data")  # public conversation files, where this machine has them
LIBRARIES = ("numpy", "pyarrow", "orjson", "tiktoken", "tokenizers", "torch", "datasets", "transformers", "trl")
# sizes per mode: lognormal lengths packed, prepare corpus MB (peers / bench_prepare / the HF path),
# loader episodes and timed batches, verify GB, inputs MB
SIZES = {
    "smoke": {"pack": [2_000], "real": False, "prepare_mb": None, "load": (300, 5), "verify_gb": 0.005, "inputs_mb": None},
    "quick": {"pack": [100_000], "real": True, "prepare_mb": (2, 5, 1), "load": (2_000, 20), "verify_gb": 0.1,
              "inputs_mb": 32},
    "full": {"pack": [1_000_000, 10_000_000], "real": True, "prepare_mb": (10, 50, 10), "load": (8_000, 50),
             "verify_gb": 1.0, "inputs_mb": 512},
}


@dataclass
class Row:
    """One line of the table: what was measured, our figure, the reference's, and their ratio."""

    section: str
    what: str
    ours: str
    reference: str
    ratio: float | None  # None: not measured (see ``note``)
    kind: str  # speed | memory | rows
    note: str = ""
    command: str = ""


def machine() -> dict:
    """The machine and the versions of the libraries the figures depend on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) / (1 << 20)
    except (OSError, IndexError, ValueError):
        pass
    versions = {}
    for lib in ("sftdata", *LIBRARIES):
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "memory_gib": round(mem, 1) if mem else None,
            "python": platform.python_version(), "system": f"{platform.system()} {platform.release()}",
            "commit": commit, "versions": versions, "load_average": os.getloadavg()[0]}


def _secs(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 0.1 else f"{s:.2f} s"


def _ratio(r: float | None, kind: str) -> str:
    if r is None or not math.isfinite(r):
        return "-"
    return f"{r:.5f}" if kind == "rows" else f"{r:.2f}x"


def format_table(rows: list[Row], info: dict) -> str:
    """The table as text: a header with the machine, one line per row, the ratio kinds."""
    v = info["versions"]
    libs = ", ".join(f"{k} {v[k]}" for k in LIBRARIES if v.get(k))
    out = [f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, Python {info['python']}, "
           f"{info['system']}, load average {info['load_average']:.1f}",
           f"sftdata {v.get('sftdata')} (commit {info['commit']}); {libs}"]
    cols = [("section", [r.section for r in rows]), ("what", [r.what for r in rows]),
            ("ours", [r.ours for r in rows]), ("reference", [r.reference for r in rows]),
            ("ratio", [_ratio(r.ratio, r.kind) for r in rows]), ("kind", [r.kind for r in rows]),
            ("note", [r.note for r in rows])]
    widths = [max([len(name), *(len(x) for x in vals)]) for name, vals in cols]
    out.append("  ".join(name.ljust(w) for (name, _), w in zip(cols, widths)).rstrip())
    out.append("  ".join("-" * w for w in widths))
    for i in range(len(rows)):
        out.append("  ".join(vals[i].ljust(w) for (_, vals), w in zip(cols, widths)).rstrip())
    out.append("speed = reference time / ours (>1: ours faster); memory = our peak / reference peak (<1: ours "
               "smaller); rows = our rows / peer rows (<1: ours tighter)")
    return "\n".join(out)


# ---- sections: each returns rows ----

def section_pack(sizes: dict) -> list[Row]:
    from bench_pack import compare_lengths, lognormal_lengths, real_lengths

    rows = []
    cases = [(f"{n:,} lognormal lengths", lognormal_lengths(n), f"python benchmarks/bench_pack.py --n {n} --no-reference")
             for n in sizes["pack"]]
    tmp = None
    if sizes["real"] and REAL_DATA.is_dir():
        tmp = tempfile.TemporaryDirectory(prefix="run_all_pack_")
        lengths = real_lengths(REAL_DATA, Path(tmp.name))
        if lengths is not None:
            cases.append((f"real lengths ({lengths.size:,} episodes)", lengths, "python benchmarks/bench_pack.py --quick"))
    try:
        for label, lengths, cmd in cases:
            res = compare_lengths(lengths, 2049, repeat=3)
            ours, trl, batched = res["ours"], res["trl"], res["trl_batched"]
            if trl is None:
                rows.append(Row("pack", f"bfd plan, {label}, rows of 2049", _secs(ours["seconds"]), "TRL missing", None,
                                "speed", "pip install trl datasets", cmd))
                continue
            peer = "TRL pack_dataset" if res["trl_how"] == "pack_dataset" else "TRL's bfd loop"
            if "cpu_seconds" in trl:  # planning against planning, one thread each: CPU time, steadier under load
                ours_txt = f"{_secs(ours['cpu_seconds'])} CPU ({_secs(ours['seconds'])} wall)"
                ref_txt, ratio = f"{peer} {_secs(trl['cpu_seconds'])} CPU", trl["cpu_seconds"] / ours["cpu_seconds"]
            else:
                ours_txt, ref_txt = _secs(ours["seconds"]), f"{peer} {_secs(trl['seconds'])}"
                ratio = trl["seconds"] / ours["seconds"]
            rows.append(Row("pack", f"bfd plan, {label}, rows of 2049", ours_txt, ref_txt, ratio, "speed",
                            f"fill {ours['fill']:.4%}", cmd))
            note = f"TRL in its default batches of 1,000: {batched['rows']:,}" if batched else \
                "TRL's planning alone (pack_dataset: ~12 KB per episode)"
            rows.append(Row("pack", f"rows, {label}", f"{ours['rows']:,}", f"TRL {trl['rows']:,}",
                            ours["rows"] / trl["rows"], "rows", note, cmd))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return rows


def _json_of(cmd: list[str], timeout: float = 3600) -> dict | list:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=env, timeout=timeout)
    if res.returncode:
        raise RuntimeError((res.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(res.stdout)


def section_prepare(sizes: dict) -> list[Row]:
    from bench_prepare_peers import compare

    peers_mb, core_mb, hf_mb = sizes["prepare_mb"]
    workers = len(os.sched_getaffinity(0))
    rows = []
    for path, name in (("tiktoken", "tiktoken cl100k"), ("hf", "Llama 3 tokenizer + template")):
        cmd = f"python benchmarks/bench_prepare_peers.py --mb {peers_mb} --path {path}"
        try:
            r = compare(path, peers_mb, workers)
        except Exception as e:  # a peer that fails is a row that says so, not a lost table
            rows.append(Row("prepare", f"prepare-chat vs datasets.map, {name}", "-", "failed", None, "speed",
                            f"{type(e).__name__}: {str(e)[:80]}", cmd))
            continue
        if r is None:
            rows.append(Row("prepare", f"prepare-chat vs datasets.map, {name}", "-", "peer missing", None, "speed",
                            "bash benchmarks/install_peers.sh", cmd))
            continue
        o, p = r["ours"], r["peer"]
        same = "same tokens and mask" if (o["tokens"], o["trained"]) == (p["tokens"], p["trained"]) else \
            f"tokens differ: {o['tokens']:,} vs {p['tokens']:,}"
        what = f"prepare {r['corpus_mb']} MB, {name}, {workers} workers"
        rows.append(Row("prepare", what + ": time", _secs(o["seconds"]), f"datasets.map {_secs(p['seconds'])}",
                        r["speed_ratio"], "speed", same, cmd))
        rows.append(Row("prepare", what + ": peak memory", f"{o['peak_mib']:.0f} MiB",
                        f"datasets.map {p['peak_mib']:.0f} MiB", r["memory_ratio"], "memory", "PSS of all processes", cmd))
    cmd = f"python benchmarks/bench_prepare.py --mb {core_mb} --json"
    try:
        r = _json_of(["benchmarks/bench_prepare.py", "--mb", str(core_mb), "--json"])
        ratio = r["ratio_vs_core_encode"]["1"]
        rows.append(Row("prepare", f"prepare-chat 1 worker, {r['corpus_mb']} MB generated chat", _secs(r["prepare_s"]["1"]),
                        f"BPE core per text {_secs(r['ref_core_encode_s'])}", ratio, "speed",
                        "tiktoken's core on the same message texts", cmd))
    except Exception as e:
        rows.append(Row("prepare", "prepare-chat vs the BPE core", "-", "failed", None, "speed", str(e)[:80], cmd))
    rows += _prepare_goals(sizes, core_mb)
    cmd = f"python benchmarks/bench_prepare_hf.py --mb {hf_mb} --workers 1 --no-peers --json"
    try:
        r = _json_of(["benchmarks/bench_prepare_hf.py", "--mb", str(hf_mb), "--workers", "1", "--repeat", "2",
                      "--no-peers", "--json"])
        secs, ratios = r["seconds"], r["ratios"]
        key = next(k for k in ratios if k.startswith("tokenizers encode_batch / prepare in-process"))
        rows.append(Row("prepare", f"prepare 1 worker, Llama 3 tokenizer + template, {r['input_mb']} MB",
                        f"{secs['prepare in-process, 1 worker']['cpu']:.2f} s CPU",
                        f"tokenizers encode_batch {secs['tokenizers encode_batch']['cpu']:.2f} s CPU",
                        ratios[key]["cpu"], "speed", f"the rendered texts, 1 thread; engine {r.get('engine')}", cmd))
        core = ratios.get("tokenizers encode_batch / tiktoken core")
        if core:
            rows.append(Row("prepare", "tiktoken's core on the Llama 3 texts (the fast engine's floor)",
                            f"{secs['tiktoken core (fast engine)']['cpu']:.2f} s CPU",
                            f"tokenizers encode_batch {secs['tokenizers encode_batch']['cpu']:.2f} s CPU", core["cpu"],
                            "speed", "same ids", cmd))
    except Exception as e:
        rows.append(Row("prepare", "prepare (Llama 3) vs tokenizers", "-", "failed", None, "speed", str(e)[:80], cmd))
    return rows


def _prepare_goals(sizes: dict, mb: float) -> list[Row]:
    """Issue 16's prepare goals: the tokenizer's start-up, what a prepare doing nothing else
    would reach against the BPE core (the floor), and, on real text, one worker against the
    core by CPU time (memo off and the default memo) and 1 -> 2 workers in wall time."""
    from bench_prepare_floor import STARTUP
    from corpus import generated_corpus

    from sftdata.tokenize.memo import DEFAULT_MEMO_MB

    rows = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = min(float(subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True, env=env,
                                     check=True).stdout) for _ in range(3))
    rows.append(Row("prepare", "tokenizer start-up (cl100k, warm cache)", f"{start:.3f} s CPU", "goal 0.300 s",
                    0.3 / start, "speed", "imports not counted", "python benchmarks/bench_prepare_floor.py CORPUS"))
    corpora = [(generated_corpus(mb), "chat", f"{mb:g} MB generated chat")]
    if sizes["real"] and REAL_DATA.is_dir():
        from bench_prepare import real_corpus

        corpora.append((real_corpus(REAL_DATA, mb, distinct=True), "tool", f"{mb:g} MB real text, copies tagged"))
    for path, mode, label in corpora:
        cmd = f"python benchmarks/bench_prepare_floor.py {path.relative_to(ROOT)}:{mode}"
        try:
            f = _json_of(["benchmarks/bench_prepare_floor.py", f"{path}:{mode}", "--repeat", "2", "--json"])
        except Exception as e:
            rows.append(Row("prepare", f"floor, {label}", "-", "failed", None, "speed", str(e)[:80], cmd))
            continue
        rows.append(Row("prepare", f"prepare-{mode} floor, {label}: start-up + orjson + sha256 only",
                        f"{f['core'] + f['floor']:.2f} s CPU", f"BPE core {f['core']:.2f} s CPU", f["ceiling"], "speed",
                        f"0.9x leaves {f['left_at_0_9']:.2f} s for the records", cmd))
    if len(corpora) > 1:
        cmd = f"python benchmarks/bench_prepare.py --case real_distinct --real {REAL_DATA} --real-mb {mb:g} --json"
        try:
            r = _json_of(["benchmarks/bench_prepare.py", "--case", "real_distinct", "--real", str(REAL_DATA),
                          "--real-mb", str(mb), "--json"])["real_distinct"]
        except Exception as e:
            return rows + [Row("prepare", "prepare-tool, real text", "-", "failed", None, "speed", str(e)[:80], cmd)]
        cpu, secs, label = r["cpu_s"], r["prepare_s"], f"prepare-tool, {r['corpus_mb']:g} MB real text, copies tagged"
        load = f"load {min(r['load_average_per_run']):.1f}"
        for memo, name in ((0, "memo off"), (DEFAULT_MEMO_MB, "default memo")):
            one, two = f"1w_memo{memo:g}", f"2w_memo{memo:g}"
            reused = f"; {r['memo_reused_share']:.0%} of tokens not re-encoded" if memo else ""
            rows.append(Row("prepare", f"{label}, 1 worker, {name}", f"{cpu[one]:.2f} s CPU",
                            f"BPE core {cpu['ref_core']:.2f} s CPU", r["cpu_ratio_vs_core"][one], "speed",
                            "goal 0.9x" + reused, cmd))
            rows.append(Row("prepare", f"{label}, 2 workers against 1, {name}", _secs(secs[two]),
                            f"1 worker {_secs(secs[one])}", r["scaling_1_to_2_workers"][f"{memo:g}"], "speed",
                            f"goal 1.8x; wall time, {load}", cmd))
    return rows


def section_load(sizes: dict) -> list[Row]:
    from bench_loader import compare_with_datasets

    episodes, iters = sizes["load"]
    cmd = f"python benchmarks/bench_loader.py --episodes {episodes}"
    r = compare_with_datasets(episodes, 64, 2048, iters)
    if r is None:
        return [Row("load", "get_batch 64 x 2048", "-", "peer missing", None, "speed", "bash benchmarks/install_peers.sh",
                    cmd)]
    return [Row("load", "batch 64 x 2048 (episodes)", _secs(r["ours_s"]),
                f"datasets + DataCollatorForSeq2Seq {_secs(r['peer_s'])}", r["peer_s"] / r["ours_s"], "speed",
                "one thread, torch tensors", cmd),
            Row("load", "batch 64 x 2048 vs a memory copy", _secs(r["ours_s"]),
                f"numpy copy of {r['batch_mb']:.1f} MB, cache-cold {_secs(r['copy_s'])}", r["copy_s"] / r["ours_s"], "speed",
                "x, y int64 + mask", cmd)]


def section_verify(sizes: dict) -> list[Row]:
    from bench_verify import generate

    from sftdata.store.format import iter_files
    from sftdata.verify import verify

    gb = sizes["verify_gb"]
    with tempfile.TemporaryDirectory(prefix="run_all_verify_") as tmp:
        root = Path(tmp) / "ds"
        generate(root, gb)
        files = list(iter_files(root))
        mb = sum(p.stat().st_size for p in files) / 1e6

        def sha() -> None:
            for p in files:
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)

        sha()  # page cache warm for both
        t_sha = min(_timed(sha) for _ in range(3))
        t_ver = min(_timed(lambda: verify(root)) for _ in range(3))
    return [Row("verify", f"verify with checksums, {mb:,.0f} MB dataset", f"{_secs(t_ver)} ({mb / t_ver:,.0f} MB/s)",
                f"sha256 of the files {_secs(t_sha)}", t_sha / t_ver, "speed", "page cache warm",
                f"python benchmarks/bench_verify.py --gb {gb}")]


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def section_inputs(sizes: dict) -> list[Row]:
    from bench_inputs import format_peaks, write_formats

    mb = sizes["inputs_mb"]
    with tempfile.TemporaryDirectory(prefix="run_all_inputs_") as tmp:
        files = write_formats(Path(tmp), mb, ("jsonl", "parquet", "parquet hf"))
        peaks = format_peaks(files, Path(tmp))
    j = peaks["jsonl"]
    writers = {"parquet": "pyarrow defaults", "parquet hf": "datasets"}  # who wrote the file
    def note(p: dict) -> str:  # the anonymous ratio is a second measure, never the goal's
        anon = f"; anonymous memory alone {p['anon_max_mib'] / j['anon_max_mib']:.2f}x" if "anon_max_mib" in p else ""
        return "goal <= 1.2 (peak RSS)" + anon

    return [Row("inputs", f"prepare-chat -j 1, {mb} MB, Parquet by {writers[name]}: peak memory",
                f"Parquet {p['peak_mib']:.0f} MiB", f"same records as JSONL {j['peak_mib']:.0f} MiB",
                p["peak_mib"] / j["peak_mib"], "memory", note(p),
                f"python benchmarks/bench_inputs.py --mb {mb} --skip-hostile") for name, p in peaks.items()
            if name in writers]


RUNNERS = {"pack": section_pack, "prepare": section_prepare, "load": section_load, "verify": section_verify,
           "inputs": section_inputs}


def run(mode: str, only: tuple[str, ...] = SECTIONS) -> list[Row]:
    """The rows of the sections ``only`` at the sizes of ``mode`` (smoke, quick, full)."""
    sizes = SIZES[mode]
    rows: list[Row] = []
    for name in only:
        if name == "prepare" and sizes["prepare_mb"] is None or name == "inputs" and sizes["inputs_mb"] is None:
            continue  # these run children and take minutes: not in smoke mode
        rows += RUNNERS[name](sizes)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    g.add_argument("--smoke", action="store_true", help="tiny sizes, pack, load and verify only (seconds)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections ({', '.join(SECTIONS)})")
    ap.add_argument("--json", action="store_true", help="print the machine and the rows as JSON")
    ap.add_argument("--save", type=Path, help="also write the JSON to this file")
    a = ap.parse_args(argv)
    only = tuple(s.strip() for s in a.only.split(",") if s.strip())
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    mode = "smoke" if a.smoke else "quick" if a.quick else "full"
    info = machine()
    rows = run(mode, only)
    doc = json.dumps({"mode": mode, "machine": info, "rows": [asdict(r) for r in rows]}, indent=2)
    if a.save:
        a.save.write_text(doc + "\n")
    if a.json:
        print(doc)
    else:
        print(format_table(rows, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
