"""Preference pairs (DPO, ORPO, KTO) and RL prompts (GRPO) with the same proof as SFT episodes.

- ``render``: a preference record's prompt once and each completion, split in token space
  and proven (the prompt's ids start both sides; the masks are the one rule's);
- ``truncate``: the one truncation policy of a pair (pure);
- ``run``: a record as a row (kinds ``pairs``, ``kto``, ``prompts``) and ``RowsKind``, the
  kind of row the build driver (``sftdata.prepare.prepare_pref``) builds them as.
"""

from .options import PrefOptions
from .render import PairRender, render_prompt, render_record
from .run import PrefSummary, RowsKind
from .truncate import Cut, Truncation, plan_cut

__all__ = ["Cut", "PairRender", "PrefOptions", "PrefSummary", "RowsKind", "Truncation", "plan_cut", "render_prompt",
           "render_record"]
