"""The scripts/train.py tests' shared fixture: a dataset a tiny model trains on in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.train import byte_tokenizer, conversations


@pytest.fixture(scope="module")
def byte_ds(tmp_path_factory) -> Path:
    """A dataset of 24 sums prepared with a byte-level tokenizer: scripts/train.py trains a
    tiny model on it in seconds."""
    d = tmp_path_factory.mktemp("byte_ds")
    tokfile = byte_tokenizer(d / "bytes.tiktoken")
    src = d / "chat.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in conversations()))
    prepare([src], d / "chat_sft", PrepareOptions(val_split=0.15, tokenizer=str(tokfile)))
    return d / "chat_sft"
