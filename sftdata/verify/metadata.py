"""The checks of ``verify`` that hold the metadata to itself, to the tokenizer state and to
the data:

* metadata_checksum: ``dataset_metadata.json`` still hashes to the sha256 recorded in it
  (``store.format.metadata_sha256``), so an edit of any value (a source's sha256, the
  vocabulary size, a count) shows even where no other check looks; older datasets
  record none;
* tokenizer (identity): every field the metadata's tokenizer summary shares with
  ``tokenizer_state.json`` (name, source, ranks_sha256, vocab_size, eos_id ...) is equal,
  and the state's vocab_size is the rebuilt tokenizer's. The vocab check then holds the
  ids to the smallest of these vocabularies (``recorded_vocab``);
* ranges: each shard's recorded ``token_id_range`` lies below that vocabulary and its
  ``mask_value_range`` within 0..1 (free: the metadata alone), and, on a full verify,
  both equal the data's: proven by the checksums when they all match (``proven_shards``),
  else measured (``data_ranges``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..storage import METADATA_FILE
from ..store.format import (
    MASK_FILE,
    METADATA_CHECKSUM,
    METADATA_CHECKSUM_VERSION,
    RECREATE,
    REPACK,
    TOKENIZER_FILE,
    TOKENS_FILE,
    Problem,
    metadata_sha256,
    shard_record,
)
from ..store.shard import Shard
from .content import CHUNK_TOKENS, Vocab

NOT_RECORDED = "not recorded, older dataset"
RANGE_KEYS = {"token_id_range": (TOKENS_FILE, "token ids"), "mask_value_range": (MASK_FILE, "mask values")}


def _recreate(meta: dict) -> str:
    return REPACK if meta.get("kind") == "packed" else RECREATE


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _show(v) -> str:
    """A recorded value for a message: ints with separators, hashes shortened."""
    if _int(v):
        return f"{v:,}"
    if isinstance(v, str) and len(v) > 20:
        return v[:16] + "..."
    return repr(v)


# ---------------------------------------------------------------------- the metadata's own sha256
def check_metadata_checksum(meta: dict) -> tuple[list[Problem], str | None]:
    """The metadata hashes to the sha256 it records. Returns (problems, why it was not
    checked: None when it was)."""
    rec = meta.get(METADATA_CHECKSUM)
    if rec is None:
        return [], NOT_RECORDED
    fix = f"restore {METADATA_FILE} from a good copy of the dataset, or " + _recreate(meta)
    if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str):
        return [Problem("metadata_checksum", METADATA_FILE, METADATA_CHECKSUM, f"{METADATA_CHECKSUM} is {rec!r}, "
                        f"not {{\"version\": {METADATA_CHECKSUM_VERSION}, \"sha256\": ...}}: {METADATA_FILE} was "
                        "edited", fix)], None
    if rec.get("version") != METADATA_CHECKSUM_VERSION:
        return [], f"version {rec.get('version')!r} is unknown to this sftdata"
    got = metadata_sha256(meta)
    if got == rec["sha256"]:
        return [], None
    return [Problem("metadata_checksum", METADATA_FILE, METADATA_CHECKSUM, f"{METADATA_FILE} was edited after it "
                    f"was written: its values hash to {got[:16]}..., the sha256 it records is "
                    f"{rec['sha256'][:16]}...; its counts, sizes, checksums, sources and tokenizer summary can no "
                    "longer be trusted", fix)], None


# ---------------------------------------------------------------------- tokenizer identity
def check_tokenizer_identity(meta: dict | None, state: dict | None, vocab: Vocab | None) -> list[Problem]:
    """The metadata's tokenizer summary agrees with ``tokenizer_state.json`` on every field
    both record, and the state's vocab_size is the rebuilt tokenizer's (``vocab``)."""
    if not isinstance(state, dict):
        return []  # missing or unreadable: the tokenizer check said so
    out = []
    summary = (meta or {}).get("tokenizer")
    if meta is not None and summary is not None and not isinstance(summary, dict):
        out.append(Problem("tokenizer", METADATA_FILE, "tokenizer", f"the tokenizer summary is {summary!r}, not an "
                           "object", f"restore {METADATA_FILE} from a good copy, or " + _recreate(meta)))
    elif isinstance(summary, dict):
        differ = [f"{k} {_show(summary[k])} vs {_show(state[k])}" for k in summary
                  if k in state and summary[k] != state[k]]
        if differ:
            out.append(Problem("tokenizer", METADATA_FILE, "tokenizer", f"the tokenizer recorded in {METADATA_FILE} "
                               f"is not the one in {TOKENIZER_FILE} (metadata vs state: {'; '.join(differ)}): one of "
                               "them was edited, or they come from different datasets",
                               "restore both files from the same good copy of the dataset, or " + _recreate(meta)))
    size = state.get("vocab_size")
    if vocab is not None and _int(size) and size != vocab.size:
        out.append(Problem("tokenizer", TOKENIZER_FILE, "vocab_size", f"{TOKENIZER_FILE} records vocab_size "
                           f"{size:,}, but the tokenizer rebuilt from it has {vocab.size:,} ids: the file was edited",
                           f"restore {TOKENIZER_FILE} from a good copy, or " + _recreate(meta or {})))
    return out


def recorded_vocab(vocab: Vocab | None, meta: dict | None, state: dict | None) -> Vocab | None:
    """``vocab`` (the rebuilt tokenizer's) cut to the smallest vocabulary size recorded in
    the metadata's tokenizer summary or the tokenizer state: every id must lie below all
    of them (when they disagree, the tokenizer check says so)."""
    if vocab is None:
        return None
    summary = (meta or {}).get("tokenizer")
    recorded = [d.get("vocab_size") for d in (summary, state) if isinstance(d, dict)]
    sizes = [vocab.size] + [v for v in recorded if _int(v) and v >= 0]
    return vocab if min(sizes) == vocab.size else replace(vocab, size=min(sizes))


# ---------------------------------------------------------------------- value ranges
def recorded_ranges(meta: dict | None, shard: Shard) -> dict[str, object]:
    """The value ranges the metadata records for ``shard`` (``RANGE_KEYS``); a value may
    be malformed (the ranges check reports it)."""
    rec = shard_record(meta, shard.split, shard.name) or {}
    return {k: rec[k] for k in RANGE_KEYS if k in rec}


def any_ranges(meta: dict | None, shards: list[Shard]) -> bool:
    return any(recorded_ranges(meta, sh) for sh in shards)


def data_ranges(shard: Shard) -> dict[str, tuple[int, int] | None]:
    """The smallest and largest token id and mask value ``shard`` holds (None: no values;
    left out: the file is missing, or an older float32 mask), a chunk at a time."""
    out: dict[str, tuple[int, int] | None] = {}
    for key, arr in (("token_id_range", shard.tokens), ("mask_value_range", shard.mask)):
        if arr is None or (key == "mask_value_range" and arr.dtype != np.uint8):
            continue  # a missing file is the files check's problem
        if arr.size == 0:
            out[key] = None
            continue
        lo, hi = [], []
        for i in range(0, arr.size, CHUNK_TOKENS):  # min and max of a chunk while it is in the cache
            c = np.asarray(arr[i:i + CHUNK_TOKENS])
            lo.append(int(c.min()))
            hi.append(int(c.max()))
        out[key] = (min(lo), max(hi))
    return out


def proven_shards(meta: dict, shards: list[Shard], hashed: list[tuple[str, str, str, str | None]],
                  meta_sealed: bool) -> set[str]:
    """The shards (rel) whose recorded ranges are proven equal to their data without a
    pass over it: the writer measured them on the very bytes it hashed, so when the
    metadata still hashes to its own sha256 (``meta_sealed``) and the shard's tokens and
    mask hash to the recorded sha256 (``hashed``: file, found, recorded, shard rel), the
    ranges agree."""
    if not meta_sealed:
        return set()
    good = {fn for fn, got, want, _ in hashed if got == want}
    out = set()
    for sh in shards:
        files = (shard_record(meta, sh.split, sh.name) or {}).get("files") or {}
        if all(fn in files and sh.file(fn) in good for fn, _ in RANGE_KEYS.values()):
            out.add(sh.rel)
    return out


def check_ranges(meta: dict, shards: list[Shard], vocab_size: int | None,
                 found: dict[str, dict] | None = None) -> list[Problem]:
    """Each shard's recorded ranges: well-formed, token ids below ``vocab_size``, mask
    values within 0..1, and, given ``found`` (shard rel -> ``data_ranges``), equal to the
    data's."""
    out = []
    for sh in shards:
        for key, rng in recorded_ranges(meta, sh).items():
            fn, what = RANGE_KEYS[key]
            where = f"{sh.rel} {key}"
            fix = f"restore {METADATA_FILE} and the shard from a good copy, or " + sh.recreate
            if not (isinstance(rng, list) and len(rng) == 2 and all(_int(v) for v in rng) and 0 <= rng[0] <= rng[1]):
                out.append(Problem("ranges", METADATA_FILE, where, f"{key} of {sh.rel} is {rng!r}, not [smallest, "
                                   f"largest] of its {what}: {METADATA_FILE} was edited", fix, sh.split))
                continue
            lo, hi = rng
            if key == "token_id_range" and vocab_size is not None and hi >= vocab_size:
                out.append(Problem("ranges", METADATA_FILE, where, f"{METADATA_FILE} records token ids up to {hi:,} "
                                   f"in {sh.rel}, past the vocabulary ({vocab_size:,} ids): a loader would refuse "
                                   "the shard", fix, sh.split))
            if key == "mask_value_range" and hi > 1:
                out.append(Problem("ranges", METADATA_FILE, where, f"{METADATA_FILE} records mask values up to {hi} "
                                   f"in {sh.rel}; a mask holds 0 and 1 only: a loader would refuse the shard", fix,
                                   sh.split))
            if found is None or key not in found.get(sh.rel, {}):
                continue  # --quick, proven by the checksums, or the file is missing
            data = found[sh.rel].get(key)
            if data != (lo, hi):
                held = "no values" if data is None else f"{what} {data[0]:,}..{data[1]:,}"
                out.append(Problem("ranges", sh.file(fn), "", f"{sh.file(fn)} holds {held}; {METADATA_FILE} "
                                   f"recorded {lo:,}..{hi:,} ({key}): the data or the metadata changed after "
                                   "they were written", fix, sh.split))
    return out
