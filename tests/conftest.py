"""Shared fixtures: the tokenizer (built once) and helpers to write small inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sftdata.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def tok():
    return load_tokenizer()


def write_jsonl(path: Path, records) -> Path:
    """Write records (dicts, or raw strings written as they are) one per line."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def chat(*pairs, system=None) -> dict:
    """An OpenAI-format record from (user, assistant, user, assistant, ...) texts."""
    msgs = [{"role": "system", "content": system}] if system else []
    for i, text in enumerate(pairs):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"messages": msgs}
