"""The collator of a vision-language dataset (the Qwen-VL family): the text batch of
``Collator`` plus each item's media as pixels and its mRoPE positions.

An item is an ``SFTDataset`` item with ``media``: its ``MediaSpan``s, offsets counted from
the item's first token (an episode's, or a packed row's). The batch adds::

    pixel_values     (patches, C * T * P * P)  every image of the batch, in token order
    image_grid_thw   (images, 3)               one row per image, as recorded (checked)
    position_ids     episodes, padded:  (3, B, T)  each episode's mRoPE rows, 0 on padding
                     packed rows:       (4, B, L)  row 0 the plain positions restarting at every
                     padding-free:      (4, 1, N)  episode (how the model finds the episodes of
                                                   a row), rows 1-3 each episode's own mRoPE

Each episode's positions are its own (``sftdata.media.rope``): equal to the model's
``get_rope_index`` on that episode alone, wherever it sits in a row. With the 4-row form and
no ``attention_mask`` (packed rows, padding-free), transformers' Qwen-VL models confine
attention to each episode, so a packed row's loss is the sum of its episodes' losses alone.

Pixels are made where the collator runs: in the ``DataLoader``'s worker processes (pass
``num_workers``); the main process only receives the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, DatasetError
from ..media.item import MediaSpan
from ..media.rope import EpisodeMedia, MropeSpec, grids_of, packed_mrope, spec_from_settings
from .collate import Collator, flat_index, flat_sequences, is_packed, positions_of, require_torch, sequence_bounds
from .media import MediaLoader

MEDIA_KEY = "media"


def media_token_ids(tokenizer_state: dict) -> dict[str, int]:
    """Every token text -> id a dataset's ``tokenizer_state.json`` records (added and special
    tokens): where the ids of ``<|image_pad|>`` and ``<|video_pad|>`` are found."""
    out: dict[str, int] = {}
    for key in ("special_tokens", "added_tokens"):
        out.update({str(k): int(v) for k, v in ((tokenizer_state or {}).get(key) or {}).items()})
    return out


def vision_collate(dataset, *, tokens_per_second: float = 1.0, processor=None, media_root: str | None = None,
                   padding_free: bool = False, pad_to_multiple_of: int | None = None) -> VisionCollator:
    """The collator of an ``SFTDataset`` with media: the settings pinned in its
    ``tokenizer_state.json``, the ids of its media tokens, its pad id; the model's
    ``vision_config.tokens_per_second`` (Qwen2.5-VL video), optionally the model's own image
    ``processor`` (else built from the pinned settings) and ``media_root`` (where relative
    media URIs are read from)."""
    state = dataset.dataset.tokenizer_state or {}
    settings = state.get("processor")
    if not isinstance(settings, dict):
        raise ConfigError(f"{dataset.path} pins no processor settings (no \"processor\" in tokenizer_state.json): it "
                          f"holds no media; use collate() instead")
    return VisionCollator.of(settings, media_token_ids(state), tokens_per_second=tokens_per_second, processor=processor,
                             media_root=media_root, padding_free=padding_free, pad_id=int(dataset.pad_id),
                             pad_to_multiple_of=pad_to_multiple_of)


@dataclass(frozen=True)
class Placed:
    """One sequence of a batch item: where it starts and how long it is in the item, and its spans."""

    item: int
    start: int
    length: int
    spans: tuple[MediaSpan, ...] = field(default=())


def place_spans(k: int, n: int, spans, starts: np.ndarray, lengths: np.ndarray) -> list[Placed]:
    """The sequences of item ``k`` (``n`` tokens) with each of its spans in the one holding
    it; a span cut by the item's end (a ``block_size`` shorter than the episode) or lying
    across two sequences is a named error."""
    spans = sorted(spans or (), key=lambda s: s.offset)
    where = np.searchsorted(starts, [s.offset for s in spans], side="right") - 1
    owned: list[list[MediaSpan]] = [[] for _ in range(len(starts))]
    for s, seq in zip(spans, where.tolist()):
        end = s.offset + s.item.count.tokens
        if end > n:
            raise ConfigError(f"item {k} of the batch: its {s.item.kind} at tokens {s.offset}..{end - 1} is cut by the "
                              f"item's end ({n} tokens): a block_size shorter than the episode cuts media; leave "
                              f"block_size unset (whole episodes) or raise it")
        if seq < 0 or end > starts[seq] + lengths[seq]:
            raise DatasetError(f"item {k} of the batch: its {s.item.kind} at tokens {s.offset}..{end - 1} does not lie "
                               f"inside one episode of the row")
        owned[seq].append(s)
    return [Placed(k, int(a), int(b), tuple(o)) for a, b, o in zip(starts.tolist(), lengths.tolist(), owned)]


def _relative(p: Placed) -> EpisodeMedia:
    images, videos = grids_of([MediaSpan(s.offset - p.start, s.item) for s in p.spans])
    return EpisodeMedia(p.start, p.length, images, videos)


@dataclass(frozen=True)
class VisionCollator:
    """Picklable (``DataLoader`` workers run it). See the module docstring."""

    spec: MropeSpec
    loader: MediaLoader
    text: Collator = field(default_factory=Collator)

    @classmethod
    def of(cls, settings: dict, token_ids: dict[str, int], *, tokens_per_second: float = 1.0, processor=None,
           media_root: str | None = None, padding_free: bool = False, pad_id: int = 0,
           pad_to_multiple_of: int | None = None) -> VisionCollator:
        """The collator of pinned processor ``settings`` and a tokenizer's ``token_ids``
        (text -> id, ``media_token_ids``); the rest as ``vision_collate``."""
        require_torch()
        return cls(spec_from_settings(settings, token_ids, tokens_per_second), MediaLoader(settings, media_root, processor),
                   Collator(padding_free=padding_free, pad_id=pad_id, pad_to_multiple_of=pad_to_multiple_of))

    def __call__(self, items: list[dict]) -> dict:
        torch = require_torch()
        return {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in self.numpy(items).items()}

    def numpy(self, items: list[dict]) -> dict:
        items = list(items)
        out = self.text.numpy(items)
        packed = is_packed(items[0])
        ids = [np.asarray(it["input_ids"], dtype=np.int64) for it in items]
        pos = [positions_of(it) if packed else None for it in items]
        placed = []
        for k, a in enumerate(ids):
            starts, lengths = sequence_bounds(pos[k]) if packed else (np.zeros(1, np.int64), np.array([a.shape[0]]))
            placed.append(place_spans(k, a.shape[0], items[k].get(MEDIA_KEY), starts, lengths))
        rope = [packed_mrope(a, self.spec, [_relative(p) for p in placed[k]]) for k, a in enumerate(ids)]
        if self.text.padding_free:
            starts, lengths = flat_sequences(ids, pos)
            kept = {(int(s), int(n)) for s, n in zip(starts.tolist(), lengths.tolist())}
            offsets = np.cumsum([0] + [a.shape[0] for a in ids])
            seqs = [p for row in placed for p in row if (int(offsets[p.item]) + p.start, p.length) in kept]
            mrope = np.concatenate(rope, axis=1)[:, flat_index(starts, lengths)]
            out["position_ids"] = np.concatenate([out["position_ids"][None], mrope[:, None]], axis=0)
        else:
            seqs = [p for row in placed for p in row]
            width = out["input_ids"].shape[1]
            mrope = np.zeros((3, len(items), width), dtype=np.int64)
            for k, r in enumerate(rope):
                mrope[:, k, :r.shape[1]] = r
            out["position_ids"] = (np.concatenate([out["position_ids"][None], mrope], axis=0) if packed else mrope)
        spans = [(f"item {p.item} of the batch", s) for p in seqs for s in p.spans]
        out.update(self.loader.images(spans))
        return out

