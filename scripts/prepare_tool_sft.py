#!/usr/bin/env python3
"""Prepare a tool-calling SFT dataset: `sftdata prepare-tool` as a script (underscored options).

    python scripts/prepare_tool_sft.py --input data/tool_conversations.jsonl \
        --output_dir data/tool_sft --val_split 0.1

Same pipeline and options as ``sftdata prepare-tool``; see scripts/prepare_sft_common.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prepare_sft_common import main as _main  # noqa: E402


def main(argv=None) -> int:
    return _main(argv, mode="tool")


if __name__ == "__main__":
    sys.exit(main())
