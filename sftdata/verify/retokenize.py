"""``verify --retokenize N``: the ids of N sampled episodes, decoded to text and encoded again
by the ``tokenizers`` library (the reference engine, whatever engine prepared them), must
be the stored ids. Proves on the user's own data that the fast engine gave the library's
ids (an episode is the tokens of one rendered text, encoded once, so decode then encode
gives them back).

The sample is deterministic: ``RandomState(seed).choice(total, N, replace=False)`` over
the episodes of every shard in order (train, then val), sorted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import SftDataError
from ..store.format import TOKENIZER_FILE, TOKENS_FILE, Problem
from ..tokenize import is_hf_state
from ..tokenize.open import hf_tokenizer_from_state

RETOKENIZE_CHECK = {"retokenize": "sampled episodes decoded and re-encoded by the tokenizers library give the "
                                  "stored ids (--retokenize)"}
FIX = ("re-prepare the dataset with --tokenizer-engine hf, and report the tokenizer.json to sftdata: the engines "
       "must never differ")


@dataclass
class Retokenized:
    """What ``--retokenize`` checked: episodes re-encoded, how many differ, the problems, or why it could not run."""

    episodes: int = 0
    differ: int = 0
    seed: int = 0
    problems: list[Problem] = field(default_factory=list)
    skipped: str | None = None

    def as_dict(self) -> dict:
        return {"episodes": self.episodes, "differ": self.differ, "seed": self.seed, "skipped": self.skipped}


def sample_positions(total: int, n: int, seed: int = 0) -> np.ndarray:
    """``min(n, total)`` distinct positions in ``range(total)``, sorted; the same for the same arguments."""
    k = min(max(int(n), 0), int(total))
    if k == 0:
        return np.empty(0, dtype=np.int64)
    return np.sort(np.random.RandomState(seed).choice(int(total), size=k, replace=False)).astype(np.int64)


def retokenize(shards: Sequence, state: dict | None, n: int, seed: int = 0,
               run: Callable[[dict, list], Iterable[Retokenized]] | None = None) -> Retokenized:
    """Re-encode ``n`` sampled episodes of ``shards`` (an episodes dataset's, in order) with
    the tokenizers library; a ``Problem`` for each episode whose ids differ. ``run``:
    re-encodes each shard's sample elsewhere (``--engine ray``), results in shard order."""
    out = Retokenized(seed=seed)
    if not is_hf_state(state):
        out.skipped = "the dataset's tokenizer is a tiktoken encoding with sftdata's markers, not a tokenizer.json"
        return out
    try:
        tok = hf_tokenizer_from_state(state, TOKENIZER_FILE, engine="hf")
    except SftDataError as e:
        out.skipped = f"the tokenizer could not be loaded: {e}"
        return out
    parts = (retokenize_shard(tok, sh, local) for sh, local in sample_by_shard(shards, n, seed)) if run is None \
        else run(state, sample_by_shard(shards, n, seed))
    for part in parts:
        out.episodes += part.episodes
        out.differ += part.differ
        out.problems += part.problems
    return out


def sample_by_shard(shards: Sequence, n: int, seed: int = 0) -> list[tuple]:
    """The sample of ``retokenize``: (shard, its sampled local episode ids) for each shard
    holding some, in shard order; a row dataset's shard: its sampled local row ids."""
    counts = np.array([sh.num_items // sh.entries for sh in shards], dtype=np.int64)
    ends = np.cumsum(counts)
    pos = sample_positions(int(ends[-1]) if counts.size else 0, n, seed)
    which = np.searchsorted(ends, pos, side="right")
    return [(shards[i], pos[which == i] - (int(ends[i - 1]) if i else 0)) for i in np.unique(which).tolist()]


def sequences(sh, loc: int) -> list[tuple[str, np.ndarray]]:
    """What ``--retokenize`` re-encodes of item ``loc`` of ``sh``, each the ids of one text
    encoded once, and how a problem names it: an episode; a row's prompt followed by each
    of its completions (split from one render in token space)."""
    per = sh.entries
    ent = [(int(a), int(n)) for a, n in sh.episodes[loc * per:(loc + 1) * per]]
    if per == 1:
        a, n = ent[0]
        return [(f"episode {sh.first_gid + loc}", np.asarray(sh.tokens[a:a + n], dtype=np.int64))]
    (pa, pn), row = ent[0], sh.first_gid // per + loc
    prompt = np.asarray(sh.tokens[pa:pa + pn], dtype=np.int64)
    return [(f"row {row}, completion {i}", np.concatenate([prompt, np.asarray(sh.tokens[a:a + n], dtype=np.int64)]))
            for i, (a, n) in enumerate(ent[1:])]


def retokenize_shard(tok, sh, local: np.ndarray) -> Retokenized:
    """Re-encode items ``local`` of shard ``sh`` (``sequences``) with ``tok`` (the library's
    engine): the sequences re-encoded, those that differ, a ``Problem`` for each."""
    out = Retokenized()
    for loc in np.asarray(local, dtype=np.int64).tolist():
        for name, stored in sequences(sh, loc):
            again = tok.encode_rendered_by_library(tok.decode(stored.tolist()))
            out.episodes += 1
            if np.array_equal(stored, again):
                continue
            out.differ += 1
            m = min(stored.size, again.size)
            j = int(np.flatnonzero(stored[:m] != again[:m])[0]) if np.any(stored[:m] != again[:m]) else m
            out.problems.append(Problem(
                "retokenize", f"{sh.rel}/{TOKENS_FILE}", name,
                f"decoded and re-encoded by the tokenizers library, {name} ({sh.split}) gives other ids from "
                f"token {j}: stored {stored[j:j + 4].tolist()}, re-encoded {again[j:j + 4].tolist()} ({stored.size} "
                f"vs {again.size} tokens)", FIX, split=sh.split, episode=sh.first_gid + loc if sh.entries == 1 else None,
                code="differs"))
    return out
