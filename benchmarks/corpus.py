"""A generated chat corpus for benchmarks: deterministic, realistic shapes.

Multi-turn conversations (1-6 pairs, a system prompt in 40%), message lengths drawn
from a lognormal, text built from English words, numbers, punctuation and some code.
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part model training data loss mask token assistant user system function result value "
    "error file line question answer because however therefore example python numpy array tensor batch"
).split()
CODE = [
    "def f(x):\n    return x * 2\n",
    "for i in range(10):\n    print(i)\n",
    "SELECT name, count(*) FROM users GROUP BY name;",
    "import numpy as np\na = np.zeros((3, 4))\n",
]


def _text(rng: random.Random, mean_words: float) -> str:
    n = max(1, int(rng.lognormvariate(0, 0.8) * mean_words))
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.04:
            out.append(str(rng.randint(0, 100000)))
        elif r < 0.05:
            out.append("\n" + rng.choice(CODE))
        else:
            w = rng.choice(WORDS)
            out.append(w.capitalize() if i == 0 or r > 0.97 else w)
        if rng.random() < 0.08:
            out[-1] += rng.choice([",", ".", "?", "!", ":"])
    return " ".join(out)


def conversation(rng: random.Random) -> dict:
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": _text(rng, 20)})
    for _ in range(rng.randint(1, 6)):
        msgs.append({"role": "user", "content": _text(rng, 40)})
        msgs.append({"role": "assistant", "content": _text(rng, 120)})
    return {"messages": msgs}


def write_corpus(path: Path, target_bytes: int, seed: int = 0) -> int:
    """Write JSONL conversations until ``target_bytes``; return the record count."""
    rng = random.Random(seed)
    n = size = 0
    with open(path, "wb") as f:
        while size < target_bytes:
            line = orjson.dumps(conversation(rng)) + b"\n"
            f.write(line)
            size += len(line)
            n += 1
    return n


def message_texts(path: Path) -> list[str]:
    """Every message text of a corpus, in order (the reference tokenises exactly these)."""
    texts = []
    with open(path, "rb") as f:
        for line in f:
            for m in orjson.loads(line)["messages"]:
                texts.append(m["content"])
    return texts
