#!/usr/bin/env python3
"""Benchmark: prepare against tiktoken's BPE core on the same texts, and the memo.

    python benchmarks/bench_prepare.py [--mb 50] [--workers N] [--case generated,agent,real] [--json]
    python benchmarks/bench_prepare.py --case real,real_distinct --real ../shared/data --real-mb 50 --repeat 2

Cases, each measured within one run (ratios; absolute times are noisy on a shared machine):

* ``generated`` (benchmarks/corpus.py, ``--mb``): ``prepare-chat`` at 1 worker and at
  ``--workers`` against reference A, tiktoken ``encode_ordinary_batch(num_threads=1)``, and
  reference B, the BPE core's ``encode_ordinary`` per text, of exactly the message texts;
  peak RSS of a 1-worker run on the corpus and on one 10x smaller.
* ``agent`` (``--agent-mb``): records with a 2,000-token system prompt, 5-20 tool schemas
  drawn from a pool of 40, a short user turn, 1-4 tool calls with short results, a short
  answer. ``prepare-tool`` at 1 worker with the memo (default ``--memo-mb``) and without,
  against the BPE core encoding every text prepare would encode without a memo (each
  message, each call, each record's whole system span), as a tokenizer-only pipeline
  would. Also: the share of tokens in segments seen before, the memo's hit rate and peak
  memory against its cap, and LRU against the frequency policy at small caps (on this
  corpus and on the ``--real`` files when given).
* ``real`` (``--real PATH``, a file or folder of .json/.jsonl records, e.g. ../shared/data):
  a corpus of those records repeated to ``--real-mb`` plus a 10% non-English share;
  ``prepare-tool`` at 1 and 2 workers, memo off and on, against the BPE core on the same
  texts (wall and, at 1 worker, CPU time; the 1 -> 2 worker ratio of every run with the
  load average). The records repeat, so memo-on figures there say little about real
  data; the memo-off ones are the tokenizer-speed figures.
* ``real_distinct``: the same, but every copy after the first has its texts tagged
  (`` (copy N)`` after each message, system string and tool description), so the memo
  can reuse only what the files repeat themselves, never the benchmark's own repetition.
* ``real_once``: the files once (no repetition at all; about 3 MB, so start-up weighs in).

``--repeat N`` runs each timing of the agent and real cases N times, alternated, and keeps
the fastest (the least disturbed on a shared machine).

``run(...)`` returns the same dict ``--json`` prints (benchmarks/run_all.py calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from corpus import WORK, generated_corpus, message_texts, write_agent_corpus, write_real_corpus  # noqa: E402

from sftdata import prepare as prep  # noqa: E402
from sftdata.chat.render import _plan  # noqa: E402
from sftdata.chat.tokenizer import load_tokenizer  # noqa: E402
from sftdata.errors import RecordError  # noqa: E402
from sftdata.prepare import (  # noqa: E402
    PrepareOptions,
    pool,  # noqa: E402
    prepare,
)
from sftdata.records.conversation import parse_record  # noqa: E402
from sftdata.tokenize.memo import DEFAULT_MEMO_MB, SegmentMemo  # noqa: E402

POLICY_CAPS_MIB = [0.02, 0.05, 0.1, 0.25]  # below and around the working set of the corpora here

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork+exec from the (large) parent.
PEAK_SNIPPET = """
import sys
sys.path.insert(0, {root!r})
from sftdata.prepare import PrepareOptions, prepare
prepare([{src!r}], {out!r}, PrepareOptions(workers=1, overwrite=True, val_split=0.1))
print([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0])
"""



def agent_corpus(mb: float, text_scale: float = 1.0) -> Path:
    WORK.mkdir(exist_ok=True)
    path = WORK / (f"agent_{mb:g}mb.jsonl" if text_scale == 1 else f"agent_{mb:g}mb_x{text_scale:g}.jsonl")
    if not path.exists():
        write_agent_corpus(path, int(mb * 1e6), seed=0, text_scale=text_scale)
    return path


def real_corpus(source: Path, mb: float, distinct: bool = False) -> Path:
    """The real records cycled to ``mb`` MB (``distinct``: each copy's texts tagged, so that
    only what the files repeat themselves repeats; 0 MB: the files once)."""
    WORK.mkdir(exist_ok=True)
    path = WORK / f"real_{source.name}_{mb:g}mb{'_distinct' if distinct else ''}.jsonl"
    if not path.exists():
        write_real_corpus(path, source, int(mb * 1e6), distinct_copies=distinct)
    return path


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def peak_rss_mb(src: Path) -> float:
    out = WORK / "peak_out"
    code = PEAK_SNIPPET.format(root=str(HERE.parent), src=str(src), out=str(out))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    shutil.rmtree(out, ignore_errors=True)
    return int(res.stdout.strip().splitlines()[-1]) / 1024


def records_of(path: Path) -> list[bytes]:
    """The records of a JSONL file or a JSON array file, one JSON text each."""
    data = path.read_bytes()
    if path.suffix == ".json":
        return [orjson.dumps(r) for r in orjson.loads(data)]
    return [line for line in data.splitlines() if line.strip()]


def plan_texts(records: list[bytes], tok, mode: str = "tool", split: bool = False) -> list[list[str]]:
    """Per record, the texts prepare encodes (``split``: the system span schema by schema,
    as with the memo; else whole, as a tokenizer-only pipeline encodes it)."""
    out = []
    for i, raw in enumerate(records):
        try:
            conv = parse_record(raw, f"record {i}", mode)
        except RecordError:
            continue
        texts: list[str] = []
        _plan(conv, tok, texts, split)
        out.append(texts)
    return out


def repeated_share(per_record: list[list[str]], tok) -> float:
    """Share of the tokens that lie in a segment (message text, schema) seen before."""
    seen: set[str] = set()
    rep = total = 0
    for texts in per_record:
        for t in texts:
            n = len(tok.encode(t))
            total += n
            if t in seen:
                rep += n
            seen.add(t)
    return rep / total if total else 0.0


def core_seconds(texts: list[str], tok) -> tuple[float, float]:
    """Wall and CPU seconds of the BPE core encoding ``texts`` one by one."""
    core = tok._enc._core_bpe.encode_ordinary
    wall, cpu = time.perf_counter(), time.process_time()
    for t in texts:
        core(t)
    return time.perf_counter() - wall, time.process_time() - cpu


def prepare_seconds(src: Path, **opts) -> tuple[float, float, prep.PrepareSummary]:
    """Wall and CPU seconds (this process's: the whole run at 1 worker) of a prepare."""
    out = WORK / "out"
    wall, cpu = time.perf_counter(), time.process_time()
    summary = prepare([src], out, PrepareOptions(overwrite=True, **opts))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    shutil.rmtree(out, ignore_errors=True)
    return wall, cpu, summary


def policy_sweep(per_record: list[list[str]], tok, caps_mib: list[float]) -> dict:
    """Hit rate and share of tokens not re-encoded per policy and cap, feeding the memo
    chunk by chunk as prepare does (``CHUNK_RECORDS`` records or about ``CHUNK_BYTES``)."""
    chunks, cur, size = [], [], 0
    for texts in per_record:
        cur.extend(texts)
        size += sum(len(t) for t in texts) + 64
        if size >= pool.CHUNK_BYTES or len(cur) >= pool.CHUNK_RECORDS:
            chunks.append(cur)
            cur, size = [], 0
    chunks += [cur] if cur else []
    out = {}
    for cap in caps_mib:
        for policy in ("frequency", "lru"):
            memo = SegmentMemo(tok, int(cap * (1 << 20)), policy)
            for chunk in chunks:
                memo.encode(chunk, tok)
            st = memo.stats
            out[f"{cap:g}MiB/{policy}"] = {"hit_rate": round(st.hit_rate, 4), "reused_share": round(st.reused_share, 4),
                                           "peak_mib": round(memo.peak_bytes / (1 << 20), 3)}
    return out


def case_generated(mb: float, workers: int, peaks: bool = True) -> dict:
    src = generated_corpus(mb)
    texts = message_texts(src)
    tok = load_tokenizer()
    enc = tok._enc
    n_tokens = sum(len(x) for x in enc.encode_ordinary_batch(texts[:1000], num_threads=1))
    ref_batch = timed(lambda: enc.encode_ordinary_batch(texts, num_threads=1))
    ref_core, ref_core_cpu = core_seconds(texts, tok)
    runs = {w: prepare_seconds(src, workers=w, val_split=0.1) for w in sorted({1, workers})}
    results = {w: r[0] for w, r in runs.items()}
    mb_real = src.stat().st_size / 1e6
    report = {
        "corpus_mb": round(mb_real, 1), "messages": len(texts), "sample_tokens": n_tokens,
        "ref_encode_ordinary_batch_s": round(ref_batch, 3), "ref_core_encode_s": round(ref_core, 3),
        "prepare_s": {str(k): round(v, 3) for k, v in results.items()},
        "ratio_vs_encode_ordinary_batch": {str(k): round(ref_batch / v, 3) for k, v in results.items()},
        "ratio_vs_core_encode": {str(k): round(ref_core / v, 3) for k, v in results.items()},
        "cpu_s": {"ref_core": round(ref_core_cpu, 3), "1": round(runs[1][1], 3)},  # 1 worker runs in this process
        "cpu_ratio_vs_core_1_worker": round(ref_core_cpu / runs[1][1], 3),
        "cores": len(os.sched_getaffinity(0)), "load_average": round(os.getloadavg()[0], 2),
    }
    if peaks:
        small = generated_corpus(mb / 10)
        peak_small, peak_big = peak_rss_mb(small), peak_rss_mb(src)
        report["peak_rss_mb"] = {f"{small.stat().st_size / 1e6:.0f}MB": round(peak_small, 1),
                                 f"{mb_real:.0f}MB": round(peak_big, 1)}
        report["peak_growth_10x_input"] = round(peak_big / peak_small, 3)
    return report


def best(fn, repeat: int):
    """The fastest of ``repeat`` runs of ``fn`` (returning (seconds, ...)): on a shared
    machine the fastest run is the one least disturbed."""
    return min((fn() for _ in range(max(1, repeat))), key=lambda r: r[0])


def case_agent(mb: float, real: Path | None = None, memo_mb: float = DEFAULT_MEMO_MB, repeat: int = 1,
               text_scale: float = 1.0) -> dict:
    src = agent_corpus(mb, text_scale)
    tok = load_tokenizer()
    records = records_of(src)
    whole = plan_texts(records, tok)
    texts = [t for r in whole for t in r]
    ref, on, off = [], [], []
    for _ in range(max(1, repeat)):  # alternated, so that each sees the same machine
        ref.append(core_seconds(texts, tok))
        on.append(prepare_seconds(src, mode="tool", workers=1, memo_mb=memo_mb))
        off.append(prepare_seconds(src, mode="tool", workers=1, memo_mb=0))
    ref.append(core_seconds(texts, tok))
    # the fastest of each, by wall time and by CPU time (steadier on a shared machine)
    ref_s, on_s, off_s = (min(r[0] for r in x) for x in (ref, on, off))
    ref_c, on_c, off_c = (min(r[1] for r in x) for x in (ref, on, off))
    s_on = on[0][2]
    split = plan_texts(records, tok, split=True)
    m = s_on.memo
    report = {
        "corpus_mb": round(src.stat().st_size / 1e6, 1), "records": len(records), "texts": len(texts),
        "repeated_token_share": round(repeated_share(split, tok), 4),
        "ref_core_encode_s": round(ref_s, 3), "prepare_memo_s": round(on_s, 3), "prepare_no_memo_s": round(off_s, 3),
        "ratio_memo_vs_core": round(ref_s / on_s, 3), "ratio_no_memo_vs_core": round(ref_s / off_s, 3),
        "memo_speedup": round(off_s / on_s, 3),
        "cpu_s": {"ref_core": round(ref_c, 3), "prepare_memo": round(on_c, 3), "prepare_no_memo": round(off_c, 3)},
        "cpu_ratio_memo_vs_core": round(ref_c / on_c, 3), "cpu_ratio_no_memo_vs_core": round(ref_c / off_c, 3),
        "memo": s_on.memo_dict(), "memo_cap_mib": memo_mb,
        "memo_within_cap": m.peak_bytes <= int(memo_mb * (1 << 20)),
        "policies": {"agent": policy_sweep(split, tok, POLICY_CAPS_MIB)},
    }
    if real is not None:
        files = sorted(p for p in real.iterdir() if p.suffix in (".json", ".jsonl")) if real.is_dir() else [real]
        recs = [r for f in files for r in records_of(f)]
        per = plan_texts(recs, tok, split=True)
        report["policies"]["real"] = policy_sweep(per, tok, POLICY_CAPS_MIB)
        report["real_repeated_token_share"] = {f.name: round(repeated_share(plan_texts(records_of(f), tok, split=True),
                                                                            tok), 4) for f in files}
    return report


def case_real(source: Path, mb: float, repeat: int = 1, distinct: bool = False) -> dict:
    src = real_corpus(source, mb, distinct)
    tok = load_tokenizer()
    texts = [t for r in plan_texts(records_of(src), tok) for t in r]
    refs, runs, loads = [], {}, []
    for _ in range(max(1, repeat)):  # alternated, so that each sees the same machine
        refs.append(core_seconds(texts, tok))
        loads.append(round(os.getloadavg()[0], 2))
        for workers in (1, 2):
            for memo_mb in (0, DEFAULT_MEMO_MB):
                runs.setdefault(f"{workers}w_memo{memo_mb:g}", []).append(
                    prepare_seconds(src, mode="tool", workers=workers, memo_mb=memo_mb))
    refs.append(core_seconds(texts, tok))
    ref, ref_cpu = min(r[0] for r in refs), min(r[1] for r in refs)
    secs = {k: round(min(r[0] for r in v), 3) for k, v in runs.items()}
    cpu = {k: round(min(r[1] for r in v), 3) for k, v in runs.items() if k.startswith("1w")}  # workers: elsewhere
    scaling_runs = {f"memo{m:g}": [round(a[0] / b[0], 3) for a, b in zip(runs[f"1w_memo{m:g}"], runs[f"2w_memo{m:g}"])]
                    for m in (0, DEFAULT_MEMO_MB)}
    return {"corpus_mb": round(src.stat().st_size / 1e6, 1), "distinct_copies": distinct, "texts": len(texts),
            "ref_core_encode_s": round(ref, 3), "prepare_s": secs, "ratio_vs_core": {k: round(ref / v, 3)
                                                                                      for k, v in secs.items()},
            "cpu_s": {"ref_core": round(ref_cpu, 3), **cpu},
            "cpu_ratio_vs_core": {k: round(ref_cpu / v, 3) for k, v in cpu.items()},
            "scaling_1_to_2_workers": {m: round(secs[f"1w_memo{m:g}"] / secs[f"2w_memo{m:g}"], 3)
                                       for m in (0, DEFAULT_MEMO_MB)},
            "scaling_per_run": scaling_runs, "load_average_per_run": loads,
            "memo_hit_rate": round(runs[f"1w_memo{DEFAULT_MEMO_MB:g}"][0][2].memo.hit_rate, 4),
            "memo_reused_share": round(runs[f"1w_memo{DEFAULT_MEMO_MB:g}"][0][2].memo.reused_share, 4)}


def run(cases=("generated",), mb: float = 50.0, workers: int | None = None, agent_mb: float = 20.0,
        real: str | Path | None = None, real_mb: float = 50.0, peaks: bool = True, repeat: int = 1,
        agent_text_scale: float = 1.0) -> dict:
    """The figures of the cases asked for; the generated case's at the top level (as
    before), the others under their names."""
    workers = workers or len(os.sched_getaffinity(0))
    real = Path(real) if real else None
    report: dict = {}
    if "generated" in cases:
        report.update(case_generated(mb, workers, peaks))
    if "agent" in cases:
        report["agent"] = case_agent(agent_mb, real, repeat=repeat, text_scale=agent_text_scale)
    for case in ("real", "real_distinct", "real_once"):
        if case in cases:
            if real is None:
                raise SystemExit(f"--case {case} needs --real PATH (a file or folder of .json/.jsonl records)")
            report[case] = case_real(real, 0 if case == "real_once" else real_mb, repeat, case != "real")
    return report


def print_report(r: dict) -> None:
    if "prepare_s" in r:
        mb = r["corpus_mb"]
        print(f"generated chat: {mb} MB, {r['messages']:,} messages")
        print(f"  reference A  encode_ordinary_batch(num_threads=1): {r['ref_encode_ordinary_batch_s']:6.2f} s")
        print(f"  reference B  core encode_ordinary per text:         {r['ref_core_encode_s']:6.2f} s")
        for w, secs in r["prepare_s"].items():
            print(f"  prepare-chat --workers {w}: {secs:6.2f} s  ratio vs A {r['ratio_vs_encode_ordinary_batch'][w]:4.2f}"
                  f"  vs B {r['ratio_vs_core_encode'][w]:4.2f}")
        print(f"  by CPU time, 1 worker: {r['cpu_ratio_vs_core_1_worker']:4.2f}x the core (load {r['load_average']})")
        if "peak_rss_mb" in r:
            print(f"  peak RSS: {r['peak_rss_mb']} (x{r['peak_growth_10x_input']} for 10x the input)")
    if "agent" in r:
        a = r["agent"]
        print(f"agent data: {a['corpus_mb']} MB, {a['records']:,} records, {a['repeated_token_share']:.1%} of tokens "
              f"in repeated segments")
        print(f"  BPE core on every text:      {a['ref_core_encode_s']:6.2f} s")
        print(f"  prepare-tool -j 1, memo:     {a['prepare_memo_s']:6.2f} s  {a['ratio_memo_vs_core']:4.2f}x the core")
        print(f"  prepare-tool -j 1, no memo:  {a['prepare_no_memo_s']:6.2f} s  {a['ratio_no_memo_vs_core']:4.2f}x the core"
              f"  (memo: {a['memo_speedup']:.2f}x faster)")
        print(f"  by CPU time: memo {a['cpu_ratio_memo_vs_core']:4.2f}x the core, no memo "
              f"{a['cpu_ratio_no_memo_vs_core']:4.2f}x")
        m = a["memo"]
        print(f"  memo: {m['hit_rate']:.1%} hits, {m['reused_share']:.1%} of tokens not re-encoded, peak "
              f"{m['peak_mb_per_worker']} MiB of {a['memo_cap_mib']} MiB")
        for corpus_name, sweep in a["policies"].items():
            for k, v in sweep.items():
                print(f"  policy {corpus_name:5} {k:16} hit rate {v['hit_rate']:.3f}  not re-encoded "
                      f"{v['reused_share']:.3f}  peak {v['peak_mib']} MiB")
    for case, what in (("real", "cycled"), ("real_distinct", "cycled, each copy's texts tagged"),
                       ("real_once", "the files once")):
        if case not in r:
            continue
        x = r[case]
        print(f"real conversations ({what}): {x['corpus_mb']} MB, {x['texts']:,} texts; BPE core "
              f"{x['ref_core_encode_s']:.2f} s; memo: {x['memo_hit_rate']:.1%} hits, {x['memo_reused_share']:.1%} of "
              f"tokens not re-encoded")
        for k, secs in x["prepare_s"].items():
            print(f"  prepare-tool {k:12} {secs:6.2f} s  {x['ratio_vs_core'][k]:4.2f}x the core")
        print(f"  by CPU time (1 worker): {x['cpu_ratio_vs_core']}")
        print(f"  1 -> 2 workers: {x['scaling_1_to_2_workers']} (fastest of each); per run {x['scaling_per_run']} "
              f"at load averages {x['load_average_per_run']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=50.0, help="generated chat corpus size in MB (default 50)")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--case", default="generated", help="comma-separated: generated, agent, real, real_distinct, "
                                                        "real_once (default: generated)")
    ap.add_argument("--agent-mb", type=float, default=20.0, help="agent corpus size in MB (default 20)")
    ap.add_argument("--agent-text-scale", type=float, default=1.0,
                    help="user turns, tool results and answers this many times longer (a smaller repeated share)")
    ap.add_argument("--real", type=Path, help="a file or folder of real .json/.jsonl records (e.g. ../shared/data)")
    ap.add_argument("--real-mb", type=float, default=50.0, help="real corpus size in MB (default 50)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each timing in the agent and real cases, "
                                                          "alternated; the fastest is kept (default 1)")
    ap.add_argument("--no-peaks", action="store_true", help="skip the peak-RSS runs of the generated case")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    r = run(tuple(a.case.split(",")), a.mb, a.workers, a.agent_mb, a.real, a.real_mb, not a.no_peaks, a.repeat,
            a.agent_text_scale)
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        print_report(r)


if __name__ == "__main__":
    main()
