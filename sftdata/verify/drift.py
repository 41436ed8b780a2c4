"""``verify --retokenize N``, library drift: the input records of N sampled episodes (the
``retokenize`` sample), rendered again by the libraries installed now, must give the stored
ids. A tokenizers, tiktoken or jinja2 release that encodes or renders a text otherwise is
found on the user's own data and named: the first record that differs (file:line), where,
and the library versions the dataset was made with against those installed now.

The rendering is ``sftdata.prepare.rerender_records`` (the prepare pipeline, which this
layer cannot import): the caller passes it as ``rerender``; without it the check is
skipped and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import SftDataError
from ..sources import record_where
from ..store.build_key import code_version, library_versions, recorded_build
from ..store.format import TOKENS_FILE, Problem
from .retokenize import sample_by_shard

DRIFT_CHECK = {"drift": "sampled episodes, rendered again from their input records by the libraries installed now, "
                        "give the stored ids (--retokenize)"}
NO_RERENDER = ("the records cannot be rendered again here: pass rerender=sftdata.prepare.rerender_records to verify() "
               "(the CLI does)")


@dataclass
class Drift:
    """What the drift check compared: episodes rendered again, how many differ, how many
    could not be (their input cannot be read as it was), the versions then and now."""

    episodes: int = 0
    differ: int = 0
    unread: int = 0
    then: dict | None = None
    now: dict = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    skipped: str | None = None

    def as_dict(self) -> dict:
        return {"episodes": self.episodes, "differ": self.differ, "unread": self.unread, "then": self.then,
                "now": self.now, "skipped": self.skipped}


def versions(then: dict | None, now: dict, **_) -> str:
    """``made with X 1 -> now 2`` for the versions that differ, or the versions, all the same."""
    if then is None:
        return f"the versions it was made with are not recorded (an earlier sftdata); now {_list(now)}"
    moved = [f"{k} {then.get(k) or 'not installed'} -> {now[k] or 'not installed'}" for k in now
             if then.get(k) != now[k]]
    return f"made with -> now: {'; '.join(moved)}" if moved else f"the same versions ({_list(now)})"


def _list(v: dict) -> str:
    return ", ".join(f"{k} {v[k] or 'not installed'}" for k in v)


@dataclass(frozen=True)
class DriftKind:
    """What the drift check samples and compares for one kind of dataset: ``picks(shards, n,
    seed)`` gives (record, id, shard, stored) of each sampled item; ``matches(stored, render)``
    whether the render now is the stored item; ``problem(bad, meta, drift)`` the one problem
    naming the first that differs."""

    picks: Callable
    matches: Callable
    problem: Callable


def check_drift(shards: Sequence, meta: dict | None, state: dict | None, n: int, seed: int = 0,
                rerender: Callable | None = None, kind: DriftKind | None = None) -> Drift:
    """Render the input records of ``n`` sampled episodes (``kind``: items) of ``shards``
    again (``rerender(meta, state, records) -> (renders, unread)``); one ``drift`` problem
    names the first record whose render now is none of its stored episodes."""
    kind = kind or EPISODES
    rec = recorded_build(meta)
    out = Drift(then=(rec or {}).get("libraries"), now=library_versions())
    if rerender is None:
        out.skipped = NO_RERENDER
        return out
    if not isinstance(meta, dict) or not meta.get("sources") or not isinstance(state, dict):
        out.skipped = "the metadata records no input files (or no tokenizer) to render again"
        return out
    picks = kind.picks(shards, n, seed)
    if not picks:
        out.skipped = "no sampled episode records its input record (sources.idx)"
        return out
    try:
        renders, unread = rerender(meta, state, sorted({p[0] for p in picks}))
    except SftDataError as e:
        out.skipped = f"the recorded tokenizer or template cannot be rebuilt: {e}"
        return out
    bad = []
    for record, gid, sh, stored in sorted(picks, key=lambda p: (p[0], p[1])):
        if record in unread or record not in renders:
            out.unread += 1
            continue
        out.episodes += 1
        if not kind.matches(stored, renders[record]):
            out.differ += 1
            bad.append((record, gid, sh, stored, renders[record]))
    if unread and not out.episodes:
        out.skipped = f"no sampled record could be read again: record {min(unread)}: {unread[min(unread)]}"
    if bad:
        out.problems.append(kind.problem(bad, meta, out))
    return out


def _episode_picks(shards: Sequence, n: int, seed: int) -> list[tuple]:
    picks = []
    for sh, local in sample_by_shard(shards, n, seed):
        if sh.sources is None:
            continue
        for loc in np.asarray(local, dtype=np.int64).tolist():
            start, length = (int(v) for v in sh.episodes[loc])
            picks.append((int(sh.sources[loc]), sh.first_gid + loc, sh, np.asarray(sh.tokens[start:start + length])))
    return picks


def _episode_matches(stored: np.ndarray, r) -> bool:
    return any(np.array_equal(stored, e) for e in r.renders)


def _problem(bad: list, meta: dict, d: Drift) -> Problem:
    record, gid, sh, stored, r = bad[0]
    where = record_where(meta.get("sources") or [], record) or r.where
    if r.rejected is not None:
        what = f"is rejected now ({r.rejected}); it was episode {gid} ({sh.split})"
    else:
        now = min(r.renders, key=lambda e: abs(e.size - stored.size)) if r.renders else np.empty(0, np.int64)
        m = min(stored.size, now.size)
        diff = np.flatnonzero(stored[:m] != now[:m])
        j = int(diff[0]) if diff.size else m
        what = (f"renders otherwise now: episode {gid} ({sh.split}) stores {stored.size:,} tokens, the render now "
                f"{now.size:,}; from token {j} stored {stored[j:j + 4].tolist()}, now {now[j:j + 4].tolist()}")
    more = f" ({len(bad) - 1:,} more sampled episode(s) differ)" if len(bad) > 1 else ""
    code = ((recorded_build(meta) or {}).get("components") or {}).get("code")
    own = "" if code in (None, code_version()) else "; sftdata's own rendering code changed too"
    return Problem("drift", f"{sh.rel}/{TOKENS_FILE}", f"episode {gid}, input record {where}",
                   f"input record {where} {what}{more}; {versions(d.then, d.now)}{own}",
                   "re-create the dataset with the libraries installed now (`sftdata prepare-chat` / `prepare-tool` "
                   "with --force), or install the versions it was made with",
                   split=sh.split, episode=gid, code="rejected" if r.rejected is not None else "differs")


EPISODES = DriftKind(_episode_picks, _episode_matches, _problem)

__all__ = ["DRIFT_CHECK", "EPISODES", "NO_RERENDER", "Drift", "DriftKind", "check_drift", "versions"]
