"""Pairs, KTO rows and RL prompts for TRL's ``DPOTrainer``, ``KTOTrainer`` and
``GRPOTrainer`` (the public import is ``sftdata.torch``)::

    from sftdata.torch import PairDataset, PreferenceCollator, pretokenized
    from trl import DPOConfig, DPOTrainer
    ds = PairDataset("data/pref", split="train")                  # items: prompt_ids, chosen_ids, rejected_ids ...
    trainer = pretokenized(DPOTrainer)(model=model, args=DPOConfig(...), train_dataset=ds.to_hf(),
                                       processing_class=tokenizer, data_collator=PreferenceCollator(ds.pad_id))

* ``PairDataset``: item ``i`` is row ``i`` with TRL's key names (lists of ints)::

      pairs    prompt_ids, chosen_ids, rejected_ids, chosen_mask, rejected_mask, record
      kto      prompt_ids, completion_ids, completion_mask, label (bool), record
      prompts  prompt (the prompt's ids), record, and each column of the row as the
               input's JSON text (what a reward function receives as a keyword)

* ``PreferenceCollator`` / ``UnpairedPreferenceCollator``: the batch dicts TRL's DPO and
  KTO losses read (``input_ids``, ``attention_mask``, ``completion_mask``: chosen rows
  first, then rejected; KTO adds ``label`` and the ``KL_`` fields). ``completion_mask``
  is the dataset's mask, not "every completion token": a token the template puts after
  its end of turn (a newline) stays 0, as prepare proved it.
* ``pretokenized(trainer_cls)``: the trainer class that takes these ids as they are
  (TRL re-tokenizes text otherwise: the very split this dataset proves).

Torch is imported only where tensors are made.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..loader import check_tokenizer
from ..loader.indexed import recorded_pad_id
from ..store.format import KIND_KTO, KIND_PAIRS, KIND_PROMPTS
from ..store.reader import open_dataset, require_row_kind
from ..store.rows import RowSplit
from .collate import require_torch
from .dataset import TokenLimits


class PairDataset(TokenLimits):
    """The rows of ``split`` of a pairs, KTO or prompts dataset, as TRL's trainers take
    them (module docstring). ``tokenizer``: the model's tokenizer; a dataset made with
    another is refused (``sftdata.loader.check_tokenizer``). ``vocab_size``,
    ``max_token_id`` and ``check_model(model)`` as ``SFTDataset``'s. Pickles by path."""

    def __init__(self, path: str | Path, split: str = "train", *, tokenizer: str | Path | None = None):
        self.path = Path(path)
        self.split_name = split
        self._open()
        if tokenizer is not None:
            ds = self.dataset
            check_tokenizer(ds.root, ds.metadata, ds.tokenizer_state, tokenizer)

    def _open(self) -> None:
        ds = open_dataset(self.path)
        require_row_kind(ds, "PairDataset")
        self.dataset = ds
        self.kind = ds.kind
        self.rows = RowSplit(ds.kind, ds.split(self.split_name))
        self.pad_id = recorded_pad_id(ds.tokenizer_state)

    def __getstate__(self) -> dict:
        return {"path": str(self.path), "split": self.split_name}

    def __setstate__(self, state: dict) -> None:
        self.path, self.split_name = Path(state["path"]), state["split"]
        self._open()

    def __len__(self) -> int:
        return self.rows.num_rows

    def __getitem__(self, i) -> dict:
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"row {i} is outside the {n} rows of split {self.split_name!r} of {self.path}")
        i %= n
        rs = self.rows
        rec = rs.records[i] if rs.records is not None else -1
        prompt, _ = rs.part(i, 0)
        item = {"record": int(rec)}
        if self.kind == KIND_PROMPTS:
            item["prompt"] = np.asarray(prompt, dtype=np.int64).tolist()
            return {**item, **rs.columns([i])[0]}
        item["prompt_ids"] = np.asarray(prompt, dtype=np.int64).tolist()
        names = ("chosen", "rejected") if self.kind == KIND_PAIRS else ("completion",)
        for k, name in enumerate(names, 1):
            toks, mask = rs.part(i, k)
            item[f"{name}_ids"] = np.asarray(toks, dtype=np.int64).tolist()
            item[f"{name}_mask"] = np.asarray(mask, dtype=np.int64).tolist()
        if self.kind == KIND_KTO:
            item["label"] = bool(rs.labels[i])
        return item

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def to_hf(self, cache_dir: str | Path | None = None):
        """The rows as a ``datasets.Dataset`` (what TRL's trainers take), written by
        ``datasets`` to its Arrow cache (``cache_dir``) row by row, so memory stays flat."""
        try:
            import datasets  # optional dependency: only for TRL's trainers
        except ImportError:
            raise ConfigError("PairDataset.to_hf needs the datasets library: pip install datasets") from None
        return datasets.Dataset.from_generator(_items, gen_kwargs={"path": str(self.path), "split": self.split_name},
                                               cache_dir=None if cache_dir is None else str(cache_dir))

    def __repr__(self) -> str:
        return f"PairDataset({str(self.path)!r}, split={self.split_name!r}, kind={self.kind!r}, rows={len(self)})"


def _items(path: str, split: str):
    yield from PairDataset(path, split)


def _side(item: dict, name: str) -> tuple[list[int], list[int]]:
    """``prompt + completion`` ids and its completion mask (0 over the prompt); an item
    without a mask (TRL's own columns) trains every completion token."""
    prompt = item.get("prompt_ids", item.get("prompt_input_ids"))
    ids = item.get(f"{name}_ids", item.get(f"{name}_input_ids"))
    if prompt is None or ids is None:
        raise ConfigError(f"a preference item needs prompt_ids and {name}_ids (or prompt_input_ids and "
                          f"{name}_input_ids); got keys {sorted(item)}. A trainer with remove_unused_columns=True "
                          f"(TRL's default) drops the columns it does not know: give it PairDataset(...).to_hf() or "
                          f"the Parquet of `sftdata export` (TRL's names), or set remove_unused_columns=False for "
                          f"a file with other names")
    mask = item.get(f"{name}_mask", item.get(f"{name}_loss_mask"))
    mask = [1] * len(ids) if mask is None else list(mask)
    return list(prompt) + list(ids), [0] * len(prompt) + mask


def _pad(rows: list[list[int]], value: int, multiple: int | None) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    if multiple:
        width = -(-width // multiple) * multiple
    out = np.full((len(rows), width), value, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


@dataclass
class PreferenceCollator:
    """TRL's DPO batch from ``PairDataset`` items (or rows with TRL's or the export's
    column names): ``input_ids``, ``attention_mask``, ``completion_mask`` of shape
    ``(2B, T)``, the B ``prompt + chosen`` rows first, then the B ``prompt + rejected``,
    right-padded with ``pad_id``. ``numpy(items)`` gives the same as numpy arrays."""

    pad_id: int
    pad_to_multiple_of: int | None = None

    def numpy(self, items: list[dict]) -> dict:
        sides = [_side(it, "chosen") for it in items] + [_side(it, "rejected") for it in items]
        return self._arrays(sides)

    def _arrays(self, sides: list[tuple[list[int], list[int]]], prefix: str = "") -> dict:
        ids = [s for s, _ in sides]
        return {f"{prefix}input_ids": _pad(ids, self.pad_id, self.pad_to_multiple_of),
                f"{prefix}attention_mask": _pad([[1] * len(s) for s in ids], 0, self.pad_to_multiple_of),
                f"{prefix}completion_mask": _pad([m for _, m in sides], 0, self.pad_to_multiple_of)}

    def __call__(self, items: list[dict]) -> dict:
        torch = require_torch()
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in self.numpy(items).items()}


@dataclass
class UnpairedPreferenceCollator(PreferenceCollator):
    """TRL's KTO batch: ``input_ids``, ``attention_mask``, ``completion_mask`` of each
    ``prompt + completion``, ``label`` (bool), and with ``kl`` (TRL's default losses) the
    ``KL_`` fields of the mismatched pairs TRL builds: prompt ``i`` with the completion of
    item ``i - 1`` (the last one's for the first), within the batch."""

    kl: bool = True

    def numpy(self, items: list[dict]) -> dict:
        out = self._arrays([_side(it, "completion") for it in items])
        if self.kl:
            rolled = [{**it, "completion_ids": prev.get("completion_ids"), "completion_mask": prev.get("completion_mask")}
                      for it, prev in zip(items, items[-1:] + items[:-1])]
            out.update(self._arrays([_side(it, "completion") for it in rolled], "KL_"))
        out["label"] = np.array([bool(it["label"]) for it in items])
        return out


MASK_COLUMNS = ("chosen_mask", "rejected_mask", "completion_mask", "record")


def pretokenized(trainer_cls: type) -> type:
    """``trainer_cls`` (TRL's ``DPOTrainer``, ``KTOTrainer`` or ``GRPOTrainer``) taking a
    ``PairDataset``'s ids as they are: its dataset preparation (which renders and
    tokenizes text again) is skipped, and GRPO's prompts are the prompt ids."""
    return _pretokenized(trainer_cls)


@functools.cache
def _pretokenized(trainer_cls: type) -> type:
    def _prepare_dataset(self, dataset, *args, **kwargs):
        return dataset  # already tokenized: prompt, completions and masks as prepared

    def _set_signature_columns_if_needed(self):
        trainer_cls._set_signature_columns_if_needed(self)
        if self._signature_columns is not None:  # keep the masks a collator of ours reads
            self._signature_columns = list(dict.fromkeys([*self._signature_columns, *MASK_COLUMNS]))

    def _tokenize_prompts(self, prompts: list):
        if prompts and isinstance(prompts[0], list) and all(isinstance(t, int) for t in prompts[0]):
            return [list(p) for p in prompts], None, {}
        return trainer_cls._tokenize_prompts(self, prompts)

    body = {"_prepare_dataset": _prepare_dataset, "_set_signature_columns_if_needed": _set_signature_columns_if_needed,
            "__doc__": f"{trainer_cls.__name__} over sftdata's token ids."}
    if hasattr(trainer_cls, "_tokenize_prompts"):
        body["_tokenize_prompts"] = _tokenize_prompts
    return type(f"Pretokenized{trainer_cls.__name__}", (trainer_cls,), body)
