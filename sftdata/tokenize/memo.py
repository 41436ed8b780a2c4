"""A bounded memo of encoded segments: each repeated text is encoded once per worker.

Every message text (and every tool schema of the system span) is encoded on its own,
with the chat markers inserted between texts, so reusing a text's ids is exact: the
same text through the same tokenizer always gives the same ids. Agent datasets repeat
themselves (the same system prompt and tool schemas in every record, often thousands of
tokens before a short question); the memo turns those repeats into a copy of bytes.

    >>> memo = SegmentMemo(tok, cap_bytes=64 << 20)
    >>> pieces, lengths = memo.encode(texts, tok)   # pieces: uint32 arrays of ids
    >>> memo.stats.hit_rate, memo.stats.tokens_reused

* Key: the text itself, in a dict: found by its hash (Python's, about 1 GB/s), then
  compared whole, so a hit is never a hash collision. A memo belongs to one tokenizer
  (its identity: ranks and split pattern, or tokenizer.json hash) and refuses another.
* Only texts of at least ``min_chars`` characters are looked up: hashing a short text
  costs about what encoding it does.
* Within a call, a text repeated N times is encoded once (always exact, memo or not).
* ``cap_bytes`` bounds the memory of the stored texts and ids plus a fixed cost per entry
  (``ENTRY_BYTES``) and per remembered sighting (``SEEN_BYTES``, a hash and a count).
* Idle where it does not pay: the memo judges itself over each window of
  ``WINDOW_CALLS`` calls (chunks); when one saved less than ``IDLE_SHARE`` of its tokens,
  it goes idle: ``serves()`` says no for the next chunks, which render as with no memo
  (one call of the core over the chunk's text, faster than text by text), except every
  ``PROBE_EVERY``-th, which goes through the memo and wakes it when that one chunk saves
  the share. Counted, never timed: the same input gives the same decisions.
* Policy ``frequency`` (the default, measured better on agent data: benchmarks/
  bench_prepare.py): a text is stored on its second sighting (texts seen once never
  push out ones seen often), and when the memo is full the least often used entries go
  first (counts are halved at each eviction, so a segment that stopped repeating ages
  out). Policy ``lru``: every text stored, the least recently used evicted.

Pure but for its own state: no I/O, no globals. One memo per worker process.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

ID_TYPECODE = next(c for c in "IL" if array(c).itemsize == 4)  # uint32, native order (as numpy's uint32)
MIN_CHARS = 64
ENTRY_BYTES = 260  # per stored entry beyond its text and ids (their sizes as Python reports them); measured
SEEN_BYTES = 160  # per text seen once and remembered: its hash, a count, its dict slot with the table's slack
DEFAULT_MEMO_MB = 256  # for all workers together; each worker gets an equal share
POLICIES = ("frequency", "lru")
_EMPTY_ARRAY_BYTES = sys.getsizeof(array(ID_TYPECODE))
_KEEP_AFTER_EVICTION = 0.9  # evict down to this share of the cap, so evictions come in batches
IDLE_SHARE = 0.10  # a window that saved less than this share of its tokens: the memo goes idle (measured break-even)
WINDOW_CALLS = 8  # calls (chunks) a memo judges itself over
PROBE_EVERY = 16  # an idle memo still serves every PROBE_EVERY-th chunk, to notice repeats coming back


def id_array(ids) -> array:
    """Token ids (a list of ints) as a compact uint32 array (native order, as numpy's
    uint32): 4 bytes a token instead of a list's ~36, joined without a copy per token."""
    return array(ID_TYPECODE, ids)


def tokenizer_identity(tok) -> bytes:
    """What decides how a tokenizer encodes ordinary text: its ranks and split pattern
    (tiktoken) or its tokenizer.json (Hugging Face), as at most 64 bytes."""
    file_sha = getattr(tok, "file_sha256", None)
    if file_sha is not None:
        return bytes.fromhex(file_sha)
    h = hashlib.sha256()
    h.update(tok.ranks_sha256.encode())
    h.update(b"\0")
    h.update(tok.pat_str.encode("utf-8", "surrogatepass"))
    return h.digest()


@dataclass
class MemoStats:
    """What the memo saved. ``lookups``: texts long enough to be looked up; ``hits``:
    those served without encoding (stored before, or repeated within one call);
    ``tokens_reused``: their tokens; ``tokens_encoded``: tokens the tokenizer produced."""

    lookups: int = 0
    hits: int = 0
    tokens_reused: int = 0
    tokens_encoded: int = 0
    evictions: int = 0
    peak_bytes: int = 0  # the most memory one worker's memo held (a maximum, not a sum)
    chunks_idle: int = 0  # chunks rendered without the memo while it was idle (their tokens: tokens_encoded)

    def add(self, other: MemoStats) -> None:
        self.lookups += other.lookups
        self.hits += other.hits
        self.tokens_reused += other.tokens_reused
        self.tokens_encoded += other.tokens_encoded
        self.evictions += other.evictions
        self.chunks_idle += other.chunks_idle
        self.peak_bytes = max(self.peak_bytes, other.peak_bytes)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def reused_share(self) -> float:
        """Share of all rendered text tokens that were not re-encoded."""
        total = self.tokens_reused + self.tokens_encoded
        return self.tokens_reused / total if total else 0.0


class SegmentMemo:
    """Encoded texts by hash, within ``cap_bytes``; see the module docstring."""

    def __init__(self, tok, cap_bytes: int, policy: str = "frequency", min_chars: int = MIN_CHARS):
        if policy not in POLICIES:
            raise ValueError(f"memo policy must be one of {POLICIES}, not {policy!r}")
        self.cap_bytes = int(cap_bytes)
        self.policy = policy
        self.min_chars = min_chars
        self.identity = tokenizer_identity(tok)
        self._entries: OrderedDict[str, list] = OrderedDict()  # text -> [ids array, uses, cost]
        self._seen: dict[int, int] = {}  # frequency policy: hashes of texts seen once, not stored
        self.bytes = 0  # what the entries and sightings cost now
        self.peak_bytes = 0
        self.stats = MemoStats()
        self.idle = False
        self._window = [0, 0, 0]  # calls, tokens reused, tokens encoded since the last judgement
        self._waited = 0  # chunks asked about since the memo went idle

    def serves(self) -> bool:
        """Whether the next chunk's texts go through the memo (asked once per chunk): always
        while it pays; while idle, every ``PROBE_EVERY``-th chunk (module docstring)."""
        if not self.idle:
            return True
        self._waited += 1
        if self._waited % PROBE_EVERY == 0:
            return True
        self.stats.chunks_idle += 1
        return False

    def _judge(self, reused: int, encoded: int) -> None:
        """After each call: a full window that saved too little makes the memo idle; a probe
        of an idle memo that saved enough wakes it."""
        w = self._window
        w[0] += 1
        w[1] += reused
        w[2] += encoded
        if self.idle or w[0] >= WINDOW_CALLS:
            pays = w[1] > 0 and w[1] >= IDLE_SHARE * (w[1] + w[2])
            if pays != (not self.idle):
                self._waited = 0
            self.idle = not pays
            w[:] = [0, 0, 0]

    def take_stats(self) -> MemoStats:
        """The stats since the last call (each chunk reports its own)."""
        out, self.stats = self.stats, MemoStats()
        out.peak_bytes = self.peak_bytes
        return out

    def encode(self, texts: Sequence[str], tok) -> tuple[list, list[int]]:
        """Each text's ids as a uint32 array (``array`` or numpy), and its token count; texts
        not in the memo are encoded together (``tok.joined``, else ``tok.encode_batch``), each
        distinct text once."""
        if tokenizer_identity(tok) != self.identity:
            raise ValueError("this memo holds the ids of another tokenizer; make one memo per tokenizer")
        out: list = [None] * len(texts)
        todo: list[str] = []  # distinct texts to encode
        where: list[list[int]] = []  # for each, the positions it fills
        todo_keep: list[bool] = []  # looked up, so a candidate for the memo
        pending: dict[str, int] = {}  # text -> index into todo (a text repeated within this call)
        entries, st, min_chars = self._entries, self.stats, self.min_chars
        reused0, encoded0 = st.tokens_reused, st.tokens_encoded
        lru = self.policy == "lru"
        for i, text in enumerate(texts):
            if len(text) < min_chars:
                todo.append(text)
                where.append([i])
                todo_keep.append(False)
                continue
            st.lookups += 1
            entry = entries.get(text)
            if entry is not None:
                entry[1] += 1
                if lru:
                    entries.move_to_end(text)
                out[i] = entry[0]
                st.hits += 1
                st.tokens_reused += len(entry[0])
                continue
            j = pending.get(text)
            if j is not None:
                where[j].append(i)
                st.hits += 1
                continue
            pending[text] = len(todo)
            todo.append(text)
            where.append([i])
            todo_keep.append(True)
        if todo:
            joined = getattr(tok, "joined", None)  # one call of the core for them all, where it can
            encoded = joined.encode_many(todo) if joined is not None else None
            if encoded is None:
                encoded = [id_array(e) for e in tok.encode_batch(todo)]
            for text, data, places, keep in zip(todo, encoded, where, todo_keep):
                n = len(data)
                st.tokens_encoded += n
                st.tokens_reused += n * (len(places) - 1)
                for i in places:
                    out[i] = data
                if keep and self.cap_bytes > 0:
                    self._admit(text, data, len(places))
        self._judge(st.tokens_reused - reused0, st.tokens_encoded - encoded0)
        return out, [len(a) for a in out]

    def _admit(self, text: str, data, uses: int) -> None:
        # a view into a chunk's ids is copied (exactly sized) only if it is stored
        size = sys.getsizeof(data) if isinstance(data, array) else _EMPTY_ARRAY_BYTES + 4 * len(data)
        cost = sys.getsizeof(text) + size + ENTRY_BYTES
        if cost > self.cap_bytes * (1 - _KEEP_AFTER_EVICTION):
            return  # one text would take a tenth of the memo: encode it each time instead
        if self.policy == "frequency":
            h = hash(text)  # a collision here only stores a text one sighting early
            seen = self._seen.pop(h, 0)
            if seen:
                self.bytes -= SEEN_BYTES
            elif uses < 2:
                self._make_room(SEEN_BYTES)
                self._seen[h] = 1
                self._grow(SEEN_BYTES)
                return
            uses += seen
        if not isinstance(data, array):
            stored = array(ID_TYPECODE, [0]) * len(data)  # 80 + 4 bytes an id, as built from a list
            memoryview(stored).cast("B")[:] = memoryview(data).cast("B")
            data = stored
        self._make_room(cost)
        self._entries[text] = [data, uses, cost]
        self._grow(cost)

    def _grow(self, n: int) -> None:
        self.bytes += n
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes

    def _make_room(self, need: int) -> None:
        """Evict until ``need`` more bytes fit under the cap (down to 90% of it, so that
        evictions come in batches)."""
        if self.bytes + need <= self.cap_bytes:
            return
        goal = self.cap_bytes * _KEEP_AFTER_EVICTION - need
        entries = self._entries
        if self.policy == "lru":
            while self.bytes > goal and entries:
                self.bytes -= entries.popitem(last=False)[1][2]
                self.stats.evictions += 1
            return
        # sightings go first (the oldest), then the least used entries, the oldest first among equals
        while self._seen and self.bytes > goal:
            del self._seen[next(iter(self._seen))]
            self.bytes -= SEEN_BYTES
        if self.bytes > goal:
            for k in sorted(entries, key=lambda k: entries[k][1]):  # stable: insertion order among equals
                if self.bytes <= goal:
                    break
                self.bytes -= entries.pop(k)[2]
                self.stats.evictions += 1
            for entry in entries.values():  # age: a segment that stopped repeating leaves in time
                entry[1] >>= 1
