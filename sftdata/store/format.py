"""The on-disk format in one place: file names, dtypes, format name and version, the
token-dtype rules, the encoding of ``segments.idx``, the small helpers that read and
write its description files, and ``Problem``: one way a dataset on disk departs from the
format, as data.

Nothing else in sftdata spells a file name or picks a dtype for a file (see the
package docstring for the layout). The reader finds the structural problems
(``scan_dataset``; ``open_dataset`` raises the first), ``verify`` adds what only a full
read finds. Each names the check that found it, the file (relative to the dataset
folder), where (episode or row id, byte offset), what is wrong and what to do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import orjson

from ..errors import UsageError
from ..order.config import TOKEN_DTYPES
from ..packing.layout import Segments
from ..storage import METADATA_FILE, SPLITS

FORMAT_VERSION = 1
TOKENIZER_FILE = "tokenizer_state.json"
REJECTS_FILE = "rejects.jsonl"
SERVING_FILE = "serving.json"  # what an inference config needs (stop ids, pad id, BOS, template); see serving
TOKENS_FILE = "tokens.bin"
MASK_FILE = "mask.bin"
EPISODES_FILE = "episodes.idx"
SOURCES_FILE = "sources.idx"
SEGMENTS_FILE = "segments.idx"  # packed datasets: what rebuilds each row's segments
# A chat template's episode that is one reply's prefix (served per reply because the whole
# render rewrites an earlier reply) trains its last reply only, while the dataset's mask
# rule trains every reply of an episode: its ids cannot say which it is, so a shard holding
# such an episode has this file, uint8 per item (an episode; a packed row's segment: one
# per segments.idx record), 1 = "last reply only" (``MaskRule`` re-derives the mask with
# that flag). Written only where a shard holds a flagged item, listed in the shard's
# record; a shard without it (every older dataset) reads as all 0. A dataset holding one
# records ``LAST_REPLY_KEY`` in its metadata (the number of flagged items per split).
LAST_REPLY_FILE = "last_reply.bin"
LAST_REPLY_DTYPE = np.dtype(np.uint8)
LAST_REPLY_KEY = "last_reply_only"
STAGING_SPLIT = "_staging"  # in a run's staging folder: episodes in input order, before the train/val split
PARTS_DIR = "_parts"  # in a run's staging folder: where an engine's tasks write (removed before the commit)
STOP_FILE = "STOP"  # in PARTS_DIR: the run has stopped early, tasks write nothing more
# 16M tokens (64 MB of uint32 ids): a terabyte's dataset is ~13,000 shards, tasks enough for
# pack and verify on any cluster; 100M was the default before (``--shard-tokens 100000000``)
DEFAULT_SHARD_TOKENS = 16_000_000
# dataset_metadata.json cannot list its own sha256 in "files": it records, under this key,
# {"version": 1, "sha256": sha256 of its canonical JSON without this key} (``metadata_sha256``)
# so that an edit of any value shows; datasets written before it have no such key
METADATA_CHECKSUM = "metadata_checksum"
METADATA_CHECKSUM_VERSION = 1

# ---------------------------------------------------------------------- kinds
# dataset_metadata.json "kind". The chat SFT kinds keep format_version 1; the preference
# and RL kinds are format_version 2, so an sftdata that predates them says "upgrade"
# instead of misreading them as episodes.
KIND_EPISODES = "episodes"
KIND_PACKED = "packed"
KIND_PAIRS = "pairs"  # DPO/ORPO/IPO: per pair THREE consecutive episodes: prompt, chosen, rejected
KIND_KTO = "kto"  # per row TWO consecutive episodes: prompt, completion; LABELS_FILE per shard
KIND_PROMPTS = "prompts"  # RL (GRPO): per row ONE episode, the prompt; COLUMNS_FILE per shard
PREFERENCE_FORMAT_VERSION = 2
# an episodes or packed dataset holding an episode flagged "last reply only" (LAST_REPLY_FILE)
# is format_version 3: an sftdata that predates the flags says "upgrade" instead of
# re-deriving its masks without them (every reply trained); one without stays 1
LAST_REPLY_FORMAT_VERSION = 3
# an episodes or packed dataset whose episodes hold images or videos carries a media table per
# shard (MEDIA_FILE) and is format_version 4: an sftdata that predates it says "upgrade"
# instead of reading media placeholder tokens as text; one without media keeps its version
MEDIA_FORMAT_VERSION = 4
MEDIA_FILE = "media.jsonl"  # one line per media item: sftdata.media.item.MediaSpan.row, "episode" shard-local
MEDIA_KEY = "media"  # a shard record's / the metadata's count of media items
KIND_FORMAT_VERSIONS = {KIND_EPISODES: FORMAT_VERSION, KIND_PACKED: FORMAT_VERSION, KIND_PAIRS: PREFERENCE_FORMAT_VERSION,
                        KIND_KTO: PREFERENCE_FORMAT_VERSION, KIND_PROMPTS: PREFERENCE_FORMAT_VERSION}
KNOWN_FORMAT_VERSIONS = (FORMAT_VERSION, PREFERENCE_FORMAT_VERSION, LAST_REPLY_FORMAT_VERSION, MEDIA_FORMAT_VERSION)
ROW_KINDS = (KIND_PAIRS, KIND_KTO, KIND_PROMPTS)  # kinds whose rows are groups of episodes
ENTRIES_PER_ROW = {KIND_PAIRS: 3, KIND_KTO: 2, KIND_PROMPTS: 1}  # episodes.idx entries per row
PAIR_PARTS = ("prompt", "chosen", "rejected")  # the order of a pair's entries
KTO_PARTS = ("prompt", "completion")
# sources.idx of a row kind: ONE uint64 per row (the input record), not one per episode
LABELS_FILE = "labels.bin"  # kto: uint8 per row, 1 desirable, 0 undesirable
LABEL_DTYPE = np.dtype(np.uint8)
COLUMNS_FILE = "columns.jsonl"  # prompts: one line per row, {"row", "record", "columns": {name: JSON text}}
# the metadata of a row kind adds "pairs"/"rows": {"train": N, "val": M} and "truncation" (the policy used)
TRUNCATION_POLICIES = ("keep-end", "keep-start", "drop")  # what happens to a prompt over its budget


def format_version_for(kind: str, flagged: bool = False, media: bool = False) -> int:
    """The format_version a folder of ``kind`` is written with (2: pairs, kto, prompts;
    4: episodes or packed holding media (``media``, ``MEDIA_FILE``); 3: episodes or packed
    holding an episode flagged "last reply only" (``flagged``, ``LAST_REPLY_FILE``); 1:
    episodes, packed and every other folder sftdata writes, e.g. an export)."""
    if media and kind in (KIND_EPISODES, KIND_PACKED):
        return MEDIA_FORMAT_VERSION
    if flagged and kind in (KIND_EPISODES, KIND_PACKED):
        return LAST_REPLY_FORMAT_VERSION
    return KIND_FORMAT_VERSIONS.get(kind, FORMAT_VERSION)


def flagged_count(shards: list[dict]) -> dict:
    """``{LAST_REPLY_KEY: n}`` of a split whose shard records (``shards``) flag ``n`` items
    "last reply only", or ``{}`` when none does (the split's metadata then has no such key)."""
    n = sum(s.get(LAST_REPLY_KEY, 0) for s in shards if isinstance(s, dict))
    return {LAST_REPLY_KEY: n} if n else {}


def media_count(shards: list[dict]) -> dict:
    """``{MEDIA_KEY: {"items", "images", "videos", "tokens"}}`` summed over shard (or split)
    records that hold media items, or ``{}`` when none does (the record then has no such key)."""
    held = [s[MEDIA_KEY] for s in shards if isinstance(s, dict) and isinstance(s.get(MEDIA_KEY), dict)]
    if not held:
        return {}
    return {MEDIA_KEY: {k: sum(int(h.get(k, 0)) for h in held) for k in ("items", "images", "videos", "tokens")}}


def has_media(meta: dict | None) -> bool:
    """Whether a dataset's metadata records media items (``MEDIA_KEY``: ``{"items", "images",
    "videos", "tokens"}``): its shards then each hold a ``MEDIA_FILE`` and it is
    ``MEDIA_FORMAT_VERSION``."""
    media = (meta or {}).get(MEDIA_KEY)
    return isinstance(media, dict) and bool(media.get("items"))


def has_last_reply_flags(meta: dict) -> bool:
    """Whether a dataset's metadata records an item flagged "last reply only" in a split."""
    return any(isinstance(s, dict) and s.get(LAST_REPLY_KEY) for s in (meta.get("splits") or {}).values())


def row_shard_files(kind: str) -> tuple[str, ...]:
    """The files every shard folder of a row kind holds: the episode files, plus
    ``labels.bin`` (kto) or ``columns.jsonl`` (prompts)."""
    extra = {KIND_KTO: (LABELS_FILE,), KIND_PROMPTS: (COLUMNS_FILE,)}.get(kind, ())
    return (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SOURCES_FILE, *extra)


# ---------------------------------------------------------------------- dtypes
IDX_DTYPE = np.dtype("<u8")  # episodes.idx, sources.idx, segments.idx
EPISODE_RECORD_BYTES = 2 * IDX_DTYPE.itemsize  # (start, length)
MASK_DTYPE = np.dtype(np.uint8)  # what sftdata writes; older layouts may hold float32
OLD_MASK_DTYPE = np.dtype("<f4")
FLAT_TOKEN_DTYPE = np.dtype("<u4")  # the older flat layout records none: uint32 unless told


def token_dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32; little-endian."""
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")


def mask_dtype_for(mask_bytes: int, num_tokens: int) -> np.dtype:
    """uint8, unless the size says float32 (an older layout: 4 bytes per token)."""
    return OLD_MASK_DTYPE if num_tokens and mask_bytes == 4 * num_tokens else MASK_DTYPE


def choose_token_dtype(meta: dict | None, tokenizer_state: dict | None, override=None
                       ) -> tuple[np.dtype, list[str], bool]:
    """The dtype of ``tokens.bin``: the metadata's, else ``override`` (older flat
    layouts), else what the recorded tokenizer needs, else uint32.

    Returns (dtype, what is wrong with the metadata's dtype, whether uint32 was a guess).
    """
    if meta is not None and "token_dtype" in meta:
        try:
            dt = np.dtype(meta["token_dtype"]).newbyteorder("<")
        except (TypeError, ValueError):
            return FLAT_TOKEN_DTYPE, [f"token_dtype {meta['token_dtype']!r} is not a numpy dtype"], False
        if dt.kind != "u" or dt.itemsize not in (2, 4):
            return FLAT_TOKEN_DTYPE, [f"token_dtype {meta['token_dtype']!r} is not uint16 or uint32"], False
        vocab = (tokenizer_state or {}).get("vocab_size")
        if isinstance(vocab, int) and dt.itemsize < token_dtype_for(vocab).itemsize:
            return dt, [f"token_dtype {dt.name} cannot hold the {vocab:,} ids of the tokenizer"], False
        return dt, [], False
    if override is not None:
        try:
            return np.dtype(override).newbyteorder("<"), [], False
        except TypeError:
            raise UsageError(f"token dtype must be {' or '.join(TOKEN_DTYPES)}, got {override!r}") from None
    vocab = (tokenizer_state or {}).get("vocab_size")
    if isinstance(vocab, int):  # metadata lost: the tokenizer still says
        return token_dtype_for(vocab), [], False
    return FLAT_TOKEN_DTYPE, [], True


# ---------------------------------------------------------------------- packed layout
# A packed split's shard holds fixed-length rows (row_len = block_size + 1 tokens):
#   tokens.bin    rows x row_len token ids (padding included)
#   mask.bin      rows x row_len uint8, 1 = trained target (recomputed per segment)
#   episodes.idx  (start, row_len) per row, so generic readers see one "episode" per row
#   segments.idx  uint64 x 7 per segment, sorted by (row, offset), SEGMENT_FIELDS:
#                 row (local to the shard), offset in the row, length (with injected
#                 tokens), prefix (injected tokens at its start), episode (global episode
#                 id in the source split), episode_start (first episode token), source
#                 (input record number of the episode, NO_SOURCE when unknown)
SEGMENT_FIELDS = ("row", "offset", "length", "prefix", "episode", "episode_start", "source")
SEGMENT_RECORD_BYTES = len(SEGMENT_FIELDS) * IDX_DTYPE.itemsize
NO_SOURCE = np.iinfo(np.uint64).max
CLIP = np.uint64(2**62)  # damaged values stay large and positive (int64 would wrap them negative)


def encode_segments(seg: Segments) -> np.ndarray:
    """(k, 7) int64 records in ``SEGMENT_FIELDS`` order, the fields of ``packing.Segments``
    (what ``PackedSplitWriter.add_rows`` takes; it writes ``source`` -1 as ``NO_SOURCE``)."""
    return np.stack([np.asarray(getattr(seg, f), dtype=np.int64) for f in SEGMENT_FIELDS], axis=1)


def decode_segments(records: np.ndarray) -> Segments:
    """``Segments`` of (k, 7) uint64 records as stored: ``NO_SOURCE`` becomes -1, and a
    damaged value past 2**62 is clipped to 2**62 (so checks see it out of range)."""
    a = np.asarray(records)
    if a.ndim != 2 or a.shape[1] != len(SEGMENT_FIELDS):
        raise ValueError(f"segment records must be (k, {len(SEGMENT_FIELDS)}), got shape {a.shape}")
    out = np.minimum(a, CLIP).astype(np.int64)
    col = {f: np.ascontiguousarray(out[:, i]) for i, f in enumerate(SEGMENT_FIELDS)}
    col["source"][a[:, SEGMENT_FIELDS.index("source")] == NO_SOURCE] = -1
    return Segments(**col)


def packed_row_len(meta: dict | None) -> int | None:
    """``packing.row_len`` of a packed dataset's metadata, or None when it is unusable."""
    row_len = ((meta or {}).get("packing") or {}).get("row_len")
    return row_len if isinstance(row_len, int) and not isinstance(row_len, bool) and 2 <= row_len < 2**40 else None


# ---------------------------------------------------------------------- files
def shard_name(i: int) -> str:
    return f"shard_{i:05d}"


def dumps_json(obj) -> bytes:
    """Deterministic, readable JSON (sorted keys, 2-space indent, trailing newline)."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def metadata_sha256(meta: dict) -> str:
    """sha256 of ``meta`` without its ``METADATA_CHECKSUM``, as canonical JSON (version 1:
    compact, keys sorted at every level, of the values as parsed), so that re-indenting or
    reordering the file changes nothing and changing any value changes the hash."""
    body = {k: v for k, v in meta.items() if k != METADATA_CHECKSUM}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def detect_layout(root: Path) -> str | None:
    """``sharded`` (split/shard_*/), ``flat`` (split/tokens.bin) or None."""
    for split in SPLITS:
        d = root / split
        if any(d.glob("shard_*/")) if d.is_dir() else False:
            return "sharded"
    for split in SPLITS:
        if (root / split / TOKENS_FILE).is_file():
            return "flat"
    return None


def dataset_holding(path: str | Path) -> Path | None:
    """The dataset folder ``path`` would be written inside (the nearest folder above it
    that holds a dataset's metadata or shards), or None. A dataset folder holds only the
    files its metadata lists, so no command writes anything else there."""
    for folder in Path(path).resolve().parents:
        if (folder / METADATA_FILE).is_file() or detect_layout(folder) is not None:
            return folder
    return None


def list_shards(root: Path, split: str) -> list[Path]:
    d = root / split
    return sorted(p for p in d.glob("shard_*") if p.is_dir()) if d.is_dir() else []


def shard_files(packed: bool) -> tuple[str, ...]:
    """The files every shard folder holds (an older flat split folder: tokens and index only)."""
    return (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SEGMENTS_FILE if packed else SOURCES_FILE)


def iter_files(root: Path) -> Iterable[Path]:
    """Every file of a dataset below ``root`` (for checksums), in a stable order."""
    return sorted(p for p in root.rglob("*") if p.is_file())


def shard_record(meta: dict | None, split: str, name: str) -> dict | None:
    """The metadata's record of one shard (its counts and files), or None."""
    shards = ((meta or {}).get("splits", {}).get(split) or {}).get("shards") or []
    for s in shards:
        if isinstance(s, dict) and s.get("name") == name:
            return s
    return None


def recorded_files(root: Path, meta: dict, shards) -> list[tuple[str, Path, dict, str | None]]:
    """Every file ``meta`` records a size and sha256 for, as (name relative to ``root``,
    path, the record, the folder of its shard relative to ``root`` or None)."""
    out = [(fn, root / fn, rec, None) for fn, rec in (meta.get("files") or {}).items()]
    for sh in shards:
        for fn, rec in ((shard_record(meta, sh.split, sh.name) or {}).get("files") or {}).items():
            out.append((f"{sh.rel}/{fn}", sh.path / fn, rec, sh.rel))
    return out


RECREATE = "re-create the dataset with `sftdata prepare-chat` / `sftdata prepare-tool`"
REPACK = "re-create it with `sftdata pack`"
RESTORE = "restore it from a good copy of the dataset, or "  # the fix of a damaged file, before how to re-create it


@dataclass(frozen=True)
class Problem:
    """One thing wrong: which check found it, in which file, where, what, and what to do."""

    check: str
    file: str  # relative to the dataset folder
    where: str  # "episode 12, byte 192 of episodes.idx" ... or ""
    message: str
    fix: str
    split: str | None = None
    episode: int | None = None  # global episode (packed: row) id within ``split``
    byte: int | None = None  # byte offset within ``file``
    code: str = ""  # finer kind within the check (index: out_of_bounds, overlap, gap ...)

    def __str__(self) -> str:
        loc = f"{self.file} ({self.where})" if self.where else self.file
        return f"{loc}: {self.message}. To fix: {self.fix}"

    def as_dict(self) -> dict:
        return asdict(self)


def more_like_it(n: int, what: str = "episodes") -> str:
    """A problem names the first offender in a shard; this says how many more there are."""
    return f" ({n - 1:,} more {what} like it in this shard)" if n > 1 else ""


def in_check_order(problems: list[Problem], order) -> list[Problem]:
    """``problems`` sorted by the position of their check in ``order`` (stable: within a
    check, the order they were found in)."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(problems, key=lambda p: rank[p.check])


MIXTURE_FORMAT = "sftdata-mixture"  # a mixture file's "format" (sftdata mix; ``mixture``)
MAX_MIXTURE_BYTES = 1 << 20  # a mixture file is small; a larger file is something else


def is_mixture_file(path: str | Path) -> bool:
    """True when ``path`` is a file holding an sftdata mixture (its ``format``)."""
    p = Path(path)
    try:
        if not p.is_file() or p.stat().st_size > MAX_MIXTURE_BYTES:
            return False
        obj = orjson.loads(p.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(obj, dict) and obj.get("format") == MIXTURE_FORMAT


# ---------------------------------------------------------------------- field types
# The types of the description files' fields that readers rely on, checked once where
# the files are read (``reader``, ``serving_file``, ``clean_fields``): a field of another type (a count that
# is a string, a token id that is a list, ``stop_strings: true``) is a ``Problem`` naming
# the file and the field, and the reader goes on without it, never an error deep inside a
# command.
#
# A schema is data: a dict of optional keys (``{"name": STR}``: when present, a string),
# ``Map(spec)`` (an object of any keys, each value ``spec``), ``List(spec)``, ``Opt(spec)``
# (``spec`` or null) or a leaf (``COUNT``, ``INT``, ``ID``, ``STR``, ``BOOL``, ``NUMBER``,
# ``OBJECT``, ``ARRAY``). A missing key is never a problem here: older datasets
# lack newer fields, and the checks that need a field say so.
#
ID_LIMIT = 2**32  # token ids are stored as uint16 or uint32
INT_LIMIT = 2**63  # what an int64 holds: larger values would wrap in numpy


@dataclass(frozen=True)
class Leaf:
    kind: str
    words: str  # what it must be, for a message: "a whole number >= 0"

    def ok(self, v) -> bool:
        is_int = isinstance(v, int) and not isinstance(v, bool)
        return {
            "count": is_int and 0 <= v < INT_LIMIT,
            "int": is_int and -INT_LIMIT <= v < INT_LIMIT,
            "id": is_int and 0 <= v < ID_LIMIT,
            "str": isinstance(v, str),
            "bool": isinstance(v, bool),
            "number": (is_int or isinstance(v, float)) and not isinstance(v, bool),
            "object": isinstance(v, dict),
            "array": isinstance(v, list),
            "ids": (is_int and 0 <= v < ID_LIMIT) or (isinstance(v, list) and all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < ID_LIMIT for i in v)),
        }[self.kind]


@dataclass(frozen=True)
class Map:
    value: object


@dataclass(frozen=True)
class List:
    item: object


@dataclass(frozen=True)
class Opt:
    spec: object


COUNT = Leaf("count", "a whole number >= 0")
INT = Leaf("int", "a whole number")
ID = Leaf("id", "a token id (a whole number from 0 to 2**32 - 1)")
STR = Leaf("str", "a string")
BOOL = Leaf("bool", "true or false")
NUMBER = Leaf("number", "a number")
OBJECT = Leaf("object", "a JSON object")
ARRAY = Leaf("array", "a JSON array")
IDS = Leaf("ids", "a token id or a list of token ids")  # generation_config.json's eos_token_id may be either

# ---------------------------------------------------------------- dataset_metadata.json
FILE_RECORD = {"bytes": COUNT, "sha256": STR}
MEDIA_COUNTS = {"items": COUNT, "images": COUNT, "videos": COUNT, "tokens": COUNT}  # MEDIA_KEY's value
ITEM_COUNTS = {"episodes": COUNT, "tokens": COUNT, "trained_tokens": COUNT, "rows": COUNT, "segments": COUNT,
               "pairs": COUNT}
# the ranges: verify's and the loader's own checks
SHARD = {"name": STR, "files": Map(FILE_RECORD), LAST_REPLY_KEY: COUNT, **ITEM_COUNTS}
SPLIT = {"shards": List(SHARD), "row_len": COUNT, LAST_REPLY_KEY: COUNT, MEDIA_KEY: MEDIA_COUNTS, **ITEM_COUNTS}
SOURCE = {"path": STR, "bytes": Opt(COUNT), "sha256": Opt(STR), "records": Opt(COUNT), "first_record": Opt(COUNT)}
COUNTS = {"episodes": COUNT, "records_read": COUNT, "records_truncated": COUNT, "pairs_dropped": COUNT,
          "per_reply_automatic": COUNT,
          "rejected": Map(COUNT), "repaired": Map(COUNT), "turns": Map(COUNT)}
PACKING = {"block_size": COUNT,  # row_len: ``format.packed_row_len`` "pad_token_id": Opt(ID), "pad_seq_id": INT, "strategy": STR,
           "overlong": STR, "seed": INT, "shard_tokens": COUNT, "segment_fields": List(STR)}
TOKENIZER_SUMMARY = {"eos_id": Opt(ID), "bos_id": Opt(ID), "vocab_size": COUNT, "name": Opt(STR),
                     "ranks_sha256": Opt(STR), "source": Opt(STR)}
METADATA = {
    "token_dtype": STR, "created_by": STR,  # format, format_version, kind: the reader's own checks
    "files": Map(FILE_RECORD), "splits": Map(SPLIT), "counts": COUNTS, "packing": PACKING,
    "options": OBJECT, "sources": List(SOURCE), "build": OBJECT,
    "tokenizer": TOKENIZER_SUMMARY, "tokenizer_identity": Opt(OBJECT), "warnings": ARRAY, "report": OBJECT,
    "source": {"path": STR, "kind": STR, "metadata_sha256": STR, "counts": COUNTS}, "pairs": Map(COUNT),
    "rows": Map(COUNT), MEDIA_KEY: MEDIA_COUNTS,
}

# ---------------------------------------------------------------- tokenizer_state.json
TOKENIZER_STATE = {
    "special_tokens": Map(ID), "base_special_tokens": Map(ID), "added_tokens": Map(ID), "eos_id": Opt(ID),
    "bos_id": Opt(ID), "pad_id": Opt(ID), "vocab_size": COUNT, "name": Opt(STR), "path": Opt(STR),
    "pat_str": Opt(STR), "ranks_sha256": Opt(STR), "source": Opt(STR), "format": STR, "version": INT,
    "kind": Opt(STR), "mask_rule": OBJECT, "engine": OBJECT, "token_strings": Map(Opt(STR)),
    "processor": OBJECT,  # a dataset with media: the pinned processor settings (sftdata.media.settings)
}

# ---------------------------------------------------------------- serving.json
SERVING = {
    "format": STR, "version": INT, "stop_ids": List(ID), "stop_strings": List(STR), "pad_id": Opt(ID),
    "pad_string": Opt(STR), "pad_is_stop": BOOL, "add_special_tokens": BOOL, "chat_format": STR,
    "generation_prompt": Opt(STR),
    "bos": {"id": Opt(ID), "policy": STR, "string": Opt(STR)},
    "generation_config": {"bos_token_id": Opt(ID), "eos_token_id": Opt(IDS), "pad_token_id": Opt(ID)},
    "tokenizer": {"kind": STR, "name": Opt(STR), "sha256": Opt(STR)}, "marker_rule": Opt(Map(STR)),
}


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return f"the number {v}" if abs(v) < 10**12 else "a number out of range"
    return {float: "a decimal number", str: "a string", list: "an array", dict: "an object"}.get(type(v), "junk")


def _wrong(spec, v) -> str | None:
    """What ``spec`` wants when ``v`` is not of its shape at this level, else None."""
    if isinstance(spec, Opt):
        return None if v is None else _wrong(spec.spec, v)
    if isinstance(spec, Leaf):
        return None if spec.ok(v) else spec.words
    if isinstance(spec, (dict, Map)):
        return None if isinstance(v, dict) else "a JSON object"
    return None if isinstance(v, list) else "a JSON array"


def _clean(value, spec, path: str, out: list[tuple[str, str, object]]):
    """``value`` without the parts that are not of ``spec``'s shape (a dict's key, a list's
    item removed), each recorded in ``out`` as (path, what it must be, the value)."""
    if isinstance(spec, Opt):
        return None if value is None else _clean(value, spec.spec, path, out)
    if isinstance(spec, dict):
        return {k: _clean(v, spec[k], _at(path, k), out) if k in spec else v for k, v in value.items()
                if k not in spec or _kept(v, spec[k], _at(path, k), out)}
    if isinstance(spec, Map):
        return {k: _clean(v, spec.value, _at(path, k), out) for k, v in value.items()
                if _kept(v, spec.value, _at(path, k), out)}
    if isinstance(spec, List):
        return [_clean(v, spec.item, f"{path}[{i}]", out) for i, v in enumerate(value)
                if _kept(v, spec.item, f"{path}[{i}]", out)]
    return value


def _kept(value, spec, path: str, out: list) -> bool:
    want = _wrong(spec, value)
    if want is not None:
        out.append((path, want, value))
    return want is None


def _at(path: str, key) -> str:
    key = str(key)
    if "." in key or not key:  # a file name as a key: files["serving.json"].bytes
        return f'{path}["{key}"]'
    return f"{path}.{key}" if path else key


def clean_fields(obj: dict, schema: dict, file: str, fix: str, check: str = "metadata",
                 named: int = 3) -> tuple[dict, list[Problem]]:
    """``obj`` (a parsed JSON object) without the fields that are not of the shape
    ``schema`` gives (so every reader sees them as absent, as in an older dataset), and
    one ``Problem`` for each of the first ``named`` of them, then one saying how many more.

    >>> meta, problems = clean_fields({"splits": {"train": {"episodes": "3", "tokens": 9}}}, METADATA,
    ...                               "dataset_metadata.json", "fix")
    >>> meta, [p.where for p in problems]
    ({'splits': {'train': {'tokens': 9}}}, ['splits.train.episodes'])
    """
    found: list[tuple[str, str, object]] = []
    kept = _clean(obj, schema, "", found)
    out = [Problem(check, file, path, f"{path} is {_kind(v)}, not {want}: the file was damaged or edited", fix,
                   code="field_type") for path, want, v in found[:named]]
    if len(found) > named:
        out.append(Problem(check, file, "", f"{len(found) - named} more field(s) of the wrong type", fix,
                           code="field_type"))
    return kept, out
