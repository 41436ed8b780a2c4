#!/usr/bin/env python3
"""Prepare a chat SFT dataset: `sftdata prepare-chat` as a script (underscored options).

    python scripts/prepare_chat_sft.py --input data/conversations.jsonl \
        --output_dir data/chat_sft --val_split 0.1

Same pipeline and options as ``sftdata prepare-chat``; see scripts/prepare_sft_common.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prepare_sft_common import main as _main  # noqa: E402


def main(argv=None) -> int:
    return _main(argv, mode="chat")


if __name__ == "__main__":
    sys.exit(main())
