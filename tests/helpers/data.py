"""Small inputs written by tests: JSON Lines files, OpenAI-format chats, and seeded random
conversations."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()


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


def random_conversation(rng, i, user_words: int = 30, reply_words: int = 40):
    """Conversation ``i`` of a seeded corpus (``rng``: numpy's Generator): a system message
    for every third, then 1 to 3 turns of 2 to ``user_words`` user words and 2 to
    ``reply_words`` assistant words (upper bounds excluded)."""
    msgs = []
    if i % 3 == 0:
        msgs.append({"role": "system", "content": f"You are helper number {i}."})
    for _t in range(int(rng.integers(1, 4))):
        msgs.append({"role": "user", "content": " ".join(rng.choice(WORDS, int(rng.integers(2, user_words))))})
        msgs.append({"role": "assistant", "content": " ".join(rng.choice(WORDS, int(rng.integers(2, reply_words))))})
    return {"messages": msgs}
