"""``SFTSampler``: the loader's order (docs/ARCHITECTURE.md §4) as a sampler of item ids.

It asks ``sftdata.order`` (``episode_order`` / ``row_order``, the calls the loader and
``sftdata replay-order`` make) which ids are in each step, and hands them out step after
step. A ``DataLoader`` with the same ``batch_size`` cuts them into exactly the loader's
batches, so ``sftdata replay-order DATASET --config CFG --step N`` lists what step N of
such a run trained on::

    cfg: batch_size 2, epoch_seed 7      epoch 0 = RandomState(7 + 0).permutation(eligible)
    sampler yields:   3 0 | 4 1 | ...    DataLoader(batch_size=2) -> steps 0, 1, ...

Epochs are those of the order: ``set_epoch(e)`` (what ``transformers.Trainer`` and a
``DistributedSampler`` loop call) selects the steps that start in epoch ``e``. A packed
dataset is read once (one pass, as the loader does): after epoch 0 there is nothing
more. ``batch_sampling_mode=random`` has no epochs and no length: the steps run on.

With several processes: ``rank=None`` (default) hands out each global batch of
``batch_size * world_size`` ids whole, in rank order, for a trainer that splits every
run of ``world_size`` batches over its processes (``accelerate``, and so
``transformers.Trainer``, gives process r the r-th); ``rank=r`` hands out only rank r's
slots (a plain DDP loop).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import ConfigError
from ..loader import dataset_identity
from ..order.batches import BatchOrder, episode_order, row_order
from ..order.budget import row_batch_order
from ..order.config import LoaderConfig
from ..store.rows import ROW_ITEMS
from .dataset import SFTDataset
from .pairs import PairDataset

STATE_FORMAT = "sftdata-sampler-state"
STATE_VERSION = 1


class SFTSampler:
    """Item ids of ``dataset`` in the order ``config`` (a ``LoaderConfig``: batch_size,
    epoch_seed, epoch_shuffle, epoch_drop_last, episode_min_tokens, batch_sampling_mode)
    gives. Iterating yields the ids of the steps of the current epoch, from
    ``start_step`` on; ``len()`` counts them."""

    def __init__(self, dataset: SFTDataset | PairDataset, config: LoaderConfig | None = None, *, world_size: int = 1,
                 rank: int | None = None):
        if not isinstance(dataset, (SFTDataset, PairDataset)):
            raise ConfigError(f"SFTSampler orders an SFTDataset or a PairDataset, got {type(dataset).__name__}")
        cfg = config if config is not None else LoaderConfig()
        if not isinstance(cfg, LoaderConfig):
            raise ConfigError(f"config must be a LoaderConfig (LoaderConfig.from_file(...) reads the file "
                              f"replay-order is given), got {type(cfg).__name__}")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"world_size must be an integer >= 1, got {world_size!r}")
        if rank is not None and (not isinstance(rank, int) or not 0 <= rank < world_size):
            raise ConfigError(f"rank must be None or an integer in 0..{world_size - 1}, got {rank!r}")
        self.dataset = dataset
        self.config = cfg
        self.world_size = world_size
        self.rank = rank
        what = f"split {dataset.split_name!r} of {dataset.path}"
        if getattr(cfg, "batch_tokens", None) is not None:
            raise ConfigError("batch_tokens sizes the batches of sftdata's own Loader; this sampler yields "
                              "batch_size indices per step: leave batch_tokens null here")
        if isinstance(dataset, PairDataset):  # pair ids, in the pair loader's order (make_pair_loader)
            self.order: BatchOrder = row_batch_order(cfg, dataset.rows.sequence_lengths, world_size, what=what,
                                                     items=ROW_ITEMS[dataset.kind])
        elif dataset.kind == "packed":
            self.order = row_order(cfg, len(dataset), world_size, what=what)
        else:
            self.order = episode_order(cfg, dataset.lengths, world_size, what=what)
        self.epoch = 0
        self.start_step = 0
        self._identity = dataset_identity(dataset.path)

    @property
    def batch_size(self) -> int:
        """Ids per batch of the ``DataLoader``: ``batch_size`` (one rank's slots, or one of
        the ``world_size`` batches a global batch is handed out as)."""
        return self.order.batch_size

    # -- epochs and steps -------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"epoch must be an integer >= 0, got {epoch!r}")
        self.epoch = int(epoch)

    def steps(self) -> range:
        """The steps the next iteration hands out: those starting in the current epoch,
        from ``start_step`` on (random sampling: every step from ``start_step``, endless)."""
        o = self.order
        if o.sampling == "random":
            raise TypeError("batch_sampling_mode=random has no epochs: its steps run on without end")
        if o.one_pass and self.epoch > 0:
            return range(0)  # one pass: training ends when the data ends, as in the loader
        first, end = o.first_step_of_epoch(self.epoch), o.first_step_of_epoch(self.epoch + 1)
        return range(max(first, self.start_step), max(end, self.start_step))

    def step_ids(self, step: int) -> np.ndarray:
        """The ids this sampler hands out for ``step`` (what ``replay-order --step`` lists,
        for one rank or all)."""
        ids = self.order.step_ids(step, self.rank)
        return ids[ids >= 0]  # a one-pass order's padding rows (-1) carry no target: left out

    def __iter__(self) -> Iterator[int]:
        if self.order.sampling == "random":
            step = self.start_step
            while True:
                yield from self.step_ids(step).tolist()
                step += 1
        for step in self.steps():
            yield from self.step_ids(step).tolist()

    def __len__(self) -> int:
        steps = self.steps()
        if not steps:
            return 0
        per = self.order.global_batch if self.rank is None else self.order.batch_size
        last = self.step_ids(steps[-1]).size  # a one-pass order's last batch may hold padding rows
        return (len(steps) - 1) * per + last

    # -- resume -----------------------------------------------------------------------
    def state_dict(self, step: int) -> dict:
        """The state to resume at ``step``: the number of batches the training loop has
        trained (its next step). JSON-able."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ConfigError(f"step must be an integer >= 0 (the batches trained so far), got {step!r}")
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "step": int(step), "order": self._fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        """Continue at the saved step: the next iteration starts there, in its epoch
        (``self.epoch``). Refused when the order would differ."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError("not a sampler state (expected the dict returned by sampler.state_dict(step))")
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"sampler state version {state.get('version')!r} is not supported (this sftdata reads "
                              f"{STATE_VERSION})")
        saved = state.get("order") or {}
        diff = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in self._fingerprint().items() if saved.get(k) != v]
        if diff:
            raise ConfigError("cannot resume: the sampler state was saved with other order settings or another "
                              "dataset, so the remaining batches would differ (" + "; ".join(diff) + "). Resume with "
                              "the original config and dataset")
        step = state.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"sampler state: step must be an integer >= 0, got {step!r}")
        self.start_step = step
        o = self.order
        if o.sampling == "epoch":
            total = o.steps_total
            self.epoch = 1 if total is not None and step >= total else o.epoch_of_step(step)

    def _fingerprint(self) -> dict:
        o = self.order
        return {"kind": self.dataset.kind, "split": self.dataset.split_name, "items": len(self.dataset),
                "batch_size": o.batch_size, "world_size": o.world_size, "epoch_seed": o.seed,
                "epoch_shuffle": o.shuffle, "epoch_drop_last": o.drop_last, "batch_sampling_mode": o.sampling,
                "episode_min_tokens": self.config.episode_min_tokens, "dataset_content_sha256": self._identity}
