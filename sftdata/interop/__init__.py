"""Training on an sftdata dataset with other trainers: ``transformers.Trainer``, TRL's
``SFTTrainer`` or a plain PyTorch loop (the public import is ``sftdata.torch``)::

    from sftdata.torch import SFTDataset, collate
    ds = SFTDataset("data/chat_sft_packed", split="train")        # episodes or packed rows
    trainer = transformers.Trainer(model=model, train_dataset=ds, data_collator=collate(padding_free=True), ...)

* ``dataset``: ``SFTDataset``, items as ``transformers`` models take them (numpy arrays);
* ``collate``: the batch dicts (padded, or padding-free with flash-attention varlen kwargs);
* ``sampler``: ``SFTSampler``, the loader's order (``sftdata.order``), so ``replay-order``
  answers for a run that used it;
* ``pairs``: ``PairDataset``, ``PreferenceCollator`` and ``pretokenized`` for TRL's
  ``DPOTrainer``, ``KTOTrainer`` and ``GRPOTrainer`` on pairs, KTO rows and RL prompts;
* ``vision``, ``media``: ``vision_collate``, a dataset with images: pixels made in the
  ``DataLoader``'s workers, each episode's mRoPE positions (docs/MEDIA.md).

Torch is imported only where tensors are made (the collators); docs/INTEROP.md.
"""

from .collate import Collator, collate, flatten, positions_of, require_torch, sequence_bounds
from .dataset import SFTDataset, check_model
from .media import MediaChangedError, MediaLoader, ResolutionDriftError, image_processor
from .pairs import PairDataset, PreferenceCollator, UnpairedPreferenceCollator, pretokenized
from .sampler import SFTSampler
from .vision import VisionCollator, media_token_ids, vision_collate

__all__ = ["Collator", "SFTDataset", "SFTSampler", "check_model", "collate", "flatten", "positions_of",
           "require_torch", "sequence_bounds", "PairDataset", "PreferenceCollator", "UnpairedPreferenceCollator",
           "pretokenized", "MediaChangedError", "MediaLoader", "ResolutionDriftError", "image_processor", "VisionCollator",
           "media_token_ids", "vision_collate"]
