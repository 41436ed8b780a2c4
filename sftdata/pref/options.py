"""What ``prepare-pref`` and ``prepare-rl`` take: their options (what reaches the build key)."""

from __future__ import annotations

from dataclasses import dataclass

from ..curate import DEFAULT_NGRAM, DEFAULT_THRESHOLD, Deduplicator
from ..errors import UsageError
from ..records.preference import FORMS
from ..sources import DEFAULT_MAX_RECORD_BYTES
from ..store.format import DEFAULT_SHARD_TOKENS
from .truncate import Truncation


@dataclass(frozen=True)
class PrefOptions:
    """What ``prepare-pref`` and ``prepare-rl`` are given (the CLI's options)."""

    tokenizer: str | None = None
    chat_template: str | None = None
    template_vars: dict | None = None
    form: str = "auto"
    truncation: Truncation = Truncation()
    val_split: float = 0.0
    seed: int = 1337
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    strict: bool = False
    overwrite: bool = False
    force: bool = False
    wait: bool = False
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    reasoning: str = "keep"
    allow_pad_as_stop: bool = False
    dedup: str = "off"  # off | exact | near
    dedup_threshold: float = DEFAULT_THRESHOLD
    decontaminate: tuple = ()
    decontaminate_ngram: int = DEFAULT_NGRAM
    workers: int = 1  # processes that render the records (the dataset is the same for any number)

    def validate(self) -> None:
        Deduplicator(self.dedup, self.dedup_threshold)  # the mode and threshold checked as prepare-chat's
        if self.workers < 1:
            raise UsageError(f"--workers must be at least 1, got {self.workers}")
        if self.form not in FORMS:
            raise UsageError(f"--format must be one of {', '.join(FORMS)}, got {self.form!r}")
        if not 0.0 <= self.val_split < 1.0:
            raise UsageError(f"--val-split must be in [0, 1), got {self.val_split}")
        self.truncation.validate()

    def recorded(self) -> dict:
        return {"tokenizer": self.tokenizer, "chat_template": self.chat_template, "template_vars": self.template_vars,
                "format": self.form, "truncation": self.truncation.recorded(), "val_split": self.val_split,
                "seed": self.seed, "shard_tokens": self.shard_tokens, "reasoning": self.reasoning,
                "max_record_bytes": self.max_record_bytes, "allow_pad_as_stop": self.allow_pad_as_stop,
                "dedup": self.dedup, "decontaminate": list(self.decontaminate),
                "decontaminate_ngram": self.decontaminate_ngram,
                **({"dedup_threshold": self.dedup_threshold} if self.dedup == "near" else {})}
