"""A dataset replaced by a writer at the worst instant of a read, deterministically: inside
the read, on a step the reader always takes (a hook, never a race of two processes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.data import random_conversation

OLD = PrepareOptions(workers=1, val_split=0.25, seed=1, shard_tokens=500)
NEW = PrepareOptions(workers=1, val_split=0.5, seed=2, shard_tokens=800, force=True)  # force: the same build each time


def two_inputs(folder: Path) -> tuple[Path, Path]:
    """20 and 45 seeded conversations: the old dataset's input and the new one's."""
    rng = np.random.default_rng(9)
    few, many = folder / "few.jsonl", folder / "many.jsonl"
    few.write_bytes(b"\n".join(orjson.dumps(random_conversation(rng, i)) for i in range(20)) + b"\n")
    many.write_bytes(b"\n".join(orjson.dumps(random_conversation(rng, i)) for i in range(45)) + b"\n")
    return few, many


def replace_inside(monkeypatch, module, name: str, ds: Path, new_input: Path, times: int = 1) -> list:
    """Make ``module.name`` (a step of a read) replace the dataset at ``ds`` (``prepare
    --overwrite`` of ``new_input``) just before it runs, on its first ``times`` calls; the
    returned list grows by one per replacement."""
    real, replaced = getattr(module, name), []

    def step(*a, **kw):
        if len(replaced) < times:
            replaced.append(True)
            prepare([new_input], ds, NEW)
        return real(*a, **kw)

    monkeypatch.setattr(module, name, step)
    return replaced
