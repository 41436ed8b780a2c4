"""What prepare takes and gives: its options, its progress and summary, a chunk's result."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ..chat.tokenizer import ChatTokenizer, HFTokenizer, is_model_tokenizer_spec
from ..curate import DEDUP_MODES, DEFAULT_NGRAM, DEFAULT_THRESHOLD, CurateSettings, RecordKeys
from ..errors import UsageError
from ..order.batches import DEFAULT_SEED
from ..records.turns import REASONING_POLICIES, RESERVED_TEMPLATE_VARIABLES, TRAIN_ON, TURN_COUNTS, TurnPolicy
from ..sources import DEFAULT_MAX_RECORD_BYTES, SourceInfo
from ..store.format import DEFAULT_SHARD_TOKENS
from ..template import DEFAULT_MAX_STEPS, TemplateLimits, TemplateProfile
from ..tokenize.engine import check_engine
from ..tokenize.memo import DEFAULT_MEMO_MB, POLICIES, MemoStats, SegmentMemo


@dataclass(frozen=True)
class PrepareOptions:
    mode: str = "chat"  # "chat" | "tool"
    val_split: float = 0.0
    seed: int = DEFAULT_SEED
    max_tokens: int | None = None
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    tokenizer: str | None = None
    workers: int = 1
    strict: bool = False
    overwrite: bool = False
    force: bool = False  # rebuild even when the target is up to date (implies overwrite)
    wait: bool = False  # wait for another sftdata writing the same output
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    reasoning: str = "keep"  # keep | last | drop
    train_on: str = "all"  # all | last
    chat_template: str | None = None  # model | model:NAME | preset | FILE.jinja (a model's own tokenizer only)
    template_vars: dict | None = None  # --template-var NAME=VALUE: variables the chat template renders with
    per_reply: bool = False  # --per-reply: one episode per assistant reply under a chat template
    tokenizer_engine: str = "auto"  # auto | tiktoken | hf (a model's own tokenizer; the ids are the same)
    allow_pad_as_stop: bool = False  # accept a pad id that is also the end-of-turn token (serving.check_pad_not_stop)
    dedup: str = "off"  # off | exact | near (docs/CURATION.md)
    dedup_threshold: float = DEFAULT_THRESHOLD  # near: estimated Jaccard similarity of token shingles
    decontaminate: tuple[str, ...] = ()  # evaluation files
    decontaminate_ngram: int = DEFAULT_NGRAM
    memo_mb: float = DEFAULT_MEMO_MB  # memory for the memo of encoded texts, all workers together; 0 = off
    memo_policy: str = "frequency"  # what the memo keeps when full (memo.POLICIES; benchmarks compare them)
    template_max_steps: int = DEFAULT_MAX_STEPS  # a chat template's steps per render, plus 8 per character
    template_max_output: int | None = None  # characters one render may return (None: max_record_bytes)
    source_sha256: bool = False  # record every input's whole-file sha256, however large (sources.records_sha256)

    @property
    def policy(self) -> TurnPolicy:
        return TurnPolicy(self.reasoning, self.train_on)

    def validate(self) -> None:
        if self.mode not in ("chat", "tool"):
            raise UsageError(f"mode must be 'chat' or 'tool', not {self.mode!r}")
        if self.reasoning not in REASONING_POLICIES:
            raise UsageError(f"--reasoning must be one of {', '.join(REASONING_POLICIES)}, not {self.reasoning!r}")
        if self.train_on not in TRAIN_ON:
            raise UsageError(f"--train-on must be one of {', '.join(TRAIN_ON)}, not {self.train_on!r}")
        if not (0.0 <= self.val_split < 1.0) or math.isnan(self.val_split):
            raise UsageError(f"--val-split must be a fraction in [0, 1), got {self.val_split}")
        if self.max_tokens is not None and self.max_tokens < 4:
            raise UsageError(f"--max-tokens must be at least 4, got {self.max_tokens}")
        if self.shard_tokens < 1:
            raise UsageError(f"--shard-tokens must be positive, got {self.shard_tokens}")
        if self.workers < 1:
            raise UsageError(f"--workers must be at least 1, got {self.workers}")
        if not self.memo_mb >= 0 or math.isinf(self.memo_mb):
            raise UsageError(f"--memo-mb must be 0 (no memo) or a positive number of megabytes, got {self.memo_mb}")
        if self.memo_policy not in POLICIES:
            raise UsageError(f"memo_policy must be one of {', '.join(POLICIES)}, not {self.memo_policy!r}")
        if self.dedup not in DEDUP_MODES:
            raise UsageError(f"--dedup must be one of {', '.join(DEDUP_MODES)}, not {self.dedup!r}")
        if not 0.0 < self.dedup_threshold <= 1.0 or math.isnan(self.dedup_threshold):
            raise UsageError(f"--dedup-threshold must be a Jaccard similarity in (0, 1], got {self.dedup_threshold}")
        if self.decontaminate_ngram < 1:
            raise UsageError(f"--decontaminate-ngram must be at least 1, got {self.decontaminate_ngram}")
        if self.max_record_bytes < 1:
            raise UsageError(f"--max-record-bytes must be positive, got {self.max_record_bytes}")
        if self.template_max_steps < 1:
            raise UsageError(f"--template-max-steps must be positive, got {self.template_max_steps}")
        if self.template_max_output is not None and self.template_max_output < 1:
            raise UsageError(f"--template-max-output must be positive, got {self.template_max_output}")
        check_engine(self.tokenizer_engine)
        if self.tokenizer_engine == "hf" and not is_model_tokenizer_spec(self.tokenizer):
            raise UsageError(f"--tokenizer-engine hf needs a model's own tokenizer (a tokenizer.json or its folder); "
                             f"{'the default tokenizer' if self.tokenizer is None else repr(self.tokenizer)} is a "
                             f"tiktoken encoding")
        for given, what in ((self.chat_template is not None, f"--chat-template {self.chat_template}"),
                            (bool(self.template_vars), "--template-var"), (self.per_reply, "--per-reply")):
            if given and not is_model_tokenizer_spec(self.tokenizer):
                raise UsageError(f"{what} needs a model's own tokenizer: --tokenizer path/to/tokenizer.json, the "
                                 f"model folder holding it, or a Hub model id (org/name). "
                                 f"{'The default tokenizer' if self.tokenizer is None else repr(self.tokenizer)} "
                                 f"uses sftdata's chat markers, which have no chat template")
        reserved = [k for k in self.template_vars or () if k in RESERVED_TEMPLATE_VARIABLES]
        if reserved:
            raise UsageError(f"--template-var {reserved[0]}: sftdata gives the template {reserved[0]!r} itself; "
                             f"choose another name")

    def template_limits(self) -> TemplateLimits:
        """What every render of a model's chat template runs under (docs/TOKENIZERS.md)."""
        output = self.max_record_bytes if self.template_max_output is None else self.template_max_output
        return TemplateLimits(self.template_max_steps, output)

    def memo_bytes_per_worker(self) -> int:
        """Each worker's share of ``--memo-mb`` (MiB, 2^20 bytes)."""
        return int(self.memo_mb * (1 << 20)) // max(1, self.workers)

    def new_memo(self, tok) -> SegmentMemo | None:
        """A worker's memo of encoded texts (None when ``--memo-mb 0``)."""
        cap = self.memo_bytes_per_worker()
        return SegmentMemo(tok, cap, self.memo_policy) if cap > 0 else None

    def recorded(self) -> dict:
        """The options that determine the output, recorded in the metadata and part of the
        build key. Not these, which never change a byte: workers, the memo (memo_mb,
        memo_policy), overwrite, force, wait, and the CLI's --engine, --ray-address,
        --json and --quiet. The tokenizer, --chat-template and --tokenizer-engine are in
        the key through the tokenizer state too."""
        out = {"mode": self.mode, "val_split": self.val_split, "seed": self.seed,
               "max_tokens": self.max_tokens, "shard_tokens": self.shard_tokens,
               "strict": self.strict, "max_record_bytes": self.max_record_bytes, "reasoning": self.reasoning,
               "train_on": self.train_on}
        if self.chat_template is not None:
            out["chat_template"] = self.chat_template
        if self.template_vars:  # recorded only when used: the default output stays byte-identical
            out["template_vars"] = dict(self.template_vars)
        if self.per_reply:
            out["per_reply"] = True
        if is_model_tokenizer_spec(self.tokenizer):  # the limits decide which records a template keeps
            out["template_limits"] = self.template_limits().recorded()
        if self.allow_pad_as_stop:
            out["allow_pad_as_stop"] = True
        if self.dedup != "off":  # recorded only when used: the default output stays byte-identical
            out["dedup"] = self.dedup
            if self.dedup == "near":
                out["dedup_threshold"] = self.dedup_threshold
        if self.decontaminate:
            out.update(decontaminate=[str(p) for p in self.decontaminate], decontaminate_ngram=self.decontaminate_ngram)
        if self.source_sha256:
            out["source_sha256"] = True
        return out


@dataclass
class Progress:
    bytes_done: int
    bytes_total: int | None  # None when an input's size is not known before it is read (stdin)
    records: int
    tokens: int


@dataclass
class PrepareSummary:
    output_dir: str
    records_read: int = 0
    episodes: dict = field(default_factory=dict)  # split -> count
    tokens: dict = field(default_factory=dict)
    trained_tokens: dict = field(default_factory=dict)
    shards: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)  # reason -> count
    repaired: dict = field(default_factory=dict)  # repair -> records
    turns: dict = field(default_factory=lambda: dict.fromkeys(TURN_COUNTS, 0))  # per assistant turn (TURN_COUNTS)
    records_truncated: int = 0
    pairs_dropped: int = 0
    seconds: float = 0.0
    input_bytes: int = 0
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    per_reply_records: int = 0  # chat template: records served one episode per assistant reply
    per_reply_episodes: int = 0
    per_reply_automatic: int = 0  # of them, served so without --per-reply (their whole render is not exact)
    rule_mismatch: list = field(default_factory=list)  # chat template: rejected records, by name (capped)
    tokenizer_engine: dict = field(default_factory=dict)  # which engine encoded, and why
    dedup: dict = field(default_factory=dict)  # mode, exact_duplicates (always counted), near_duplicates ...
    decontamination: dict = field(default_factory=dict)  # ngram, files: [{path, items, too_short, contaminated}]
    memo: MemoStats = field(default_factory=MemoStats)  # what the memo of encoded texts saved
    memo_mb: float = 0.0  # --memo-mb (0: no memo)
    build_key: str | None = None  # the dataset's build key (store.build_key)
    up_to_date: bool = False  # the target held this build already: nothing was done
    changed: list = field(default_factory=list)  # why the target was rebuilt, in words (empty: a new target)
    libraries_changed: list = field(default_factory=list)  # up to date, but made with other library versions

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
                "decontamination": self.decontamination, "memo": self.memo_dict(),
                "build_key": self.build_key, "up_to_date": self.up_to_date, "changed": list(self.changed),
                "libraries_changed": list(self.libraries_changed)}

    @classmethod
    def of_dataset(cls, output_dir: str, meta: dict) -> PrepareSummary:
        """The summary of the dataset a run found up to date, from its metadata."""
        counts, splits, options = meta.get("counts") or {}, meta.get("splits") or {}, meta.get("options") or {}
        out = cls(output_dir=output_dir, records_read=counts.get("records_read", 0),
                  rejected=counts.get("rejected") or {}, repaired=counts.get("repaired") or {},
                  turns=counts.get("turns") or dict.fromkeys(TURN_COUNTS, 0),
                  records_truncated=counts.get("records_truncated", 0), pairs_dropped=counts.get("pairs_dropped", 0),
                  input_bytes=sum(s.get("bytes") or 0 for s in meta.get("sources") or []),
                  max_record_bytes=options.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES),
                  per_reply_records=counts.get("per_reply_records", 0),
                  per_reply_episodes=counts.get("per_reply_episodes", 0),
                  per_reply_automatic=counts.get("per_reply_automatic", 0),
                  rule_mismatch=meta.get("rule_mismatch") or [], dedup=meta.get("dedup") or {},
                  decontamination=meta.get("decontamination") or {}, up_to_date=True)
        for split, m in splits.items():
            out.episodes[split], out.tokens[split] = m.get("episodes", 0), m.get("tokens", 0)
            out.trained_tokens[split], out.shards[split] = m.get("trained_tokens", 0), len(m.get("shards") or [])
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
    staged: StagedPart | None = None  # an engine's task wrote the episodes itself (ids and mask are then empty)
    memo: MemoStats | None = None  # what the worker's memo saved on this chunk (None: no memo)
    per_reply_automatic: int = 0  # records served per reply without --per-reply
    last_only: np.ndarray | None = None  # uint8 per episode, 1 = trains its last reply only (None: all 0)


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


class TaskRunner(Protocol):
    """Where a run's tasks run: a pool of ``--workers`` processes (``pool.PoolRunner``) or a
    Ray cluster (``sftdata.engine``). The same functions run in either; results are small."""

    cpus: int
    depth: int | None  # tasks in flight at most (None: every task submitted at once)
    tokenizer: bytes | None  # what a partition task is given to rebuild the tokenizer (None: the worker's own)
    curate: object  # what a partition task is given of the curating settings (None: the worker's own)

    def partitions(self, infos: list[SourceInfo]) -> list: ...
    def submit(self, fn, args: tuple, doing: str): ...
    def result(self, handle, doing: str): ...
    def close(self, stopped: bool) -> None: ...


class Executor(Protocol):
    """An engine (``--engine``): ``start`` gives the runner of one partitioned run, whose
    tasks read the inputs themselves, stage their episodes under ``stage_dir`` and write
    the final shards (``prepare.partitioned``)."""

    def start(self, opts: PrepareOptions, tok: ChatTokenizer | HFTokenizer, profile: TemplateProfile | None,
              stage_dir: Path, curate: CurateSettings) -> TaskRunner: ...
