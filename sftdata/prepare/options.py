"""What prepare takes: ``PrepareOptions``, its fields, checks and build-key entries those
of ``sftdata.options`` (declared once, for every build command)."""

from __future__ import annotations

from dataclasses import dataclass

from ..options.declared import declared_fields, recorded, template_limits, validate
from ..records.turns import TurnPolicy
from ..template import TemplateLimits
from ..tokenize.memo import SegmentMemo


@dataclass(frozen=True)
@declared_fields("prepare")
class PrepareOptions:
    """prepare-chat / prepare-tool's options (``sftdata.options.declared``: one field each)."""

    @property
    def policy(self) -> TurnPolicy:
        return TurnPolicy(self.reasoning, self.train_on)

    def validate(self) -> None:
        validate(self, "prepare")

    def template_limits(self) -> TemplateLimits:
        """What every render of a model's chat template runs under (docs/TOKENIZERS.md)."""
        return template_limits(self)

    def memo_bytes_per_worker(self) -> int:
        """Each worker's share of ``--memo-mb`` (MiB, 2^20 bytes)."""
        return int(self.memo_mb * (1 << 20)) // max(1, self.workers)

    def new_memo(self, tok) -> SegmentMemo | None:
        """A worker's memo of encoded texts (None when ``--memo-mb 0``)."""
        cap = self.memo_bytes_per_worker()
        return SegmentMemo(tok, cap, self.memo_policy) if cap > 0 else None

    def recorded(self) -> dict:
        """The options that determine the output, recorded in the metadata and part of the
        build key (each option's ``record`` rule). The tokenizer, --chat-template and
        --tokenizer-engine are in the key through the tokenizer state too."""
        return recorded(self, "prepare")
