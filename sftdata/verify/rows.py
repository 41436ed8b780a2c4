"""What ``verify`` checks otherwise in a row dataset (kinds ``pairs``, ``kto``, ``prompts``:
rows of ``entries_per_row`` index entries, the prompt first); every other check is the
episodes' own, run by the same skeleton (``run``), on Ray too.

* ``mask_rule`` (per shard, ``row_mask_problems``): a prompt trains nothing; each
  completion's mask is the one rule's after its prompt (``chat.pair_rule``) and trains at
  least one token;
* ``labels`` (per shard, KTO only): one 0 or 1 label per row;
* ``drift`` (``--retokenize N``, ``ROWS``: the drift check's sample and comparison): N sampled rows, rendered again from their
  input records by the libraries installed now (the rendering, passed in as
  ``rerender``: ``sftdata.prepare.rerender_records``, which this layer cannot import),
  give exactly the stored ids and masks of every entry: the prompt identical in both
  sides and equal to the prompt rendered alone, re-derived, not trusted.

``eos`` means nothing for a row (a prompt ends with the generation prompt, not EOS): the
report says so by name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson

from ..chat.pair_rule import completion_masks
from ..sources import record_where
from ..store.format import COLUMNS_FILE, KIND_KTO, KIND_PROMPTS, LABELS_FILE, MASK_FILE, RECREATE, TOKENS_FILE, Problem
from ..store.shard import Shard
from ..store.structure import episode_bounds
from .drift import Drift, DriftKind, versions
from .retokenize import sample_by_shard

ROW_BATCH = 512  # rows whose masks are checked at once
MAX_PROBLEMS = 20  # problems of one check in one shard
NO_EOS = "a row's prompt ends with the generation prompt, not <|EOS|>"
ROW_MASK_RULE = "prompts train nothing; each completion's mask is the one rule's after its prompt, none empty"
LABELS_CHECK = "KTO: one 0 or 1 label per row"
COLUMNS_CHECK = "RL prompts: one columns.jsonl line per row, naming its row and input record"
RERENDER_FIX = "re-create the dataset from its inputs with this sftdata (`sftdata prepare-pref` / `prepare-rl`)"


def readable(sh: Shard) -> bool:
    """Whether every row of ``sh`` can be read whole: its tokens, mask and sources present
    and of one size, its entries contiguous, in bounds and non-empty. Where not, the
    reader's checks (files, sizes, index) say what is wrong, and no row is read."""
    per = sh.entries
    if sh.tokens is None or sh.mask is None or sh.sources is None or sh.num_items % per or \
            sh.mask.shape[0] != sh.tokens.shape[0] or sh.sources.shape[0] != sh.num_items // per:
        return False
    b = episode_bounds(sh)
    return bool(b.usable.all()) and (b.starts.size == 0 or (b.starts[0] == 0 and bool(
        np.array_equal(b.starts[1:], b.starts[:-1] + b.lengths[:-1]))))


def row_mask_problems(sh: Shard, rule) -> list[Problem]:
    """The ``mask_rule`` problems of row shard ``sh``, ``ROW_BATCH`` rows at a time: no
    prompt trains a token (one cumulative sum), and each completion's mask is the rule's
    (``completion_masks``: one rule call per batch) and trains at least one token. A shard
    whose rows cannot be read whole (``readable``) is left to the reader's checks."""
    per, out = sh.entries, []
    if rule is None or not readable(sh):
        return out
    rows = sh.num_items // per
    starts = sh.index[:rows * per, 0].astype(np.int64).reshape(rows, per)
    lengths = sh.index[:rows * per, 1].astype(np.int64).reshape(rows, per)
    for lo in range(0, rows, ROW_BATCH):
        hi = min(rows, lo + ROW_BATCH)
        a, b = int(starts[lo, 0]), int(starts[hi - 1, -1] + lengths[hi - 1, -1])
        toks, msk = np.asarray(sh.tokens[a:b], dtype=np.int64), np.asarray(sh.mask[a:b])
        trained = np.concatenate([[0], np.cumsum(msk, dtype=np.int64)])
        p0 = starts[lo:hi, 0] - a
        for r in np.flatnonzero(trained[p0 + lengths[lo:hi, 0]] - trained[p0] > 0).tolist():
            out.append(_mask_problem(sh, lo + r, None, "the prompt holds trained tokens"))
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
                out.append(_mask_problem(sh, r, i - 1, "the mask is not the rule's, or trains nothing"))
    return out[:MAX_PROBLEMS]


def _mask_problem(sh: Shard, r: int, completion: int | None, message: str) -> Problem:
    where = f"row {sh.first_gid // sh.entries + r}, record {int(sh.sources[r])}"
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


def columns_skipped(kind: str | None) -> str | None:
    """Why the ``columns`` check means nothing for ``kind`` (None: it runs)."""
    return None if kind == KIND_PROMPTS else f"a {kind} dataset has no columns.jsonl"


def column_problems(sh: Shard, kind: str | None) -> list[Problem]:
    """The ``columns`` problem of an RL prompts shard: its ``columns.jsonl`` must hold one
    line per row, ``{"row": R, "record": N, "columns": {...}}`` with R the row's global id
    and N its input record (``sources.idx``), as the loader and exporters read it."""
    if kind != KIND_PROMPTS or sh.sources is None:
        return []
    path = sh.path / COLUMNS_FILE
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        return [Problem("columns", sh.file(COLUMNS_FILE), "the file", f"cannot be read ({type(e).__name__})",
                        RECREATE, split=sh.split)]
    rows, first = sh.num_items // sh.entries, sh.first_gid // sh.entries
    if len(lines) != rows:
        return [Problem("columns", sh.file(COLUMNS_FILE), "the file", f"holds {len(lines):,} lines for {rows:,} "
                        f"rows", RECREATE, split=sh.split)]
    for r, line in enumerate(lines):
        try:
            obj = orjson.loads(line)
            ok = isinstance(obj, dict) and obj.get("row") == first + r and \
                obj.get("record") == int(sh.sources[r]) and isinstance(obj.get("columns"), dict)
        except orjson.JSONDecodeError:
            ok = False
        if not ok:
            return [Problem("columns", sh.file(COLUMNS_FILE), f"line {r + 1} (row {first + r}, record "
                            f"{int(sh.sources[r])})", f"is not {{\"row\": {first + r}, \"record\": "
                            f"{int(sh.sources[r])}, \"columns\": {{...}}}}", RECREATE, split=sh.split)]
    return []


def stored_row(sh: Shard, r: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Row ``r`` (local) of ``sh``: (ids, mask) of each of its entries."""
    per = sh.entries
    return [(np.asarray(sh.tokens[a:a + n], dtype=np.int64), np.asarray(sh.mask[a:a + n]))
            for a, n in sh.index[r * per:(r + 1) * per].astype(np.int64).tolist()]


def _row_picks(shards: Sequence[Shard], n: int, seed: int) -> list[tuple]:
    """(record, row id, shard, the stored row) of ``n`` sampled rows (``retokenize``'s sample)."""
    return [(int(sh.sources[r]), sh.first_gid // sh.entries + r, sh, stored_row(sh, r))
            for sh, local in sample_by_shard(shards, n, seed) if readable(sh)
            for r in np.asarray(local, dtype=np.int64).tolist()]


def _row_matches(stored: list, got) -> bool:
    return got.rejected is None and any(_same_row(parts, stored) for parts in got.renders)


def _drift_problem(bad: list, meta: dict, d: Drift) -> Problem:
    record, gid, sh, _, got = bad[0]
    where = record_where(meta.get("sources") or [], record) or got.where
    what = f"is rejected now ({got.rejected})" if got.rejected is not None else \
        "renders otherwise now: its ids or masks differ from the stored row"
    more = f" ({len(bad) - 1:,} more sampled row(s) differ)" if len(bad) > 1 else ""
    return Problem("drift", f"{sh.rel}/{TOKENS_FILE}", f"row {gid}, input record {where}",
                   f"input record {where} {what}: row {gid} ({sh.split}){more}; {versions(d.then, d.now)}",
                   RERENDER_FIX, split=sh.split, code="rejected" if got.rejected is not None else "differs")


# ``--retokenize N``'s drift check of a row dataset: N sampled rows rendered again from their input
# records (``rerender``: ``sftdata.prepare.rerender_records``, each record's render the (ids, mask)
# of its entries, or ``rejected``) give exactly the stored row
ROWS = DriftKind(_row_picks, _row_matches, _drift_problem)


def _same_row(parts: list, want: list) -> bool:
    return len(parts) == len(want) and all(np.array_equal(np.asarray(a, dtype=np.int64), b) and
                                           np.array_equal(np.asarray(m, dtype=np.uint8), n)
                                           for (a, m), (b, n) in zip(parts, want))
