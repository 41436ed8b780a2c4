#!/usr/bin/env python3
"""Prepare a chat SFT dataset (the seed-001 script interface).

    python scripts/prepare_chat_sft.py --input data/conversations.jsonl \
        --output_dir data/chat_sft --val_split 0.1

A thin wrapper over ``sftdata.prepare.prepare`` (the same function as
``sftdata prepare-chat``); prints the summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sftdata.errors import SftDataError  # noqa: E402
from sftdata.prepare import PrepareOptions, default_workers, prepare  # noqa: E402


def main(argv=None, mode: str = "chat") -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, nargs="+", help="JSONL / JSON / .gz input file(s)")
    ap.add_argument("--output_dir", required=True, help="dataset folder to create")
    ap.add_argument("--val_split", type=float, default=0.0, help="fraction of episodes for val")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--max_tokens", type=int, default=None, help="length filter (see sftdata prepare-chat --help)")
    ap.add_argument("--tokenizer", default=None, help="tiktoken name or .tiktoken path (default: bundled cl100k_base)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    opts = PrepareOptions(mode=mode, val_split=a.val_split, seed=a.seed, max_tokens=a.max_tokens,
                          tokenizer=a.tokenizer, workers=a.workers or default_workers(),
                          strict=a.strict, overwrite=a.overwrite)
    try:
        summary = prepare(a.input, a.output_dir, opts)
    except SftDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(json.dumps(summary.as_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
