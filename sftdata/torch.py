"""``from sftdata.torch import SFTDataset, SFTSampler, collate``: sftdata datasets for
``transformers``, TRL and plain PyTorch training loops (docs/INTEROP.md); for pairs, KTO
rows and RL prompts ``PairDataset``, ``PreferenceCollator`` (TRL's ``DPOTrainer``),
``UnpairedPreferenceCollator`` (``KTOTrainer``) and ``pretokenized`` (docs/TRAINING.md); for a
dataset with images ``vision_collate`` (pixels and mRoPE positions, docs/MEDIA.md).

Importing this module needs numpy only; calling ``collate()`` needs PyTorch and says
``pip install 'sftdata[torch]'`` in one line when it is missing.
"""

from __future__ import annotations

from .interop import (
    Collator,
    PairDataset,
    PreferenceCollator,
    SFTDataset,
    SFTSampler,
    UnpairedPreferenceCollator,
    VisionCollator,
    check_model,
    collate,
    media_token_ids,
    pretokenized,
    vision_collate,
)

__all__ = ["Collator", "SFTDataset", "SFTSampler", "check_model", "collate", "PairDataset", "PreferenceCollator",
           "UnpairedPreferenceCollator", "pretokenized", "VisionCollator", "media_token_ids", "vision_collate"]
