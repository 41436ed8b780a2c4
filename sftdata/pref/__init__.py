"""Preference pairs (DPO, ORPO, KTO) and RL prompts (GRPO) with the same proof as SFT episodes.

- ``render``: a preference record's prompt once and each completion, split in token space
  and proven (the prompt's ids start both sides; the masks are the one rule's);
- ``truncate``: the one truncation policy of a pair (pure);
- ``run``: a record as a row (kinds ``pairs``, ``kto``, ``prompts``) and ``RowsKind``, the
  kind of row the build driver (``sftdata.prepare.prepare_pref``) builds them as.
"""

from .options import PrefOptions
from .run import PrefSummary
from .truncate import Truncation

__all__ = ["PrefOptions", "PrefSummary", "Truncation"]
