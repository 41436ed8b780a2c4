"""Preference pairs (DPO, ORPO, KTO) and RL prompts (GRPO) with the same proof as SFT episodes.

- ``render``: a preference record's prompt once and each completion, split in token space
  and proven (the prompt's ids start both sides; the masks are the one rule's);
- ``truncate``: the one truncation policy of a pair (pure);
- ``run``: ``prepare_pref`` (kinds ``pairs``, ``kto``, ``prompts``), over prepare's inputs,
  rejects, tokenizer, split and writer.
"""

from .options import PrefOptions
from .render import PairRender, render_prompt, render_record
from .run import PrefSummary, prepare_pref
from .truncate import Cut, Truncation, plan_cut

__all__ = ["Cut", "PairRender", "PrefOptions", "PrefSummary", "Truncation", "plan_cut", "prepare_pref",
           "render_prompt", "render_record"]
