"""What the workers compute for the records a chunk accepted: the keys the driver's
duplicate decision needs, and the contamination check (independent of other records)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..records.conversation import parse_record
from ..records.turns import Conversation, TurnPolicy
from ..sources import RawRecord
from .canonical import canonical_text, exact_key
from .decontaminate import EvalIndex
from .minhash import MINHASH_SEED, NUM_PERM, SHINGLE, shingle_hashes, signatures


@dataclass(frozen=True)
class CurateSettings:
    """Sent once to every worker: what to compute per record."""

    dedup: str = "off"  # off | exact | near
    evals: EvalIndex | None = None
    num_perm: int = NUM_PERM
    shingle: int = SHINGLE
    seed: int = MINHASH_SEED


@dataclass
class RecordKeys:
    """Per accepted record of a chunk, in input order (picklable)."""

    records: np.ndarray  # int64 record numbers
    wheres: list[str]
    exact: list[bytes]  # canonical-text keys
    signatures: np.ndarray | None  # (n, num_perm) uint32 with --dedup near
    contaminated: list[tuple[int, str, int, str]]  # (record, where, eval item index, shared words)

    def shift(self, first: int) -> None:
        """Its record numbers counted from ``first`` (in place)."""
        self.records = self.records + first
        self.contaminated = [(r + first, *rest) for r, *rest in self.contaminated]

    def subset(self, keep: np.ndarray) -> RecordKeys:
        """The records where ``keep`` is True."""
        idx = np.flatnonzero(keep)
        return RecordKeys(self.records[idx], [self.wheres[i] for i in idx], [self.exact[i] for i in idx],
                          None if self.signatures is None else self.signatures[idx], [])


def chunk_keys(items: Sequence[RawRecord], sources: np.ndarray, ids: np.ndarray, lengths: np.ndarray, mode: str,
               policy: TurnPolicy, settings: CurateSettings) -> RecordKeys:
    """Keys of the records behind the episodes ``sources`` (record per episode, in input
    order) of a chunk result whose tokens are ``ids`` cut by ``lengths``, parsing the
    accepted records again (``conversation_keys`` takes the conversations already parsed)."""
    by_number = {r.record: r for r in items}
    convs = {}
    for rec in np.unique(np.asarray(sources, dtype=np.int64)).tolist():
        raw = by_number[rec]
        convs[rec] = (raw.where, parse_record(raw.raw, raw.where, mode, policy))
    return conversation_keys(convs, sources, ids, lengths, settings)


def conversation_keys(convs: Mapping[int, tuple[str, Conversation]], sources: np.ndarray, ids: np.ndarray,
                      lengths: np.ndarray, settings: CurateSettings) -> RecordKeys:
    """Keys of the records behind the episodes ``sources`` (as ``chunk_keys``), from each
    accepted record's conversation as the chunk parsed it: ``convs[record] = (where,
    conversation)``, so a record is parsed once for its tokens and its keys."""
    sources = np.asarray(sources, dtype=np.int64)
    records, first = np.unique(sources, return_index=True)  # a record may give several episodes
    wheres, exact, contaminated = [], [], []
    evals = settings.evals
    for rec in records.tolist():
        where, conv = convs[rec]
        text = canonical_text(conv)
        wheres.append(where)
        exact.append(exact_key(text))
        if evals is not None:
            hit = evals.first_hit(text)
            if hit is not None:
                contaminated.append((rec, where, hit[0], hit[1]))
    sigs = None
    if settings.dedup == "near":
        ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
        last = np.concatenate([first[1:], [sources.shape[0]]]) - 1  # each record's last episode
        flat, offsets = shingle_hashes(ids, ends[first] - np.asarray(lengths)[first], ends[last], settings.shingle)
        sigs = signatures(flat, offsets, settings.num_perm, settings.seed)
    return RecordKeys(records, wheres, exact, sigs, contaminated)


def concat_keys(a: RecordKeys | None, b: RecordKeys | None) -> RecordKeys | None:
    """The keys of ``a``'s records, then ``b``'s (records in input order in both)."""
    if a is None or b is None:
        return b if a is None else a
    sig = None if a.signatures is None or b.signatures is None else np.concatenate([a.signatures, b.signatures])
    return RecordKeys(np.concatenate([a.records, b.records]), a.wheres + b.wheres, a.exact + b.exact, sig,
                      a.contaminated + b.contaminated)
