"""A bounded memo of encoded segments: each repeated text is encoded once per worker.

Every message text (and every tool schema of the system span) is encoded on its own,
with the chat markers inserted between texts, so reusing a text's ids is exact: the
same text through the same tokenizer always gives the same ids. Agent datasets repeat
themselves (the same system prompt and tool schemas in every record, often thousands of
tokens before a short question); the memo turns those repeats into a copy of bytes.

    >>> memo = SegmentMemo(tok, cap_bytes=64 << 20)
    >>> pieces, lengths = memo.encode(texts, tok.encode_batch)   # pieces: uint32 ids as bytes
    >>> memo.stats.hit_rate, memo.stats.tokens_reused

* Key: a 128-bit BLAKE2b of the text's UTF-8, keyed with the tokenizer's identity (its
  ranks or file hash), so a memo never serves ids of another tokenizer.
* Only texts of at least ``min_chars`` characters are looked up: hashing a short text
  costs about what encoding it does.
* Within a call, a text repeated N times is encoded once (always exact, memo or not).
* ``cap_bytes`` bounds the memory of the stored ids plus a fixed cost per entry
  (``ENTRY_BYTES``) and per remembered sighting (``SEEN_BYTES``).
* Policy ``frequency`` (the default, measured better on agent data: benchmarks/
  bench_prepare.py): a text is stored on its second sighting (texts seen once never
  push out ones seen often), and when the memo is full the least often used entries go
  first (counts are halved at each eviction, so a segment that stopped repeating ages
  out). Policy ``lru``: every text stored, the least recently used evicted.

Pure but for its own state: no I/O, no globals. One memo per worker process.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ID_TYPECODE = next(c for c in "IL" if array(c).itemsize == 4)  # uint32, native order (as numpy's uint32)
MIN_CHARS = 64
ENTRY_BYTES = 200  # per stored entry beyond its ids: key, dict slot, bytes header, counters
SEEN_BYTES = 120  # per text seen once and remembered (key, dict slot, count)
DEFAULT_MEMO_MB = 256  # for all workers together; each worker gets an equal share
POLICIES = ("frequency", "lru")
_KEEP_AFTER_EVICTION = 0.9  # evict down to this share of the cap, so evictions come in batches


def ids_bytes(ids) -> bytes:
    """Token ids (a list of ints) as uint32 bytes in native order."""
    return array(ID_TYPECODE, ids).tobytes()


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

    def add(self, other: MemoStats) -> None:
        self.lookups += other.lookups
        self.hits += other.hits
        self.tokens_reused += other.tokens_reused
        self.tokens_encoded += other.tokens_encoded
        self.evictions += other.evictions
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
        self._key = tokenizer_identity(tok)[:64]
        self._entries: OrderedDict[bytes, list] = OrderedDict()  # key -> [ids bytes, uses]
        self._seen: dict[bytes, int] = {}  # frequency policy: texts seen once, not stored
        self.bytes = 0  # what the entries and sightings cost now
        self.peak_bytes = 0
        self.stats = MemoStats()

    def _hash(self, text: str) -> bytes:
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16, key=self._key).digest()

    def take_stats(self) -> MemoStats:
        """The stats since the last call (each chunk reports its own)."""
        out, self.stats = self.stats, MemoStats()
        out.peak_bytes = self.peak_bytes
        return out

    def encode(self, texts: Sequence[str], encode_batch: Callable[[list[str]], list[list[int]]]
               ) -> tuple[list[bytes], list[int]]:
        """Each text's ids as uint32 bytes, and its token count; texts not in the memo are
        encoded with one ``encode_batch`` call, each distinct text once."""
        out: list = [None] * len(texts)
        todo: list[str] = []  # distinct texts to encode
        where: list[list[int]] = []  # for each, the positions it fills
        todo_keys: list[bytes | None] = []
        pending: dict[bytes, int] = {}  # key -> index into todo (a text repeated within this call)
        entries, st, min_chars = self._entries, self.stats, self.min_chars
        lru = self.policy == "lru"
        for i, text in enumerate(texts):
            if len(text) < min_chars:
                todo.append(text)
                where.append([i])
                todo_keys.append(None)
                continue
            st.lookups += 1
            key = self._hash(text)
            entry = entries.get(key)
            if entry is not None:
                entry[1] += 1
                if lru:
                    entries.move_to_end(key)
                out[i] = entry[0]
                st.hits += 1
                st.tokens_reused += len(entry[0]) >> 2
                continue
            j = pending.get(key)
            if j is not None:
                where[j].append(i)
                st.hits += 1
                continue
            pending[key] = len(todo)
            todo.append(text)
            where.append([i])
            todo_keys.append(key)
        if todo:
            for text_ids, places, key in zip(encode_batch(todo), where, todo_keys):
                data = ids_bytes(text_ids)
                n = len(text_ids)
                st.tokens_encoded += n
                st.tokens_reused += n * (len(places) - 1)
                for i in places:
                    out[i] = data
                if key is not None and self.cap_bytes > 0:
                    self._admit(key, data, len(places))
        return out, [len(b) >> 2 for b in out]

    def _admit(self, key: bytes, data: bytes, uses: int) -> None:
        cost = len(data) + ENTRY_BYTES
        if cost > self.cap_bytes * (1 - _KEEP_AFTER_EVICTION):
            return  # one text would take a tenth of the memo: encode it each time instead
        if self.policy == "frequency":
            seen = self._seen.pop(key, 0)
            if seen:
                self.bytes -= SEEN_BYTES
            elif uses < 2:
                self._make_room(SEEN_BYTES)
                self._seen[key] = 1
                self._grow(SEEN_BYTES)
                return
            uses += seen
        self._make_room(cost)
        self._entries[key] = [data, uses]
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
                _, (data, _) = entries.popitem(last=False)
                self.bytes -= len(data) + ENTRY_BYTES
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
                data, _ = entries.pop(k)
                self.bytes -= len(data) + ENTRY_BYTES
                self.stats.evictions += 1
            for entry in entries.values():  # age: a segment that stopped repeating leaves in time
                entry[1] >>= 1
