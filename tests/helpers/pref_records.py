"""Preference, KTO and RL prompt records for the tests of prepare-pref's workers and engines."""

from __future__ import annotations


def tree_bytes(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def pair(i: int) -> dict:
    return {"prompt": [{"role": "user", "content": f"question number {i} " + "and more " * (i % 5)}],
            "chosen": [{"role": "assistant", "content": f"the right answer to {i}"}],
            "rejected": [{"role": "assistant", "content": f"a wrong answer, not {i}" + "!" * (i % 3)}]}


def pair_rows(n: int) -> list:
    rows = [pair(i) for i in range(n)]
    rows[4] = {"bad": 1}  # rejected: not a preference record
    rows[9] = pair(2)  # an exact duplicate of record 2
    return rows


def kto_rows(n: int) -> list:
    return [{"prompt": [{"role": "user", "content": f"q {i}"}], "completion": [{"role": "assistant",
             "content": f"answer {i}"}], "label": i % 3 != 0} for i in range(n)]


def prompt_rows(n: int) -> list:
    return [{"prompt": [{"role": "user", "content": f"what is {i} + {i}?"}], "answer": 2 * i,
             "meta": {"id": f"p{i}", "w": 1.50}} for i in range(n)]


def mixed_rows(n: int, kto_at: tuple) -> list:
    """``n`` pairs but, at each record of ``kto_at``, the same KTO row (its copies: exact duplicates)."""
    kto = kto_rows(2)[1]
    return [kto if i in kto_at else pair(i) for i in range(n)]
