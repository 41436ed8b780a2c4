"""The array-level checks of ``verify``: each takes one shard (a ``Part``) and returns
the problems it finds, vectorised over the episode index and the token data.

A problem reports the first offender of its kind in a shard and how many more there
are, so a thoroughly broken shard gives a short report, not a million lines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .store import EPISODES_FILE, MASK_FILE, METADATA_FILE, SEGMENT_FIELDS, SEGMENTS_FILE, SOURCES_FILE, TOKENS_FILE
from .tokenizer import MarkerIds

RECREATE = "re-create the dataset with `sftdata prepare-chat` / `sftdata prepare-tool`"
REPACK = "re-create it with `sftdata pack`"
# tokens checked at once (whole episodes): about 5 MB of tokens + mask. Small enough that
# the temporaries are reused by the allocator instead of mapped afresh (page faults cost
# more than the arithmetic on virtual machines), large enough to amortise the calls.
CHUNK_TOKENS = 1 << 20


@dataclass(frozen=True)
class Problem:
    """One thing wrong: which check found it, in which file, where, what, and what to do."""

    check: str
    file: str  # relative to the dataset folder
    where: str  # "episode 12, byte 192 of episodes.idx" ... or ""
    message: str
    fix: str
    split: str | None = None
    episode: int | None = None  # global episode id within ``split``
    byte: int | None = None  # byte offset within ``file``
    code: str = ""  # finer kind within the check (index: out_of_bounds, overlap, gap ...)

    def __str__(self) -> str:
        loc = f"{self.file} ({self.where})" if self.where else self.file
        return f"{loc}: {self.message}. To fix: {self.fix}"

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Vocab:
    markers: MarkerIds
    size: int

    def name(self, token_id: int) -> str:
        names = {v: k for k, v in self.markers.as_dict().items()}
        return names.get(int(token_id), f"id {int(token_id)}")


@dataclass
class Part:
    """One shard folder (or a flat layout's split folder) and what could be read of it."""

    split: str
    name: str
    rel: str  # folder relative to the dataset root
    dir: Path
    first_gid: int
    token_dtype: np.dtype
    meta: dict | None = None  # the metadata's record of this shard
    tokens: np.ndarray | None = None
    mask: np.ndarray | None = None
    episodes: np.ndarray = field(default_factory=lambda: np.empty((0, 2), np.uint64))
    sources: np.ndarray | None = None
    segments: np.ndarray | None = None  # packed: (k, 7) uint64, store.SEGMENT_FIELDS
    notes: list[str] = field(default_factory=list)
    # set by check_index
    starts: np.ndarray | None = None
    lengths: np.ndarray | None = None
    usable: np.ndarray | None = None  # in bounds and non-empty
    segments_ok: bool = False  # set by verify_packed.check_segments
    recreate: str = RECREATE  # how to make this shard again

    @property
    def num_episodes(self) -> int:
        return int(self.episodes.shape[0])

    @property
    def num_tokens(self) -> int:
        return 0 if self.tokens is None else int(self.tokens.shape[0])

    @property
    def data_bytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.tokens, self.mask) if a is not None)

    def file(self, fn: str) -> str:
        return f"{self.rel}/{fn}"

    def at(self, i: int, fn: str = EPISODES_FILE, byte: int | None = None) -> dict:
        """Problem location fields for local episode ``i``."""
        gid = self.first_gid + int(i)
        byte = 16 * int(i) if byte is None else int(byte)
        return {"where": f"episode {gid} of {self.split}, byte {byte:,} of {fn}", "split": self.split,
                "episode": gid, "byte": byte}


def range_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``s, s+1, ..., s+l-1`` of every (s, l), concatenated, vectorised
    (``packing.gather_ranges`` without the gather, for destinations)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return offsets + np.arange(int(lengths.sum()), dtype=np.int64)


def more_like_it(n: int, what: str = "episodes") -> str:
    return f" ({n - 1:,} more {what} like it in this shard)" if n > 1 else ""


def check_shard_list(meta: dict, shards_on_disk: dict[str, list[str]]) -> list[Problem]:
    """Shards the metadata lists but the disk lacks, and shards on disk it does not list."""
    out = []
    recreate = REPACK if meta.get("kind") == "packed" else RECREATE
    for split, names in shards_on_disk.items():
        recorded = [s.get("name") for s in ((meta.get("splits") or {}).get(split) or {}).get("shards") or []]
        for name in recorded:
            if name not in names:
                out.append(Problem("files", f"{split}/{name}", "", f"shard folder {split}/{name}, listed in "
                                   f"{METADATA_FILE}, is missing", "restore it, or " + recreate))
        for name in names:
            if name not in recorded:
                out.append(Problem("files", f"{split}/{name}", "", f"shard folder {split}/{name} is not listed in "
                                   f"{METADATA_FILE}: it was added after prepare (from another dataset?)",
                                   f"remove {split}/{name}, or " + recreate))
    for split in (meta.get("splits") or {}):
        if split not in shards_on_disk:
            out.append(Problem("files", split, "", f"split {split}, listed in {METADATA_FILE}, has no shard on disk",
                               "restore it, or " + recreate))
    return out


def check_sizes(part: Part) -> list[Problem]:
    """Whole values in every file, tokens/mask/sources counts agree, sizes equal the record."""
    out = []
    d, itemsize = part.dir, part.token_dtype.itemsize

    def size(fn):
        return (d / fn).stat().st_size if (d / fn).is_file() else None

    ts, ms, es, _ss = size(TOKENS_FILE), size(MASK_FILE), size(EPISODES_FILE), size(SOURCES_FILE)
    if ts is not None and ts % itemsize:
        out.append(Problem("sizes", part.file(TOKENS_FILE), "", f"{ts:,} bytes is not a whole number of "
                           f"{part.token_dtype.name} tokens ({itemsize} bytes each): the file is truncated "
                           "(or the token dtype is wrong)", part.recreate, part.split, byte=ts - ts % itemsize))
    n = part.num_tokens
    if ms is not None and part.tokens is not None and ms not in (n, 4 * n):
        out.append(Problem("sizes", part.file(MASK_FILE), "", f"{ms:,} mask bytes for the {n:,} tokens of "
                           f"{TOKENS_FILE}: tokens and mask differ in count (one is truncated, or they come from "
                           "different shards)", part.recreate, part.split))
    if es is not None and es % 16:
        out.append(Problem("sizes", part.file(EPISODES_FILE), "", f"{es:,} bytes is not a multiple of 16 "
                           "(uint64 start, length pairs): the index is truncated", part.recreate, part.split,
                           byte=es - es % 16))
    gs = size(SEGMENTS_FILE)
    if gs is not None and gs % (8 * len(SEGMENT_FIELDS)):
        out.append(Problem("sizes", part.file(SEGMENTS_FILE), "", f"{gs:,} bytes is not a multiple of "
                           f"{8 * len(SEGMENT_FIELDS)} ({len(SEGMENT_FIELDS)} uint64 per segment): the index is "
                           "truncated", "re-create it with `sftdata pack`", part.split,
                           byte=gs - gs % (8 * len(SEGMENT_FIELDS))))
    if part.sources is not None and part.sources.shape[0] != part.num_episodes:
        out.append(Problem("sizes", part.file(SOURCES_FILE), "", f"{part.sources.shape[0]:,} record numbers for "
                           f"{part.num_episodes:,} episodes: there must be exactly one per episode",
                           part.recreate, part.split))
    recorded = (part.meta or {}).get("files") or {}
    off = [(fn, size(fn), r["bytes"]) for fn, r in recorded.items()
           if isinstance(r, dict) and size(fn) is not None and r.get("bytes") is not None and size(fn) != r["bytes"]]
    if len(recorded) >= 2 and len(off) == len(recorded):
        out.append(Problem("sizes", part.rel, "", f"every file of {part.rel} differs in size from what "
                           f"{METADATA_FILE} recorded ({', '.join(f'{fn} {a:,} vs {b:,} bytes' for fn, a, b in off)})"
                           ": the shard was replaced, e.g. by a shard of another dataset",
                           "restore this shard from this dataset's copy, or " + part.recreate, part.split))
    else:
        for fn, a, b in off:
            how = "truncated" if a < b else "longer than written"
            out.append(Problem("sizes", part.file(fn), "", f"{a:,} bytes; {METADATA_FILE} recorded {b:,}: the file "
                               f"is {how}", "restore the file from a good copy, or " + part.recreate, part.split,
                               byte=min(a, b)))
    return out


def check_index(part: Part) -> list[Problem]:
    """Episodes in bounds, sorted, contiguous and non-overlapping; none empty.

    Each problem has a ``code``: out_of_bounds, empty, overlap (these break training),
    unsorted, gap, leading_gap, trailing_tokens (these only waste or reorder tokens)."""
    ep, n, ntok = part.episodes, part.num_episodes, part.num_tokens
    if part.mask is not None:
        ntok = min(ntok, int(part.mask.shape[0]))  # episodes past the mask's end cannot be checked
    cap = np.uint64(ntok + 1)  # clip first: uint64 sums must not wrap around
    s = np.minimum(ep[:, 0], cap).astype(np.int64)
    ln = np.minimum(ep[:, 1], cap).astype(np.int64)
    e = s + ln
    oob = e > ntok
    part.starts, part.lengths, part.usable = s, ln, ~oob & (ln > 0)
    out = []
    fix = f"{EPISODES_FILE} is damaged or belongs to other tokens: restore the shard, or " + RECREATE
    g = part.first_gid

    def add(code: str, i: int, message: str) -> None:
        loc = part.at(i) if n else {"where": "", "split": part.split}
        out.append(Problem("index", part.file(EPISODES_FILE), message=message, fix=fix, code=code, **loc))

    bad = np.flatnonzero(oob)
    if bad.size:
        i = int(bad[0])
        a, b = int(ep[i, 0]), int(ep[i, 0]) + int(ep[i, 1])
        add("out_of_bounds", i, f"episode {g + i} spans tokens [{a:,}, {b:,}) but the shard holds {ntok:,} "
                                f"tokens: the record points past the end{more_like_it(bad.size)}")
    bad = np.flatnonzero(ln == 0)
    if bad.size:
        add("empty", int(bad[0]), f"episode {g + int(bad[0])} has length 0{more_like_it(bad.size)}")
    if n >= 2:
        pair = ~oob[1:] & ~oob[:-1]
        back = np.flatnonzero(pair & (s[1:] < s[:-1]))
        over = np.flatnonzero(pair & (s[1:] >= s[:-1]) & (s[1:] < e[:-1]))
        gap = np.flatnonzero(pair & (s[1:] > e[:-1]))
        if back.size:
            i = int(back[0]) + 1
            add("unsorted", i, f"episode {g + i} starts at token {s[i]:,}, before episode {g + i - 1} (token "
                               f"{s[i - 1]:,}): {EPISODES_FILE} is not sorted{more_like_it(back.size)}")
        if over.size:
            i = int(over[0]) + 1
            add("overlap", i, f"episode {g + i} starts at token {s[i]:,}, inside episode {g + i - 1} (tokens "
                              f"[{s[i - 1]:,}, {e[i - 1]:,})): the episodes overlap, so tokens would be trained "
                              f"twice and conversations run into each other{more_like_it(over.size)}")
        if gap.size:
            i = int(gap[0]) + 1
            add("gap", i, f"tokens [{e[i - 1]:,}, {s[i]:,}) between episodes {g + i - 1} and {g + i} belong to "
                          f"no episode: the index is not contiguous{more_like_it(gap.size, 'gaps')}")
    if n and not oob[0] and s[0] > 0:
        add("leading_gap", 0, f"tokens [0, {s[0]:,}) before the first episode belong to no episode")
    if n and not oob.any() and int(e.max()) < part.num_tokens:
        add("trailing_tokens", n - 1, f"{TOKENS_FILE} holds {part.num_tokens - int(e.max()):,} tokens after the "
                                      f"last episode ends (token {int(e.max()):,}) that belong to no episode")
    if not n and part.num_tokens:
        add("trailing_tokens", 0, f"no episodes, but {TOKENS_FILE} holds {part.num_tokens:,} tokens")
    return out


def check_eos(part: Part, vocab: Vocab) -> list[Problem]:
    """Every (readable) episode ends with EOS: one token read per episode."""
    if part.tokens is None or part.usable is None:
        return []
    use = np.flatnonzero(part.usable)
    last = np.asarray(part.tokens[(part.starts[use] + part.lengths[use] - 1)])
    bad = use[last != vocab.markers.eos]
    if not bad.size:
        return []
    i = int(bad[0])
    pos = int(part.starts[i] + part.lengths[i] - 1)
    tok = int(part.tokens[pos])
    return [Problem("eos", part.file(TOKENS_FILE), message=f"episode {part.first_gid + i} ends with "
                    f"{vocab.name(tok)}, not <|EOS|> (id {vocab.markers.eos}): its boundaries in {EPISODES_FILE} "
                    f"do not match the tokens, or the tokens were changed{more_like_it(bad.size)}",
                    fix="restore the shard, or " + RECREATE,
                    **part.at(i, TOKENS_FILE, pos * part.token_dtype.itemsize))]


def _measure(part: Part, trained: bool, packed: bool) -> dict:
    if packed:
        have = {"rows": part.num_episodes}
        if part.segments is not None:
            have["segments"] = int(part.segments.shape[0])
            have["tokens"] = int(np.asarray(part.segments[:, 2]).sum())  # real tokens, padding excluded
    else:
        have = {"episodes": part.num_episodes, "tokens": part.num_tokens}
    if trained and part.mask is not None:
        have["trained_tokens"] = int(np.count_nonzero(part.mask))
    return have


def check_counts(meta: dict, parts: list[Part], trained: bool = True, packed: bool = False) -> list[Problem]:
    """Episodes (packed: rows and segments), tokens (packed: real tokens) and trained
    tokens per shard, per split and in all equal the metadata."""
    out = []
    found = []
    for part in parts:
        have = _measure(part, trained, packed)
        found.append((part, have))
        for what, a in have.items():
            b = (part.meta or {}).get(what)
            if isinstance(b, int) and a != b:
                out.append(Problem("counts", part.rel, "", f"{part.rel} holds {a:,} {what.replace('_', ' ')}; "
                                   f"{METADATA_FILE} recorded {b:,}", "the shard changed after it was written: "
                                   "restore it, or " + part.recreate, part.split))
    total = 0
    for split, rec in (meta.get("splits") or {}).items():
        mine = [have for part, have in found if part.split == split]
        for what in ("rows", "segments", "episodes", "tokens", "trained_tokens"):
            b = (rec or {}).get(what)
            if not mine or not isinstance(b, int) or any(what not in h for h in mine):
                continue
            a = sum(h[what] for h in mine)
            if a != b:
                out.append(Problem("counts", METADATA_FILE, f"splits.{split}.{what}", f"split {split} holds {a:,} "
                                   f"{what.replace('_', ' ')} in {len(mine)} shard(s); {METADATA_FILE} recorded "
                                   f"{b:,}", "the metadata or the shards were changed after they were written: "
                                   "restore the dataset, or " + (REPACK if packed else RECREATE), split))
        total += sum(h.get("episodes", 0) for h in mine)
    rec_total = (meta.get("counts") or {}).get("episodes")
    if not packed and isinstance(rec_total, int) and parts and rec_total != total:
        out.append(Problem("counts", METADATA_FILE, "counts.episodes", f"the splits hold {total:,} episodes in all; "
                           f"{METADATA_FILE} recorded {rec_total:,}", "the metadata or the shards were changed "
                           "after prepare: restore the dataset, or " + RECREATE))
    return out
