#!/usr/bin/env python
"""Prepare a tool-calling SFT dataset (the seed-001 script interface).

    python scripts/prepare_tool_sft.py \
        --input data/tool_conversations.jsonl \
        --output_dir data/tool_sft \
        --val_split 0.1

A thin wrapper over ``sftdata.prepare.prepare`` in tool mode: the same result as
``sftdata prepare-tool INPUT --output-dir OUT --val-split F``. Formats, rendering and
rejection reasons: docs/TOOLS.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from sftdata.errors import SftDataError  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, nargs="+", help="JSONL / JSON array input file(s), optionally .gz")
    p.add_argument("--output_dir", required=True, help="dataset folder to create")
    p.add_argument("--val_split", type=float, default=0.0, help="fraction of episodes for val (default 0)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the train/val split (default 1337)")
    p.add_argument("--max_tokens", type=int, default=None, help="length filter (see docs/TOOLS.md)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad record")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output_dir")
    a = p.parse_args(argv)
    opts = PrepareOptions(mode="tool", val_split=a.val_split, seed=a.seed, max_tokens=a.max_tokens,
                          strict=a.strict, overwrite=a.overwrite)
    try:
        s = prepare(a.input, a.output_dir, opts)
    except SftDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"wrote {a.output_dir}: " + ", ".join(f"{k} {v} episodes / {s.tokens[k]} tokens"
                                                 for k, v in s.episodes.items())
          + f"; trained-token share {s.trained_share:.1%}")
    rejected = sum(s.rejected.values())
    print(f"{s.records_read} records read, {rejected} rejected"
          + (": " + ", ".join(f"{r} {n}" for r, n in s.rejected.items()) if rejected else "")
          + (f" (see {a.output_dir}/rejects.jsonl)" if rejected else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
