"""What prepare takes: its options (what reaches the build key, what is checked)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..curate import DEDUP_MODES, DEFAULT_NGRAM, DEFAULT_THRESHOLD
from ..errors import UsageError
from ..order.batches import DEFAULT_SEED
from ..records.turns import REASONING_POLICIES, RESERVED_TEMPLATE_VARIABLES, TRAIN_ON, TurnPolicy
from ..sources import DEFAULT_MAX_RECORD_BYTES
from ..store.format import DEFAULT_SHARD_TOKENS
from ..template import DEFAULT_MAX_STEPS, TemplateLimits
from ..tokenize.engine import check_engine
from ..tokenize.memo import DEFAULT_MEMO_MB, POLICIES, SegmentMemo
from ..tokenize.open import is_model_tokenizer_spec


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
