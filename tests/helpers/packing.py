"""Episodes as the renderer makes them, from marker ids and text ids alone (no tokenizer),
and the rows a packing plan builds from them."""

from __future__ import annotations

import numpy as np

from sftdata.chat.markers import MarkerIds
from sftdata.packing.plan import assemble_rows

M = MarkerIds(system=100277, user=100278, assistant=100279, tool=100280, tool_call=100281, end=100282, eos=100257)
S, U, A, T, E, EOS = M.system, M.user, M.assistant, M.tool, M.end, M.eos
PAD = 7


def episode(*spans, system=None):
    """Render spans like the renderer: [(marker, text ids), ...] then EOS."""
    out = []
    if system is not None:
        out += [S, *system, E]
    for marker, text in spans:
        out += [marker, *text, E]
    return np.array(out + [EOS], dtype=np.int64)


def random_episode(rng, n_pairs=None):
    n_pairs = n_pairs or int(rng.integers(1, 4))
    spans = []
    for _ in range(n_pairs):
        spans.append((U, rng.integers(0, 1000, int(rng.integers(1, 12))).tolist()))
        if rng.random() < 0.3:
            spans.append((A, rng.integers(0, 1000, int(rng.integers(1, 5))).tolist()))
            spans.append((T, rng.integers(0, 1000, int(rng.integers(1, 5))).tolist()))
        spans.append((A, rng.integers(0, 1000, int(rng.integers(1, 12))).tolist()))
    sys = rng.integers(0, 1000, int(rng.integers(1, 6))).tolist() if rng.random() < 0.5 else None
    return episode(*spans, system=sys)


def build(plan, eps, pad=PAD):
    """All rows of a plan, from a list of episode arrays."""
    seg = plan.segments
    toks = [eps[e][s:s + t] for e, s, t in zip(seg.episode, seg.episode_start, seg.take)]
    seg_tokens = np.concatenate(toks) if toks else np.empty(0, np.int64)
    return assemble_rows(plan, 0, plan.num_rows, seg_tokens, M, pad)
