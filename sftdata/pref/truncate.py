"""One truncation policy for a pair (pure: token counts and arrays in, cut points out).

``--max-length N``: prompt + each completion at most N tokens. ``--max-prompt-length P``:
the prompt at most P tokens (default: N less one, so a completion keeps a token).
``--truncation``:

* ``keep-end`` (default): a prompt over P loses its start, cut where a special token
  begins a run (a turn's first token), so the generation prompt and the turns closest to
  the reply stay whole; both completions are cut at their end to the one budget
  ``N - len(prompt)``;
* ``keep-start``: prompts are never cut (a prompt over P drops the pair:
  ``prompt_too_long``); completions are cut as under keep-end;
* ``drop``: nothing is cut; a pair over either budget is dropped (``too_long``).

A completion's cut never falls inside a run of special tokens (moved back to before the
run), and never leaves it empty: a completion that would keep no trained token drops the
pair (``completion_truncated_to_empty``)::

    prompt   <s> <u> a b c <E> <u> d <E> <a>      --max-prompt-length 5, keep-end: the first
             S   S   T T T  S   S  T  S   S       run start within the last 5 tokens is the
                             ^ cut here           <E> of the first turn: 5 tokens kept
    chosen   x y z <E> \n                         --max-length 8: budget 3, "x y z"
    rejected p q <E>                              the same budget: "p q <E>" (3 tokens)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from ..store.format import TRUNCATION_POLICIES


@dataclass(frozen=True)
class Truncation:
    max_length: int | None = None
    max_prompt_length: int | None = None
    policy: str = "keep-end"

    def validate(self) -> None:
        if self.policy not in TRUNCATION_POLICIES:
            raise UsageError(f"--truncation must be one of {', '.join(TRUNCATION_POLICIES)}, got {self.policy!r}")
        for name, v in (("--max-length", self.max_length), ("--max-prompt-length", self.max_prompt_length)):
            if v is not None and v < 2:
                raise UsageError(f"{name} must be at least 2, got {v}")
        if self.max_length is not None and self.max_prompt_length is not None \
                and self.max_prompt_length >= self.max_length:
            raise UsageError(f"--max-prompt-length {self.max_prompt_length} leaves no token of --max-length "
                             f"{self.max_length} to a completion; make it smaller")

    @property
    def limited(self) -> bool:
        """False when nothing is ever cut (no --max-length or --max-prompt-length)."""
        return self.max_length is not None or self.max_prompt_length is not None

    @property
    def prompt_budget(self) -> int | None:
        if self.max_prompt_length is not None:
            return self.max_prompt_length
        return None if self.max_length is None else self.max_length - 1

    def recorded(self) -> dict:
        return {"max_length": self.max_length, "max_prompt_length": self.max_prompt_length, "policy": self.policy}


@dataclass(frozen=True)
class Cut:
    """Where a pair is cut: the prompt keeps ``prompt_start:``, completion ``i`` keeps
    ``:ends[i]``; ``reason`` set: the pair is dropped, and why."""

    prompt_start: int
    ends: tuple[int, ...]
    reason: str | None = None
    message: str = ""

    @property
    def prompt_cut(self) -> bool:
        return self.prompt_start > 0


def run_starts(special: np.ndarray) -> np.ndarray:
    """Positions where a run of special tokens begins (``special``: bool per token)."""
    s = np.asarray(special, dtype=bool)
    prev = np.concatenate([[False], s[:-1]])
    return np.flatnonzero(s & ~prev)


def _completion_end(special: np.ndarray, budget: int) -> int:
    """The cut of a completion of ``len(special)`` tokens to ``budget``: ``budget``, or
    the start of the special run it would split."""
    n = special.shape[0]
    if n <= budget:
        return n
    end = budget
    while end > 0 and special[end - 1] and special[end]:
        end -= 1
    return end


def plan_cut(prompt_special: np.ndarray, completion_special: list[np.ndarray], completion_masks: list[np.ndarray],
             t: Truncation) -> Cut:
    """The cut of one pair (or KTO row) under ``t``; ``*_special``: bool per token, whether
    it is a special token of the tokenizer."""
    n = prompt_special.shape[0]
    ends = tuple(c.shape[0] for c in completion_special)
    pb = t.prompt_budget
    start = 0
    if pb is not None and n > pb:
        if t.policy != "keep-end":
            return Cut(0, ends, "prompt_too_long", f"the prompt is {n:,} tokens, over the prompt budget of {pb:,} "
                       f"(--max-prompt-length, else --max-length - 1); --truncation {t.policy} does not cut it")
        starts = run_starts(prompt_special)
        ok = starts[(starts >= n - pb) & (starts < n)]
        if ok.size == 0:
            return Cut(0, ends, "prompt_too_long", f"the prompt is {n:,} tokens, and no turn starts within its last "
                       f"{pb:,} (--max-prompt-length), so it cannot be cut at a turn")
        start = int(ok[0])
    if t.max_length is None:
        return Cut(start, ends)
    budget = t.max_length - (n - start)
    if max(ends) <= budget:
        return Cut(start, ends)
    if t.policy == "drop":
        return Cut(start, ends, "too_long", f"prompt + completion is {n + max(ends):,} tokens, over --max-length "
                   f"{t.max_length:,} (--truncation drop)")
    cut = tuple(_completion_end(s, budget) for s in completion_special)
    for i, (e, m) in enumerate(zip(cut, completion_masks)):
        if not m[:e].any():
            return Cut(start, ends, "completion_truncated_to_empty", f"completion {i} would keep no trained token "
                       f"within --max-length {t.max_length:,} after a {n - start:,}-token prompt")
    return Cut(start, cut)
