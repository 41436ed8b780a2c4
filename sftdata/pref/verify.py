"""``verify`` of a row dataset (kinds ``pairs``, ``kto``, ``prompts``): every row re-derived.

Checks, in order, each a ``CheckResult`` of the usual report:

* ``checksums``: every file the metadata lists has its size and sha256;
* ``layout``: each shard's ``episodes.idx`` holds ``entries_per_row`` contiguous entries
  per row, ``sources.idx`` one record per row, ``labels.bin`` (kto) one 0/1 per row;
* ``masks``: a prompt trains nothing; each completion's mask is the one rule's
  (``chat.pair_rule.completion_mask`` of the stored prompt and completion) and trains at
  least one token;
* ``pairs``: each row rendered again from its input record (the recorded inputs, options,
  tokenizer and template) gives exactly the stored ids and masks: the prompt identical in
  both sides and equal to the prompt rendered alone, re-derived, not trusted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..chat.loss_rule import rule_from_state
from ..chat.pair_rule import completion_masks
from ..errors import RecordError, SftDataError
from ..prepare.pool import overlapped
from ..sources import inspect_source, iter_all
from ..store.format import (
    EPISODES_FILE,
    IDX_DTYPE,
    KIND_KTO,
    LABELS_FILE,
    MASK_FILE,
    METADATA_FILE,
    SOURCES_FILE,
    TOKENIZER_FILE,
    TOKENS_FILE,
    Problem,
    list_shards,
    read_json,
    recorded_files,
)
from ..store.reader import read_one_generation, scan_dataset
from ..util.hashing import sha256_file
from ..verify.run import CheckResult, VerifyReport
from .options import PrefOptions
from .render import equal_arrays, one_process_run
from .run import finish_rows, open_context, start_rows

CHECKS = (("checksums", "every listed file's size and sha256"),
          ("layout", "entries per row, one source per row, labels"),
          ("masks", "prompts untrained; completions masked by the one rule, none empty"),
          ("pairs", "every row rendered again from its input record: the same ids and masks"))
MAX_PROBLEMS = 20
ROW_BATCH = 512  # rows checked, or rendered again, at once


@dataclass(frozen=True)
class _Shard:
    """One shard's rows: ``episodes.idx`` and ``sources.idx`` read whole (16 and 8 bytes a
    row entry), the tokens and masks memory-mapped, read a batch of rows at a time."""

    rel: str
    path: Path
    idx: np.ndarray      # (rows * per_row, 2) int64
    sources: np.ndarray  # (rows,) int64

    def arrays(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        return _mapped(self.path / TOKENS_FILE, dtype), _mapped(self.path / MASK_FILE, np.dtype(np.uint8))


def _mapped(path: Path, dtype: np.dtype) -> np.ndarray:
    """The file's whole items as a read-only array (memory-mapped; an empty file as an
    empty array). The layout check has refused a file that is not whole items."""
    n = path.stat().st_size // dtype.itemsize
    if n == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


def _row_entries(tokens: np.ndarray, mask: np.ndarray, idx: np.ndarray, r: int, per_row: int) -> list:
    return [(np.asarray(tokens[a:a + n], dtype=np.int64), np.asarray(mask[a:a + n]))
            for a, n in idx[r * per_row:(r + 1) * per_row].tolist()]


def verify_rows(path: str | Path, *, rerender: bool = True) -> VerifyReport:
    """Verify the row dataset at ``path`` (module docstring). ``rerender``: run the
    ``pairs`` check (it reads the recorded inputs and needs the tokenizer). A dataset
    replaced while it is verified is verified again (``read_one_generation``): the report
    is of the old dataset or of the new one, never of a mix."""
    root = Path(path)
    return read_one_generation(root, lambda: _verify_rows(root, rerender))


def _verify_rows(root: Path, rerender: bool) -> VerifyReport:
    t0 = time.perf_counter()
    damaged = _structure_report(root)
    if damaged is not None:
        return damaged
    meta = read_json(root / METADATA_FILE)
    kind = meta.get("kind")
    per_row = int(meta.get("entries_per_row") or 0)
    report = VerifyReport(str(root), "sharded", kind, False)
    found: dict[str, list[Problem]] = {name: [] for name, _ in CHECKS}

    def problem(check, file, where, message, fix) -> None:
        if len(found[check]) < MAX_PROBLEMS:
            found[check].append(Problem(check, file, where, message, fix))

    shards = []
    for split in ("train", "val"):
        for sh in list_shards(root, split):
            shards.append((split, sh))
    for split, sh in shards:
        rec = next((s for s in (meta.get("splits", {}).get(split) or {}).get("shards", []) if s.get("name") == sh.name),
                   {})
        for fn, r in (rec.get("files") or {}).items():
            p = sh / fn
            if p.is_file():
                report.bytes_read += p.stat().st_size
                report.bytes_hashed += p.stat().st_size
            if not p.is_file() or p.stat().st_size != r.get("bytes") or sha256_file(p) != r.get("sha256"):
                problem("checksums", f"{split}/{sh.name}/{fn}", "", "the file is missing or its size or sha256 is not "
                        "the metadata's", "re-create the dataset with `sftdata prepare-pref`")
    for name, p, r, _ in recorded_files(root, meta, []):
        if not p.is_file() or sha256_file(p) != r.get("sha256"):
            problem("checksums", name, "", "the file is missing or its sha256 is not the metadata's",
                    "re-create the dataset with `sftdata prepare-pref`")
    state = read_json(root / TOKENIZER_FILE)
    rule = rule_from_state(state)
    dtype = np.dtype(meta.get("token_dtype", "uint32")).newbyteorder("<")
    readable: list[_Shard] = []
    for split, sh in shards:
        rel = f"{split}/{sh.name}"
        idx = np.fromfile(sh / EPISODES_FILE, dtype=IDX_DTYPE).reshape(-1, 2).astype(np.int64)
        sources = np.fromfile(sh / SOURCES_FILE, dtype=IDX_DTYPE).astype(np.int64)
        token_bytes = (sh / TOKENS_FILE).stat().st_size
        n_tokens = token_bytes // dtype.itemsize
        if per_row < 1 or idx.shape[0] != per_row * sources.shape[0] or token_bytes % dtype.itemsize or \
                (idx.size and (idx[0, 0] != 0 or np.any(idx[1:, 0] != idx[:-1].sum(axis=1)))) or \
                int(idx[:, 1].sum()) != n_tokens or (sh / MASK_FILE).stat().st_size != n_tokens:
            problem("layout", f"{rel}/{EPISODES_FILE}", "", f"{idx.shape[0]:,} entries for {sources.shape[0]:,} rows "
                    f"of {per_row} (or not contiguous)", "re-create the dataset with `sftdata prepare-pref`")
            continue
        if kind == KIND_KTO:
            labels = np.fromfile(sh / LABELS_FILE, dtype=np.uint8)
            if labels.shape[0] != sources.shape[0] or np.any(labels > 1):
                problem("layout", f"{rel}/{LABELS_FILE}", "", "not one 0/1 label per row",
                        "re-create the dataset with `sftdata prepare-pref`")
        shard = _Shard(rel, sh, idx, sources)
        _check_masks(shard, dtype, rule, per_row, problem)
        readable.append(shard)
    if rerender:
        _rerender(meta, readable, dtype, per_row, problem)
    report.problems = [p for name, _ in CHECKS for p in found[name]]
    for name, desc in CHECKS:
        status = "skipped" if name == "pairs" and not rerender else ("failed" if found[name] else "ok")
        report.checks.append(CheckResult(name, desc, status, len(found[name])))
    report.splits = {split: {"rows": (meta.get("splits", {}).get(split) or {}).get("rows")}
                     for split in ("train", "val") if split in meta.get("splits", {})}
    report.seconds = time.perf_counter() - t0
    return report


def _structure_report(root: Path) -> VerifyReport | None:
    """The report of a dataset the store's reader refuses (a damaged field, file, size or
    index: ``scan_dataset``): its structural problems, every row check skipped. None when
    the structure holds, so that the checks below read only well-formed files."""
    scan = scan_dataset(root)
    problems = scan.strict_problems()
    if not problems:
        return None
    report = VerifyReport(str(root), "sharded", scan.dataset.kind, False, problems=problems[:MAX_PROBLEMS])
    report.checks = [CheckResult("structure", "description files, files present, sizes, the index", "failed",
                                 len(problems))]
    report.checks += [CheckResult(name, desc, "skipped", note="the structure is damaged") for name, desc in CHECKS]
    return report


def _check_masks(sh: _Shard, dtype: np.dtype, rule, per_row: int, problem) -> None:
    """The ``masks`` check of one shard, ``ROW_BATCH`` rows at a time: no prompt trains a
    token (one cumulative sum), and each completion's mask is the rule's
    (``completion_masks``: one rule call per batch) and trains at least one token."""
    tokens, mask = sh.arrays(dtype)
    rows = sh.sources.shape[0]
    starts, lengths = sh.idx[:, 0].reshape(rows, per_row), sh.idx[:, 1].reshape(rows, per_row)
    for lo in range(0, rows, ROW_BATCH):
        hi = min(rows, lo + ROW_BATCH)
        a, b = int(starts[lo, 0]), int(starts[hi - 1, -1] + lengths[hi - 1, -1])
        toks, msk = np.asarray(tokens[a:b], dtype=np.int64), np.asarray(mask[a:b])
        trained = np.concatenate([[0], np.cumsum(msk, dtype=np.int64)])
        p0 = starts[lo:hi, 0] - a
        for r in np.flatnonzero(trained[p0 + lengths[lo:hi, 0]] - trained[p0] > 0).tolist():
            problem("masks", f"{sh.rel}/{MASK_FILE}", f"row {lo + r}, record {int(sh.sources[lo + r])}",
                    "the prompt holds trained tokens", "re-create the dataset with `sftdata prepare-pref`")
        pieces, at = [], []
        for r in range(lo, hi):
            p = toks[starts[r, 0] - a:starts[r, 0] - a + lengths[r, 0]]
            for i in range(1, per_row):
                s = starts[r, i] - a
                pieces.append((p, toks[s:s + lengths[r, i]]))
                at.append((r, i, s))
        for (r, i, s), want in zip(at, completion_masks(rule, pieces)):
            m = msk[s:s + want.shape[0]]
            if not np.array_equal(want, m) or not m.any():
                problem("masks", f"{sh.rel}/{MASK_FILE}", f"row {r}, record {int(sh.sources[r])}, completion {i - 1}",
                        "the mask is not the rule's, or trains nothing",
                        "re-create the dataset with `sftdata prepare-pref`")


def _rerender(meta: dict, shards: list[_Shard], dtype: np.dtype, per_row: int, problem) -> None:
    """The ``pairs`` check: the recorded inputs read again in order, the records that have a
    row rendered again ``ROW_BATCH`` at a time (``record_rows``; each batch tokenized while
    the next renders) and compared with the row (read from its memory-mapped shard; the
    shards' rows are found by record number)."""
    rl = meta.get("kind") == "prompts"
    ctx, _ = open_context(PrefOptions.from_recorded(meta.get("options") or {}), rl)
    try:
        infos = [inspect_source(s["path"]) for s in meta.get("sources", [])]
    except SftDataError as e:
        problem("pairs", "(inputs)", "", f"the recorded inputs cannot be read ({e})", "give the inputs back at the "
                "recorded paths, or skip this check")
        return
    records = np.concatenate([sh.sources for sh in shards] or [np.empty(0, np.int64)])
    owner = np.repeat(np.arange(len(shards)), [sh.sources.shape[0] for sh in shards])
    row_of = np.concatenate([np.arange(sh.sources.shape[0]) for sh in shards] or [np.empty(0, np.int64)])
    order = np.argsort(records, kind="stable")
    records, owner, row_of = records[order], owner[order], row_of[order]
    opened: dict[int, tuple] = {}  # the shards' mapped arrays, the last few (rows come in input order)

    def stored(k: int) -> list:
        s = int(owner[k])
        if s not in opened:
            if len(opened) >= 4:
                opened.pop(next(iter(opened)))
            opened[s] = shards[s].arrays(dtype)
        return _row_entries(*opened[s], shards[s].idx, int(row_of[k]), per_row)

    seen = 0

    def batches():
        nonlocal seen
        batch: list = []
        for raw, _ in iter_all(infos, ctx.opts.max_record_bytes):
            k = int(np.searchsorted(records, raw.record))
            if k >= records.shape[0] or records[k] != raw.record:
                continue
            seen += 1
            batch.append((raw, k))
            if len(batch) >= ROW_BATCH:
                yield batch, batch
                batch = []
        if batch:
            yield batch, batch

    def compare(rows: list, batch: list) -> None:
        for (raw, k), row in zip(batch, rows):
            if isinstance(row, RecordError):
                problem("pairs", raw.where, f"record {raw.record}", f"rendered again, the record is rejected "
                        f"({row.reason}: {row.detail})", "re-create the dataset from these inputs")
                continue
            want = stored(k)
            same = len(row.parts) == len(want) and all(equal_arrays(a, b) and equal_arrays(m, n)
                                                       for (a, m), (b, n) in zip(row.parts, want))
            if not same:
                problem("pairs", raw.where, f"record {raw.record}", "rendered again, its ids or masks differ from the "
                        "stored row", "re-create the dataset from these inputs with this sftdata")

    with one_process_run() as pool:  # a batch tokenized as the next renders
        for started, batch in overlapped(batches(), lambda b: start_rows([(raw.raw, raw.where) for raw, _ in b], ctx,
                                                                         pool)):
            compare(finish_rows(started, ctx), batch)
    if seen != records.shape[0]:
        problem("pairs", "(inputs)", "", f"{records.shape[0] - seen:,} stored rows have no record in the recorded "
                "inputs", "re-create the dataset from its inputs")
