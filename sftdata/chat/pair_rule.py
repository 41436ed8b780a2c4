"""The mask of a completion that follows a prompt: the dataset's one loss rule, applied to
``prompt + completion``, read on the completion's tokens (the prompt is never trained).

A completion cut by a truncation budget ends inside its reply, which the rule, seeing no
end-of-turn, would leave untrained; the rule is therefore applied with the rule's closing
token appended (``<|END|>``, or the template's first end-of-turn id) and that token
dropped again. A whole completion already ends its reply, so the token changes nothing::

    prompt:      <u> Hi <E> <a>       completion: Hel lo <E> <eos>
    rule over prompt + completion + <E>:    ... 1 | 1 1 1 0 | 0
    stored:      0   0  0   0         completion:   1 1 1 0

Prepare (to write a pair) and verify (to re-derive it) call ``completion_mask``, so the
two cannot disagree about what a pair trains.
"""

from __future__ import annotations

import numpy as np

from .loss_rule import LossRule


def closing_id(rule: LossRule) -> int:
    """The token that closes an open reply under ``rule``."""
    if rule.kind == "markers":
        return int(rule.markers.end)
    return int(rule.rule.end_ids[0])


def completion_mask(rule: LossRule, prompt: np.ndarray, completion: np.ndarray) -> np.ndarray:
    """uint8 mask of ``completion`` after ``prompt`` (module docstring)."""
    n, k = int(prompt.shape[0]), int(completion.shape[0])
    ids = np.concatenate([np.asarray(prompt, dtype=np.int64), np.asarray(completion, dtype=np.int64),
                          np.array([closing_id(rule)], dtype=np.int64)])
    return np.ascontiguousarray(rule.masks(ids, np.array([ids.shape[0]], dtype=np.int64))[n:n + k], dtype=np.uint8)


def completion_masks(rule: LossRule, pieces) -> list[np.ndarray]:
    """``[completion_mask(rule, prompt, completion) for prompt, completion in pieces]`` in
    one call of the rule over every ``prompt + completion + closing`` laid end to end (each
    masked as if alone: ``LossRule.masks``)."""
    if not pieces:
        return []
    close = np.array([closing_id(rule)], dtype=np.int64)
    parts, lengths = [], []
    for prompt, completion in pieces:
        parts += (np.asarray(prompt), np.asarray(completion), close)
        lengths.append(int(prompt.shape[0]) + int(completion.shape[0]) + 1)
    ids = np.concatenate(parts).astype(np.int64, copy=False)
    lengths = np.asarray(lengths, dtype=np.int64)
    mask = rule.masks(ids, lengths)
    ends = np.cumsum(lengths)
    out = []
    for (_, completion), end in zip(pieces, ends.tolist()):
        k = int(completion.shape[0])
        out.append(np.ascontiguousarray(mask[end - 1 - k:end - 1], dtype=np.uint8))
    return out
