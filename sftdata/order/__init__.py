"""Training orders as pure functions of seed, epoch and rank (batches, token budgets,
mixtures), the loader's configuration and the audit log.

``sftdata.order`` itself names the batch order (``batches``), the contract the loader and
``replay-order`` share: ``episode_order`` / ``row_order`` build a ``BatchOrder`` that says
which ids are in step N on rank R.
"""

from .batches import (
    DEFAULT_SEED,
    MAX_SEED,
    SAMPLING_MODES,
    BatchOrder,
    Order,
    Origin,
    StepEvent,
    eligible_ids,
    episode_order,
    epoch_permutation,
    row_order,
)

__all__ = ["DEFAULT_SEED", "MAX_SEED", "SAMPLING_MODES", "BatchOrder", "Order", "Origin", "StepEvent", "eligible_ids",
           "episode_order", "epoch_permutation", "row_order"]
