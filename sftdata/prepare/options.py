"""What prepare takes: ``PrepareOptions``, its fields, checks and build-key entries those
of ``sftdata.options`` (declared once, for every build command)."""

from __future__ import annotations

from dataclasses import dataclass

from ..options.declared import DeclaredOptions, declared_fields
from ..tokenize.memo import SegmentMemo


@dataclass(frozen=True)
@declared_fields("prepare")
class PrepareOptions(DeclaredOptions):
    """prepare-chat / prepare-tool's options (``sftdata.options.declared``: one field each)."""

    family = "prepare"

    def memo_bytes_per_worker(self) -> int:
        """Each worker's share of ``--memo-mb`` (MiB, 2^20 bytes)."""
        return int(self.memo_mb * (1 << 20)) // max(1, self.workers)

    def new_memo(self, tok) -> SegmentMemo | None:
        """A worker's memo of encoded texts (None when ``--memo-mb 0``)."""
        cap = self.memo_bytes_per_worker()
        return SegmentMemo(tok, cap, self.memo_policy) if cap > 0 else None
