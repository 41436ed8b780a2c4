"""What ``verify`` checks otherwise in a row dataset (kinds ``pairs``, ``kto``, ``prompts``:
rows of ``entries_per_row`` index entries, the prompt first); every other check is the
episodes' own, run by the same skeleton (``run``), on Ray too.

* ``mask_rule`` (per shard, ``row_mask_problems``): a prompt trains nothing; each
  completion's mask is the one rule's after its prompt (``chat.pair_rule``) and trains at
  least one token;
* ``labels`` (per shard, KTO only): one 0 or 1 label per row;
* ``drift`` (``--retokenize N``, ``row_drift``): N sampled rows, rendered again from their
  input records by the libraries installed now (the kind's own rendering, passed in as
  ``rerender``: ``sftdata.pref.rerender.rerender_rows``, which this layer cannot import),
  give exactly the stored ids and masks of every entry: the prompt identical in both
  sides and equal to the prompt rendered alone, re-derived, not trusted.

``eos`` means nothing for a row (a prompt ends with the generation prompt, not EOS): the
report says so by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..chat.pair_rule import completion_masks
from ..errors import SftDataError
from ..sources import record_where
from ..store.build_key import library_versions, recorded_build
from ..store.format import KIND_KTO, LABELS_FILE, MASK_FILE, RECREATE, TOKENS_FILE, Problem
from ..store.shard import Shard
from .drift import NO_RERENDER, Drift, versions
from .retokenize import sample_by_shard

ROW_BATCH = 512  # rows whose masks are checked at once
MAX_PROBLEMS = 20  # problems of one check in one shard
NO_EOS = "a row's prompt ends with the generation prompt, not <|EOS|>"
ROW_MASK_RULE = "prompts train nothing; each completion's mask is the one rule's after its prompt, none empty"
LABELS_CHECK = "KTO: one 0 or 1 label per row"
RERENDER_FIX = "re-create the dataset from its inputs with this sftdata (`sftdata prepare-pref` / `prepare-rl`)"


def row_mask_problems(sh: Shard, rule, tick: Callable[[int], None] = lambda n: None) -> list[Problem]:
    """The ``mask_rule`` problems of row shard ``sh``, ``ROW_BATCH`` rows at a time: no
    prompt trains a token (one cumulative sum), and each completion's mask is the rule's
    (``completion_masks``: one rule call per batch) and trains at least one token."""
    per, out = sh.entries, []
    if sh.tokens is None or sh.mask is None or rule is None:
        return out
    rows = sh.num_items // per
    starts = sh.index[:rows * per, 0].astype(np.int64).reshape(rows, per)
    lengths = sh.index[:rows * per, 1].astype(np.int64).reshape(rows, per)
    for lo in range(0, rows, ROW_BATCH):
        hi = min(rows, lo + ROW_BATCH)
        a, b = int(starts[lo, 0]), int(starts[hi - 1, -1] + lengths[hi - 1, -1])
        toks, msk = np.asarray(sh.tokens[a:b], dtype=np.int64), np.asarray(sh.mask[a:b])
        tick(int(toks.size * sh.token_dtype.itemsize + msk.nbytes))
        trained = np.concatenate([[0], np.cumsum(msk, dtype=np.int64)])
        p0 = starts[lo:hi, 0] - a
        for r in np.flatnonzero(trained[p0 + lengths[lo:hi, 0]] - trained[p0] > 0).tolist():
            out.append(_row_problem(sh, lo + r, None, "the prompt holds trained tokens"))
        pieces, at = [], []
        for r in range(lo, hi):
            p = toks[starts[r, 0] - a:starts[r, 0] - a + lengths[r, 0]]
            for i in range(1, per):
                s = starts[r, i] - a
                pieces.append((p, toks[s:s + lengths[r, i]]))
                at.append((r, i, s))
        for (r, i, s), want in zip(at, completion_masks(rule, pieces)):
            m = msk[s:s + want.shape[0]]
            if not np.array_equal(want, m) or not m.any():
                out.append(_row_problem(sh, r, i - 1, "the mask is not the rule's, or trains nothing"))
    return out[:MAX_PROBLEMS]


def _row_problem(sh: Shard, r: int, completion: int | None, message: str) -> Problem:
    where = f"row {sh.first_gid // sh.entries + r}, record {int(sh.sources[r])}" if sh.sources is not None \
        else f"row {sh.first_gid // sh.entries + r}"
    return Problem("mask_rule", sh.file(MASK_FILE), where + ("" if completion is None else f", completion {completion}"),
                   message, RERENDER_FIX, split=sh.split)


def label_problems(sh: Shard) -> list[Problem]:
    """The ``labels`` problem of a KTO shard: a label that is not 0 or 1 (their number is the reader's ``sizes``)."""
    if sh.labels is None:
        return []
    bad = np.flatnonzero(np.asarray(sh.labels) > 1)
    if not bad.size:
        return []
    r = int(bad[0])
    return [Problem("labels", sh.file(LABELS_FILE), f"row {sh.first_gid // sh.entries + r}",
                    f"label {int(sh.labels[r])} is not 0 or 1 ({bad.size:,} such row(s) in this shard)", RECREATE,
                    split=sh.split)]


def labels_skipped(kind: str | None) -> str | None:
    """Why the ``labels`` check means nothing for ``kind`` (None: it runs)."""
    return None if kind == KIND_KTO else f"a {kind} dataset has no labels"


def stored_row(sh: Shard, r: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Row ``r`` (local) of ``sh``: (ids, mask) of each of its entries."""
    per = sh.entries
    return [(np.asarray(sh.tokens[a:a + n], dtype=np.int64), np.asarray(sh.mask[a:a + n]))
            for a, n in sh.index[r * per:(r + 1) * per].astype(np.int64).tolist()]


def row_drift(shards: Sequence[Shard], meta: dict | None, state: dict | None, n: int, seed: int = 0,
              rerender: Callable | None = None) -> Drift:
    """Render the input records of ``n`` sampled rows of ``shards`` again
    (``rerender(meta, state, records) -> (renders, unread)``, each render's ``parts`` the
    (ids, mask) of its entries, or ``rejected``); one ``drift`` problem names the first
    row and record whose render now differs from the stored row."""
    out = Drift(then=(recorded_build(meta) or {}).get("libraries"), now=library_versions())
    if rerender is None:
        out.skipped = NO_RERENDER.replace("prepare.rerender_records", "pref.rerender.rerender_rows")
        return out
    if not isinstance(meta, dict) or not meta.get("sources") or not isinstance(state, dict):
        out.skipped = "the metadata records no input files (or no tokenizer) to render again"
        return out
    picks = [(int(sh.sources[r]), sh, r) for sh, local in sample_by_shard(shards, n, seed) if sh.sources is not None
             for r in np.asarray(local, dtype=np.int64).tolist()]
    try:
        renders, unread = rerender(meta, state, sorted({p[0] for p in picks}))
    except SftDataError as e:
        out.skipped = f"the recorded tokenizer, template or inputs cannot be opened again: {e}"
        return out
    bad = []
    for record, sh, r in sorted(picks, key=lambda p: p[0]):
        if record in unread or record not in renders:
            out.unread += 1
            continue
        out.episodes += 1
        got, want = renders[record], stored_row(sh, r)
        if got.rejected is not None or not _same_row(got.parts, want):
            out.differ += 1
            bad.append((record, sh, r, got))
    if unread and not out.episodes:
        out.skipped = f"no sampled record could be read again: record {min(unread)}: {unread[min(unread)]}"
    if bad:
        record, sh, r, got = bad[0]
        where = record_where(meta.get("sources") or [], record) or got.where
        what = f"is rejected now ({got.rejected})" if got.rejected is not None else \
            "renders otherwise now: its ids or masks differ from the stored row"
        more = f" ({len(bad) - 1:,} more sampled row(s) differ)" if len(bad) > 1 else ""
        gid = sh.first_gid // sh.entries + r
        out.problems.append(Problem("drift", f"{sh.rel}/{TOKENS_FILE}", f"row {gid}, input record {where}",
                                    f"input record {where} {what}: row {gid} ({sh.split}){more}; "
                                    f"{versions(out.then, out.now)}", RERENDER_FIX, split=sh.split,
                                    code="rejected" if got.rejected is not None else "differs"))
    return out


def _same_row(parts: list, want: list) -> bool:
    return len(parts) == len(want) and all(np.array_equal(np.asarray(a, dtype=np.int64), b) and
                                           np.array_equal(np.asarray(m, dtype=np.uint8), n)
                                           for (a, m), (b, n) in zip(parts, want))
