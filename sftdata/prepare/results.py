"""What prepare gives: its progress and summary, a chunk's result, a staged part, and the
protocols of where its tasks run."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ..curate import CurateSettings, RecordKeys
from ..records.turns import TURN_COUNTS
from ..sources import DEFAULT_MAX_RECORD_BYTES
from ..store.build_key import BuildSummary
from ..tasks import TaskRunner
from ..tokenize.memo import MemoStats


@dataclass
class Progress:
    bytes_done: int
    bytes_total: int | None  # None when an input's size is not known before it is read (stdin)
    records: int
    tokens: int


# a summary's counts summed over its chunks' results (``ChunkResult.truncated`` is records_truncated)
SUMMED = ("records_truncated", "pairs_dropped", "per_reply_records", "per_reply_episodes", "per_reply_automatic")


@dataclass
class PrepareSummary(BuildSummary):
    episodes: dict = field(default_factory=dict)  # split -> count
    shards: dict = field(default_factory=dict)
    turns: dict = field(default_factory=lambda: dict.fromkeys(TURN_COUNTS, 0))  # per assistant turn (TURN_COUNTS)
    records_truncated: int = 0
    pairs_dropped: int = 0
    input_bytes: int = 0
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    per_reply_records: int = 0  # chat template: records served one episode per assistant reply
    per_reply_episodes: int = 0
    per_reply_automatic: int = 0  # of them, served so without --per-reply (their whole render is not exact)
    rule_mismatch: list = field(default_factory=list)  # chat template: rejected records, by name (capped)
    tokenizer_engine: dict = field(default_factory=dict)  # which engine encoded, and why
    memo: MemoStats = field(default_factory=MemoStats)  # what the memo of encoded texts saved
    memo_mb: float = 0.0  # --memo-mb (0: no memo)
    media: dict = field(default_factory=dict)  # a vision model's: {"items", "images", "videos", "tokens"}

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())

    @property
    def trained_share(self) -> float:
        t = self.total_tokens
        return sum(self.trained_tokens.values()) / t if t else 0.0

    def as_dict(self) -> dict:
        return {"output_dir": self.output_dir, "records_read": self.records_read,
                "episodes": self.episodes, "tokens": self.tokens, "trained_tokens": self.trained_tokens,
                "trained_share": round(self.trained_share, 6), "shards": self.shards,
                "rejected": self.rejected, "rejected_total": sum(self.rejected.values()),
                "repaired": self.repaired, "turns": self.turns, "records_truncated": self.records_truncated,
                "pairs_dropped": self.pairs_dropped, "seconds": round(self.seconds, 3),
                "input_bytes": self.input_bytes, "max_record_bytes": self.max_record_bytes,
                "per_reply_records": self.per_reply_records, "per_reply_episodes": self.per_reply_episodes,
                "per_reply_automatic": self.per_reply_automatic,
                "rule_mismatch": self.rule_mismatch, "tokenizer_engine": self.tokenizer_engine, "dedup": self.dedup,
                "decontamination": self.decontamination, "memo": self.memo_dict(), "media": self.media,
                **self.key_dict()}

    @classmethod
    def of_dataset(cls, output_dir: str, meta: dict) -> PrepareSummary:
        """The summary of the dataset a run found up to date, from its metadata."""
        counts, options = meta.get("counts") or {}, meta.get("options") or {}
        out = cls.found(output_dir, meta, turns=counts.get("turns") or dict.fromkeys(TURN_COUNTS, 0),
                        input_bytes=sum(s.get("bytes") or 0 for s in meta.get("sources") or []),
                        max_record_bytes=options.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES),
                        rule_mismatch=meta.get("rule_mismatch") or [], media=meta.get("media") or {},
                        **{k: counts.get(k, 0) for k in SUMMED})
        for split, m in (meta.get("splits") or {}).items():
            out.episodes[split], out.shards[split] = m.get("episodes", 0), len(m.get("shards") or [])
        return out

    def memo_dict(self) -> dict:
        m = self.memo
        return {"memo_mb": self.memo_mb, "lookups": m.lookups, "hits": m.hits, "hit_rate": round(m.hit_rate, 6),
                "tokens_reused": m.tokens_reused, "tokens_encoded": m.tokens_encoded,
                "reused_share": round(m.reused_share, 6), "evictions": m.evictions,
                "peak_mb_per_worker": round(m.peak_bytes / (1 << 20), 3)}


@dataclass
class ChunkResult:
    """What one chunk of records became. Picklable (sent back from workers)."""

    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    sources: np.ndarray
    rejects: list  # (record, where, reason, message)
    repairs: Counter
    turns: Counter  # per assistant turn of the accepted records (TURN_COUNTS)
    truncated: int
    pairs_dropped: int
    records: int
    per_reply_records: int = 0
    per_reply_episodes: int = 0
    mismatches: list = field(default_factory=list)  # (record, where) of rule_mismatch rejects
    keys: RecordKeys | None = None  # the accepted records' duplicate keys and contamination (curate)
    staged: dict | None = None  # a partition task staged the episodes itself: {kind: StagedPart} (ids, mask empty)
    memo: MemoStats | None = None  # what the worker's memo saved on this chunk (None: no memo)
    per_reply_automatic: int = 0  # records served per reply without --per-reply
    last_only: np.ndarray | None = None  # uint8 per episode, 1 = trains its last reply only (None: all 0)
    media: list | None = None  # per episode, its media spans (a tuple of MediaSpan); None: no episode has any

    def shifted(self, first: int) -> ChunkResult:
        """This result with its record numbers counted from ``first`` (in place)."""
        if first:
            self.sources = self.sources + first  # tokens returned with the result (staged ones: record_offset)
            self.rejects = [(r + first, *rest) for r, *rest in self.rejects]
            self.mismatches = [(r + first, where) for r, where in self.mismatches]
            if self.keys is not None:
                self.keys.shift(first)
        return self


@dataclass(frozen=True)
class StagedPart:
    """Episodes a worker or task wrote to a shard folder of its own, in input order; its
    ``sources`` are numbered from the start of their input: ``record_offset`` is added.
    ``lengths`` (each episode's tokens) and ``sources`` are what the coordinator plans the
    final shards with (``plan``); ``keep``, the episodes its curating keeps (None: all)."""

    path: str
    episodes: int
    tokens: int
    record_offset: int = 0
    lengths: np.ndarray | None = field(default=None, compare=False)
    sources: np.ndarray | None = field(default=None, compare=False)  # global record numbers, one per episode
    keep: np.ndarray | None = field(default=None, compare=False)
    keys_dir: str | None = None  # its records' duplicate keys, staged beside it (curate_tasks)

    @property
    def kept(self) -> int:
        """The episodes the run keeps."""
        return self.episodes if self.keep is None else int(np.count_nonzero(self.keep))

    def without(self, records) -> StagedPart:
        """This part with the episodes of ``records`` left out of what it keeps."""
        keep = ~np.isin(self.sources, np.fromiter(records, dtype=np.int64))
        return dataclasses.replace(self, keep=keep if self.keep is None else self.keep & keep)


class Executor(Protocol):
    """An engine (``--engine``): ``start`` gives the runner (``tasks.TaskRunner``) of one
    partitioned run, whose tasks read the inputs themselves, make their rows with ``work``
    (the kind's: ``chunk.EpisodeWork`` ...), stage them under ``stage_dir`` and
    write the final shards (``prepare.partitioned``). That runner also gives
    ``partitions(infos)`` (the input's ranges, one task each), ``tokenizer`` (the pickled
    work a partition task makes rows with; None: the worker's own) and ``curate`` (what
    it is given of the curating settings; None: the worker's own)."""

    def start(self, opts, work, stage_dir: Path, curate: CurateSettings) -> TaskRunner: ...
