"""Benchmark: `sftdata report` on a synthetic dataset of a million episodes: the time to
write the page, its size, and (with Chromium) the time a browser takes to open it.

    python benchmarks/bench_report.py [--episodes 1000000] [--runs 3] [--keep DIR] [--no-browser]

The dataset is generated quickly (vectorised episodes of 1-4 user/assistant pairs with
real marker ids and the mask from ``masking.loss_mask``, two input files, one record in
50 rejected) with ``store.DatasetWriter`` in a temporary folder that is deleted at the end.
Figures are for a warm page cache (the files were just written). The page is opened in
headless Chromium (/usr/bin/chromium, driven by playwright) from a fresh profile each
run; "open" is the time from navigation until every plot is drawn.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_verify import episodes_block  # noqa: E402

from sftdata.chat.masking import loss_mask  # noqa: E402
from sftdata.chat.tokenizer import load_tokenizer  # noqa: E402
from sftdata.report import write_report  # noqa: E402
from sftdata.store.format import REJECTS_FILE, token_dtype_for  # noqa: E402
from sftdata.store.writer import DatasetWriter  # noqa: E402

BLOCK = 8_000  # episodes generated at once (four blocks, reused round robin)
EVERY = 50  # one input record in EVERY is rejected
REASONS = ("invalid_json", "no_assistant_turn", "unknown_role", "too_long")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def generate(target: Path, episodes: int, val: float = 0.01) -> float:
    tok = load_tokenizer()
    dtype = token_dtype_for(tok.vocab_size)
    rng = np.random.default_rng(0)
    blocks = [episodes_block(rng, BLOCK, tok.ids) for _ in range(4)]
    blocks = [(ids, loss_mask(ids, tok.ids), lens) for ids, lens in blocks]
    rejects = episodes // (EVERY - 1)
    records = episodes + rejects
    t0 = time.perf_counter()
    with DatasetWriter(target, overwrite=True) as w:
        writers = {"train": w.split("train", dtype), "val": w.split("val", dtype)}
        done = i = 0
        while done < episodes:
            ids, mask, lens = blocks[i % len(blocks)]
            n = min(lens.size, episodes - done)
            if n < lens.size:
                ids, mask, lens = ids[:int(lens[:n].sum())], mask[:int(lens[:n].sum())], lens[:n]
            name = "val" if i % int(1 / val) == 0 else "train"
            ep = np.arange(done, done + n)
            writers[name].add_many(ids, mask, lens, ep + ep // (EVERY - 1))  # record EVERY * r + EVERY - 1 rejected
            done += n
            i += 1
        splits = {name: sw.close() for name, sw in writers.items()}
        with open(w.path / REJECTS_FILE, "wb") as f:
            for r in range(rejects):
                rec = EVERY * r + EVERY - 1
                src = "chats_a.jsonl" if rec < records // 2 else "chats_b.jsonl"
                f.write(orjson.dumps({"record": rec, "source": src, "where": f"{src}:line {rec + 1}",
                                      "reason": REASONS[r % 4], "message": "synthetic reject"}) + b"\n")
        w.write_json("tokenizer_state.json", tok.state())
        half = records // 2
        w.commit({"kind": "episodes", "token_dtype": dtype.name, "tokenizer": tok.summary(), "splits": splits,
                  "sources": [{"path": "chats_a.jsonl", "first_record": 0, "records": half, "bytes": 0, "sha256": ""},
                              {"path": "chats_b.jsonl", "first_record": half, "records": records - half, "bytes": 0,
                               "sha256": ""}],
                  "options": {"val_split": val},
                  "counts": {"records_read": records, "episodes": episodes,
                             "rejected": {k: len(range(i, rejects, 4)) for i, k in enumerate(REASONS)},
                             "repaired": {"merged_same_role": 1234}}})
    return time.perf_counter() - t0


def open_times(page: Path, runs: int) -> list[float] | None:
    """Seconds from navigation until every plot is drawn, per run (fresh profile each)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path("/usr/bin/chromium").exists():
        return None
    out = []
    with sync_playwright() as p:
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as profile:
                ctx = p.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium", headless=True,
                                                           args=FLAGS, viewport={"width": 1280, "height": 900})
                tab = ctx.new_page()
                tab.goto(page.as_uri())
                tab.wait_for_selector("body[data-ready='1']", timeout=60_000)
                out.append(tab.evaluate("window.sftdataReadyMs") / 1000)
                ctx.close()
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3, help="runs of each measurement (best and median shown)")
    ap.add_argument("--keep", type=Path, default=None, help="write the dataset and the page here and keep them")
    ap.add_argument("--no-browser", action="store_true", help="do not open the page in Chromium")
    ap.add_argument("--block-size", type=int, default=2048)
    args = ap.parse_args()
    tmp = None
    if args.keep:
        root = args.keep
    else:
        tmp = Path(tempfile.mkdtemp(prefix="sftdata-bench-"))
        root = tmp
    ds, page = root / "ds", root / "report.html"
    try:
        gen = generate(ds, args.episodes)
        size = sum(p.stat().st_size for p in ds.rglob("*") if p.is_file())
        print(f"dataset: {args.episodes:,} episodes, {size / 1e9:,.2f} GB, generated in {gen:.1f} s")
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            summary = write_report(ds, page, block_size=args.block_size, sample=8)
            times.append(time.perf_counter() - t0)
        times.sort()
        print(f"write the report: best {times[0]:.2f} s, median {times[len(times) // 2]:.2f} s "
              f"({summary.plots} plots, {len(summary.samples)} sample episodes)")
        print(f"page size: {summary.bytes / 1e6:.2f} MB ({summary.bytes:,} bytes)")
        opened = None if args.no_browser else open_times(page, args.runs)
        if opened is None:
            print("open in a browser: skipped (no playwright or no /usr/bin/chromium)" if not args.no_browser else "")
        else:
            print(f"open in headless Chromium until every plot is drawn: best {opened[0]:.2f} s, "
                  f"median {opened[len(opened) // 2]:.2f} s")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
