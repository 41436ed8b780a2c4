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
from pathlib import Path

import numpy as np

from ..chat.loss_rule import rule_from_state
from ..chat.pair_rule import completion_mask
from ..errors import RecordError, SftDataError
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
from ..store.reader import read_one_generation
from ..util.hashing import sha256_file
from ..verify.run import CheckResult, VerifyReport
from .run import PrefOptions, open_context, record_row
from .truncate import Truncation

CHECKS = (("checksums", "every listed file's size and sha256"),
          ("layout", "entries per row, one source per row, labels"),
          ("masks", "prompts untrained; completions masked by the one rule, none empty"),
          ("pairs", "every row rendered again from its input record: the same ids and masks"))
MAX_PROBLEMS = 20


def _rows(shard: Path, dtype: np.dtype, per_row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    tokens = np.fromfile(shard / TOKENS_FILE, dtype=dtype)
    mask = np.fromfile(shard / MASK_FILE, dtype=np.uint8)
    idx = np.fromfile(shard / EPISODES_FILE, dtype=IDX_DTYPE).reshape(-1, 2).astype(np.int64)
    sources = np.fromfile(shard / SOURCES_FILE, dtype=IDX_DTYPE).astype(np.int64)
    return tokens, mask, idx, sources


def _options(meta: dict) -> PrefOptions:
    o = meta.get("options") or {}
    t = o.get("truncation") or {}
    return PrefOptions(tokenizer=o.get("tokenizer"), chat_template=o.get("chat_template"),
                       template_vars=o.get("template_vars"), form=o.get("format", "auto"),
                       truncation=Truncation(t.get("max_length"), t.get("max_prompt_length"), t.get("policy", "keep-end")),
                       reasoning=o.get("reasoning", "keep"),
                       allow_pad_as_stop=bool(o.get("allow_pad_as_stop")), max_record_bytes=o.get("max_record_bytes", 1 << 30))


def verify_rows(path: str | Path, *, rerender: bool = True) -> VerifyReport:
    """Verify the row dataset at ``path`` (module docstring). ``rerender``: run the
    ``pairs`` check (it reads the recorded inputs and needs the tokenizer). A dataset
    replaced while it is verified is verified again (``read_one_generation``): the report
    is of the old dataset or of the new one, never of a mix."""
    root = Path(path)
    return read_one_generation(root, lambda: _verify_rows(root, rerender))


def _verify_rows(root: Path, rerender: bool) -> VerifyReport:
    t0 = time.perf_counter()
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
    stored: dict[int, list] = {}  # record -> [(ids, mask) per entry]
    for split, sh in shards:
        rel = f"{split}/{sh.name}"
        tokens, mask, idx, sources = _rows(sh, dtype, per_row)
        if per_row < 1 or idx.shape[0] != per_row * sources.shape[0] or \
                (idx.size and (idx[0, 0] != 0 or np.any(idx[1:, 0] != idx[:-1].sum(axis=1)))) or \
                int(idx[:, 1].sum()) != tokens.shape[0]:
            problem("layout", f"{rel}/{EPISODES_FILE}", "", f"{idx.shape[0]:,} entries for {sources.shape[0]:,} rows "
                    f"of {per_row} (or not contiguous)", "re-create the dataset with `sftdata prepare-pref`")
            continue
        if kind == KIND_KTO:
            labels = np.fromfile(sh / LABELS_FILE, dtype=np.uint8)
            if labels.shape[0] != sources.shape[0] or np.any(labels > 1):
                problem("layout", f"{rel}/{LABELS_FILE}", "", "not one 0/1 label per row",
                        "re-create the dataset with `sftdata prepare-pref`")
        for r in range(sources.shape[0]):
            ents = [(tokens[a:a + n], mask[a:a + n]) for a, n in idx[r * per_row:(r + 1) * per_row].tolist()]
            where = f"row {r}, record {int(sources[r])}"
            prompt, pmask = ents[0]
            if pmask.any():
                problem("masks", f"{rel}/{MASK_FILE}", where, "the prompt holds trained tokens",
                        "re-create the dataset with `sftdata prepare-pref`")
            for i, (c, m) in enumerate(ents[1:]):
                want = completion_mask(rule, prompt.astype(np.int64), c.astype(np.int64))
                if not np.array_equal(want, m) or not m.any():
                    problem("masks", f"{rel}/{MASK_FILE}", f"{where}, completion {i}",
                            "the mask is not the rule's, or trains nothing",
                            "re-create the dataset with `sftdata prepare-pref`")
            stored[int(sources[r])] = [(e.astype(np.int64), m.copy()) for e, m in ents]
    if rerender:
        _rerender(meta, stored, problem)
    report.problems = [p for name, _ in CHECKS for p in found[name]]
    for name, desc in CHECKS:
        status = "skipped" if name == "pairs" and not rerender else ("failed" if found[name] else "ok")
        report.checks.append(CheckResult(name, desc, status, len(found[name])))
    report.splits = {split: {"rows": (meta.get("splits", {}).get(split) or {}).get("rows")}
                     for split in ("train", "val") if split in meta.get("splits", {})}
    report.seconds = time.perf_counter() - t0
    return report


def _rerender(meta: dict, stored: dict, problem) -> None:
    rl = meta.get("kind") == "prompts"
    ctx, _ = open_context(_options(meta), rl)
    try:
        infos = [inspect_source(s["path"]) for s in meta.get("sources", [])]
    except SftDataError as e:
        problem("pairs", "(inputs)", "", f"the recorded inputs cannot be read ({e})", "give the inputs back at the "
                "recorded paths, or skip this check")
        return
    seen = 0
    for raw, _ in iter_all(infos, ctx.opts.max_record_bytes):
        want = stored.get(raw.record)
        if want is None:
            continue
        seen += 1
        try:
            row = record_row(raw.raw, raw.where, ctx)
        except RecordError as e:
            problem("pairs", raw.where, f"record {raw.record}", f"rendered again, the record is rejected ({e.reason}: "
                    f"{e.detail})", "re-create the dataset from these inputs")
            continue
        same = len(row.parts) == len(want) and all(np.array_equal(a.astype(np.int64), b) and np.array_equal(m, n)
                                                   for (a, m), (b, n) in zip(row.parts, want))
        if not same:
            problem("pairs", raw.where, f"record {raw.record}", "rendered again, its ids or masks differ from the "
                    "stored row", "re-create the dataset from these inputs with this sftdata")
    if seen != len(stored):
        problem("pairs", "(inputs)", "", f"{len(stored) - seen:,} stored rows have no record in the recorded inputs",
                "re-create the dataset from its inputs")
