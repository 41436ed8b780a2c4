"""For the tests of the fast BPE engine and of verify --retokenize: copies of a tokenizer
folder with its tokenizer.json edited, seeded random Unicode, and the records they prepare.
The trained tokenizer folder itself is the ``trained`` fixture (tests/conftest.py); ``byte_doc``
is a byte-level BPE tokenizer.json built here from its merges."""

from __future__ import annotations

import json
import random
from pathlib import Path

from sftdata.tokenize.fast_bpe import byte_alphabet
from tests.helpers.data import chat

SPLIT = {"type": "Split", "pattern": {"Regex": r"\p{L}+|\p{N}|\s+|[^\s\p{L}\p{N}]+"}, "behavior": "Isolated",
         "invert": False}
LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def byte_doc(merges, extra=()) -> dict:
    """A byte-level BPE tokenizer.json: the 256 byte tokens, then ``extra`` (ids in that order), ``merges``."""
    vocab = {c: i for i, c in enumerate(byte_alphabet())}
    for t in extra:
        vocab[t] = len(vocab)
    return {"model": {"type": "BPE", "vocab": vocab, "merges": merges}, "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT, LEVEL]}}


def edited(src: Path, dst: Path, change) -> Path:
    """A copy of the tokenizer folder ``src`` whose tokenizer.json ``change(doc)`` edits."""
    dst.mkdir(parents=True, exist_ok=True)
    doc = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    change(doc)
    (dst / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    (dst / "tokenizer_config.json").write_text((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    return dst


def random_texts(seed: int, n: int) -> list[str]:
    """Seeded random Unicode: ASCII words and runs of spaces, Latin-1, combining marks, CJK,
    emoji, and the added tokens' strings mixed in."""
    rng = random.Random(seed)
    pieces = ["the", " and", "ing", "tion", "  ", "\n", "\n\n", "\t", " ", "'s", "'LL", "123", "4567", ".", ",!?",
              "<|im_start|>", "<|im_end|>", "<tool_call>", "<|endoftext|>", "<|im"]
    ranges = [(0x20, 0x7E), (0xA0, 0x2FF), (0x300, 0x36F), (0x400, 0x4FF), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
              (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x2000, 0x206F)]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 24)):
            if rng.random() < 0.4:
                parts.append(rng.choice(pieces))
            else:
                lo, hi = rng.choice(ranges)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out



RECORDS = [chat("Hi", "Hello!"), chat("What is 2+2?", "4.", "And 3+3?", "6.", system="Be brief."),
           chat("Naïve café? 日本語 😀", "  spaces\t\ttabs\n\n12345678 ok  "), chat("<|eot_id|> typed", "fine")]
