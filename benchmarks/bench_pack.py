"""Benchmark: bfd packing time and fill against the lower bound, and against peers
measured in the same run: TRL's ``pack_dataset(..., strategy="bfd")`` (the packer users
of Hugging Face trainers run; ``benchmarks/install_peers.sh`` installs it) and a
pure-Python best-fit over a segment tree.

    python benchmarks/bench_pack.py              # 1M lognormal lengths, rows of 2049
    python benchmarks/bench_pack.py --n 10000000 --no-reference
    python benchmarks/bench_pack.py --quick      # 100k lengths (reference too)
    python benchmarks/bench_pack.py --no-reference --pipeline

TRL is timed two ways on the same lengths. ``pack_dataset`` itself, on a
``datasets.Dataset`` whose ``input_ids`` lists have those lengths and hold no bytes (Arrow
``null`` values): over the whole dataset at once (its best rows) and with ``map``'s default
batches of 1,000 examples (what it does unless told otherwise: each batch packed on its
own). It needs about 12 KB of memory per episode even so (20 bytes per token), so from
``--trl-max`` episodes (default 300,000) only its planning is timed: its own
``_SegmentTree`` and the placement loop of its ``_pack_bfd``, unchanged, which give the
same rows. sftdata's time is ``plan_bfd``, best of ``--repeat``.

Real lengths: when /work/shared/data (or --data DIR) holds conversation files, they are
prepared with sftdata into a temporary folder and their episode lengths packed too.
``--pipeline`` times the whole ``pack`` (read, mask per segment, write), bfd and stream,
on a synthetic episodes dataset (best of ``--repeat`` runs).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections import defaultdict, deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sftdata.chat.masking import loss_mask  # noqa: E402
from sftdata.chat.tokenizer import load_tokenizer  # noqa: E402
from sftdata.pack import PackOptions, pack  # noqa: E402
from sftdata.packing.plan import padding_baseline  # noqa: E402
from sftdata.packing.strategies import plan_bfd  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from sftdata.store import TOKENIZER_FILE, open_dataset  # noqa: E402
from sftdata.store.writer import DatasetWriter  # noqa: E402


class SegmentTree:
    """Leftmost leaf >= s over capacities 1..n; leaf value = capacity if a bin has it."""

    def __init__(self, n: int):
        self.size = 1 << max(1, (n).bit_length())
        self.tree = [0] * (2 * self.size)

    def set(self, i: int, value: int) -> None:
        i += self.size
        self.tree[i] = value
        i //= 2
        while i:
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])
            i //= 2

    def find(self, s: int) -> int:
        if self.tree[1] < s:
            return -1
        i = 1
        while i < self.size:
            i = 2 * i if self.tree[2 * i] >= s else 2 * i + 1
        return i - self.size


def reference_bfd(lengths: np.ndarray, row_len: int) -> int:
    """Pure-Python best-fit decreasing over a segment tree; returns the number of rows."""
    tree = SegmentTree(row_len)
    bins: dict[int, list[int]] = {}
    nbins = 0
    for s in sorted(lengths.tolist(), reverse=True):
        cap = tree.find(s)
        if cap < 0:
            b, cap = nbins, row_len
            nbins += 1
        else:
            b = bins[cap].pop()
            if not bins[cap]:
                tree.set(cap, 0)
        rest = cap - s
        if rest > 0:
            if not bins.get(rest):
                bins[rest] = []
                tree.set(rest, rest)
            bins[rest].append(b)
    return nbins


def lognormal_lengths(n: int, median: float = 350.0, sigma: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(1, np.round(rng.lognormal(math.log(median), sigma, n))).astype(np.int64)


def best_of(fn, repeat: int):
    best, out = math.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def ours_bfd(lengths: np.ndarray, row_len: int, repeat: int = 3) -> dict:
    """sftdata's plan: rows, fill, seconds and CPU seconds (best of ``repeat`` each; CPU
    time is steadier on a loaded machine, and planning is one thread), the lower bound."""
    cpu = math.inf
    for _ in range(repeat):
        c = time.process_time()
        plan_bfd(lengths, row_len, "truncate", seed=0)
        cpu = min(cpu, time.process_time() - c)
    secs, plan = best_of(lambda: plan_bfd(lengths, row_len, "truncate", seed=0), repeat)
    return {"rows": plan.num_rows, "fill": plan.fill, "seconds": secs, "cpu_seconds": cpu,
            "bound": plan.lower_bound_rows}


def trl_bfd(lengths: np.ndarray, row_len: int, batch_size: int | None = None) -> dict | None:
    """TRL's ``pack_dataset(strategy="bfd")`` on a dataset of lists of these lengths: rows,
    fill, seconds; ``batch_size`` None packs the whole dataset at once (``map``'s
    ``batch_size=None``), else batches of that many examples. None if TRL is missing."""
    try:
        import datasets
        import pyarrow as pa
        from trl import pack_dataset
    except ImportError:
        return None
    datasets.disable_progress_bars()
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.nulls(int(offsets[-1])))
    ds = datasets.Dataset(datasets.table.InMemoryTable(pa.table({"input_ids": column})))
    t = time.perf_counter()
    packed = pack_dataset(ds, row_len, "bfd", map_kwargs={"batch_size": batch_size, "keep_in_memory": True})
    secs = time.perf_counter() - t
    rows = len(packed)
    return {"rows": rows, "fill": int(np.minimum(lengths, row_len).sum()) / (rows * row_len), "seconds": secs}


def trl_plan(lengths: np.ndarray, row_len: int) -> dict | None:
    """TRL's bfd planning alone: its ``_SegmentTree`` and the placement loop of its
    ``_pack_bfd`` (the same statements, over the same numpy values), without moving any
    token. Rows, fill, seconds; None if TRL is missing."""
    try:
        from trl.data_utils import _SegmentTree
    except ImportError:
        return None
    clipped = np.minimum(lengths[lengths > 0], row_len)
    t, c = time.perf_counter(), time.process_time()
    order = np.argsort(-clipped, kind="stable")  # TRL: sort("descending") of (length, id), ties by id
    segment_tree = _SegmentTree(row_len)
    segment_tree.add(row_len)
    space_to_bin = defaultdict(deque)
    bins: list[dict] = []
    for length, idx in zip(clipped[order], order):
        space = segment_tree.search(length)
        if space < row_len:
            bin = space_to_bin[space].popleft()
        else:
            bin = {"ids": [], "length": 0}
            bins.append(bin)
        bin["ids"].append(idx)
        bin["length"] += length
        if space < row_len and not space_to_bin[space]:
            segment_tree.remove(space)
        space = space - length
        space_to_bin[space].append(bin)
        if space > 0:
            segment_tree.add(space)
    secs, cpu = time.perf_counter() - t, time.process_time() - c
    return {"rows": len(bins), "fill": int(clipped.sum()) / (len(bins) * row_len), "seconds": secs, "cpu_seconds": cpu}


def compare_lengths(lengths: np.ndarray, row_len: int, repeat: int = 3, trl: bool = True,
                    trl_max: int = 300_000) -> dict:
    """sftdata's bfd and TRL's on the same lengths: {"ours", "trl", "trl_batched",
    "trl_how"}. Below ``trl_max`` episodes ``trl`` is ``pack_dataset`` over the whole
    dataset and ``trl_batched`` in its default batches of 1,000 (``trl_how`` "pack_dataset");
    from there ``trl`` is its planning loop alone and ``trl_batched`` None ("planning").
    The TRL ones are None when not run or not installed."""
    out = {"episodes": int(lengths.size), "row_len": row_len, "ours": ours_bfd(lengths, row_len, repeat),
           "trl": None, "trl_batched": None, "trl_how": None}
    if trl and lengths.size < trl_max:
        out["trl"] = trl_bfd(lengths, row_len)
        if out["trl"] is not None:
            out["trl_batched"] = trl_bfd(lengths, row_len, 1000)
            out["trl_how"] = "pack_dataset"
    elif trl:
        out["trl"] = trl_plan(lengths, row_len)
        out["trl_how"] = "planning" if out["trl"] is not None else None
    return out


def line(name: str, rows: int, bound: int, seconds: float | None, fill: float) -> str:
    t = f"{seconds:8.3f} s" if seconds is not None else " " * 10
    return f"  {name:<34} {t}  rows {rows:>9,}  bound/rows {bound / rows:.5f}  fill {fill:.4%}"


def bench_lengths(label: str, lengths: np.ndarray, row_len: int, reference: bool, repeat: int,
                  trl: bool = True, trl_max: int = 300_000) -> None:
    print(f"{label}: {lengths.size:,} episodes, median {int(np.median(lengths))}, mean {lengths.mean():.0f}, "
          f"rows of {row_len}, {int((lengths > row_len).sum()):,} longer than a row")
    res = compare_lengths(lengths, row_len, repeat, trl, trl_max)
    ours, bound = res["ours"], res["ours"]["bound"]
    secs = ours["seconds"]
    print(line("sftdata bfd (histogram)", ours["rows"], bound, secs, ours["fill"]))
    whole = "TRL pack_dataset bfd (whole)" if res["trl_how"] == "pack_dataset" else "TRL bfd planning loop"
    for key, name in (("trl", whole), ("trl_batched", "TRL pack_dataset bfd (batches)")):
        if res[key] is not None:
            r = res[key]
            print(line(name, r["rows"], bound, r["seconds"], r["fill"]))
            print(f"  -> {r['seconds'] / secs:.1f}x faster than {name}, rows {ours['rows'] / r['rows']:.5f}x its rows")
    pad_rows, pad_fill = padding_baseline(lengths, row_len)
    print(line("padding baseline (1 episode/row)", pad_rows, bound, None, pad_fill))
    if reference:
        clipped = np.minimum(lengths, row_len)
        t = time.perf_counter()
        ref_rows = reference_bfd(clipped, row_len)
        ref_secs = time.perf_counter() - t
        print(line("reference: Python segment-tree BFD", ref_rows, bound, ref_secs,
                   int(clipped.sum()) / (ref_rows * row_len)))
        print(f"  -> {ref_secs / secs:.1f}x faster than the reference, same rows: {ref_rows == ours['rows']}")


def real_lengths(data: Path, tmp: Path) -> np.ndarray | None:
    out = []
    for mode, pattern in (("chat", "kto_en_demo.json"), ("chat", "dummy_conversation.json"),
                          ("tool", "glaive_toolcall_en_demo.json"),
                          ("tool", "datagen-ToolUse-FineTuneSupervised-valid.jsonl")):
        f = data / pattern
        if not f.is_file():
            continue
        try:
            prepare([f], tmp / f.stem, PrepareOptions(mode=mode, workers=1))
        except Exception as e:  # a branch without tool support, an unreadable file: skip it
            print(f"  (skipped {f.name}: {type(e).__name__}: {e})")
            continue
        out.append(open_dataset(tmp / f.stem).split("train").lengths)
    return np.concatenate(out) if out else None


def synthetic_dataset(root: Path, n: int) -> None:
    """An episodes dataset of ``n`` chat episodes with lognormal lengths."""
    tok = load_tokenizer()
    m = tok.ids
    rng = np.random.default_rng(1)
    lengths = np.clip(lognormal_lengths(n, seed=2), 8, 6000)
    ids = rng.integers(0, 100_000, int(lengths.sum())).astype(np.uint32)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    # <|SYSTEM|> ... <|END|> <|USER|> ... <|END|> <|ASSISTANT|> ... <|END|> <|EOS|> per episode
    q = lengths // 4
    for off, marker in ((0, m.system), (1, m.end), (q, m.user), (2 * q - 1, m.end), (2 * q, m.assistant)):
        ids[starts + off] = marker
    ids[ends - 2] = m.end
    ids[ends - 1] = m.eos
    with DatasetWriter(root) as w:
        sw = w.split("train", np.dtype("<u4"))
        sw.add_many(ids, loss_mask(ids, m), lengths, np.arange(n))
        meta = sw.close()
        w.write_json(TOKENIZER_FILE, tok.state())
        w.commit({"kind": "episodes", "token_dtype": "uint32", "tokenizer": tok.summary(), "splits": {"train": meta}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="100k lengths")
    ap.add_argument("--row-len", type=int, default=2049)
    ap.add_argument("--no-reference", action="store_true", help="skip the Python segment-tree reference")
    ap.add_argument("--no-trl", action="store_true", help="skip TRL")
    ap.add_argument("--trl-max", type=int, default=300_000,
                    help="from this many episodes, time TRL's planning loop alone (pack_dataset needs ~12 KB each)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--pipeline", action="store_true", help="time the whole pack on a synthetic dataset")
    ap.add_argument("--pipeline-episodes", type=int, default=100_000)
    args = ap.parse_args()
    n = 100_000 if args.quick else args.n
    bench_lengths("lognormal lengths", lognormal_lengths(n), args.row_len, not args.no_reference, args.repeat,
                  not args.no_trl, args.trl_max)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.data.is_dir():
            lengths = real_lengths(args.data, tmp)
            if lengths is not None:
                for row_len in (513, 1025, 2049):
                    bench_lengths(f"real lengths ({args.data})", lengths, row_len, not args.no_reference, 1,
                                  not args.no_trl)
        if args.pipeline:
            synthetic_dataset(tmp / "syn", args.pipeline_episodes)
            for strategy in ("bfd", "stream"):
                secs, rep = best_of(lambda: pack(tmp / "syn", tmp / f"syn_{strategy}", PackOptions(
                    block_size=args.row_len - 1, strategy=strategy, overwrite=True)), args.repeat)
                r = rep.splits["train"]
                print(f"pipeline ({strategy}): pack of {r.episodes:,} episodes, {r.tokens_in / 1e6:.1f}M tokens -> "
                      f"{r.rows:,} rows in {secs:.2f} s ({r.tokens_in / secs / 1e6:.1f}M tokens/s), fill "
                      f"{r.fill:.4%}, bound/rows {r.bound_ratio:.5f}, trained lost {r.trained_lost:,}")

if __name__ == "__main__":
    main()
