"""Multimodal rotary positions (mRoPE) of the Qwen-VL family: three position rows
(temporal, height, width) per token, as the model's own ``get_rope_index`` computes them
(transformers ``models/qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``), as pure numpy.

A token is text, image or video by its id (the processor's ``mm_token_type_ids``). A text
token's three positions are equal and count up by one. A run of media tokens holds one item
(or several items of one kind side by side, each taking its own grid); an item of grid
``(t, h, w)`` starting at ``p`` lays its ``t * (h/m) * (w/m)`` tokens (``m`` the spatial merge
size) out as ``(p + T(i), p + j, p + k)`` for temporal patch ``i``, row ``j``, column ``k``,
and the text after it continues at ``p + max(h, w) / m``::

    ids        T  T  I  I  I  I  I  I  T          (one image, grid (1, 4, 6), m = 2: 2 x 3 tokens)
    temporal   0  1  2  2  2  2  2  2  5
    height     0  1  2  2  2  3  3  3  5
    width      0  1  2  3  4  2  3  4  5          (2 + max(4, 6) / 2 = 5)

``T(i) = i`` for Qwen2-VL and Qwen3-VL (a Qwen3-VL video is one run per temporal patch,
each its own ``(1, h, w)`` grid, timestamps in text between); Qwen2.5-VL spaces a video's
temporal patches by ``tokens_per_second * seconds_per_grid`` (truncated, in float32 as the
model computes it). Positions never depend on the tokens before an episode: a packed row
holds each episode's own positions at its offset (``packed_mrope``), 0 on padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, DatasetError
from .item import IMAGE, VIDEO, MediaSpan
from .settings import FAMILY_NAMES, QWEN

TEXT_TYPE, IMAGE_TYPE, VIDEO_TYPE = 0, 1, 2
Grid = tuple[int, int, int]


@dataclass(frozen=True)
class MropeSpec:
    """What a Qwen-VL model's positions depend on besides the ids: ``family`` (qwen2_vl,
    qwen2_5_vl, qwen3_vl), the ids of its image and video placeholder tokens, the vision
    tower's ``merge_size`` and, for Qwen2.5-VL video, ``vision_config.tokens_per_second``."""

    family: str
    image_token_id: int
    video_token_id: int
    merge_size: int = 2
    tokens_per_second: float = 1.0

    def __post_init__(self) -> None:
        if self.family not in QWEN:
            raise ConfigError(f"mRoPE positions are the Qwen-VL family's ({', '.join(FAMILY_NAMES[f] for f in QWEN)}); "
                              f"{FAMILY_NAMES.get(self.family, self.family)} uses plain positions")
        if self.merge_size < 1:
            raise ConfigError(f"merge_size must be >= 1, got {self.merge_size}")


def spec_from_settings(settings: dict, token_ids: dict[str, int], tokens_per_second: float = 1.0) -> MropeSpec:
    """The spec of pinned processor ``settings`` (``read_processor_settings``) and the
    tokenizer's ids of ``<|image_pad|>`` / ``<|video_pad|>`` (``token_ids``: text -> id)."""
    missing = [t for t in ("<|image_pad|>", "<|video_pad|>") if t not in token_ids]
    if missing:
        raise ConfigError(f"the tokenizer has no id for {', '.join(missing)}: a Qwen-VL model's tokenizer has both")
    return MropeSpec(settings.get("family"), int(token_ids["<|image_pad|>"]), int(token_ids["<|video_pad|>"]),
                     int(settings["merge_size"]), tokens_per_second)


@dataclass(frozen=True)
class EpisodeMedia:
    """An episode's place in a packed row (``start``, ``length``) and its media grids in order
    of appearance: ``image_grids``, ``video_grids`` (``(t, h, w)`` each, as the processor's
    ``image_grid_thw`` / ``video_grid_thw``), and each video's ``seconds_per_grid``
    (Qwen2.5-VL's ``second_per_grid_ts``; None: 1 second each, as the model assumes)."""

    start: int
    length: int
    image_grids: tuple[Grid, ...] = ()
    video_grids: tuple[Grid, ...] = ()
    seconds_per_grid: tuple[float, ...] | None = field(default=None)


def grids_of(spans: Sequence[MediaSpan]) -> tuple[tuple[Grid, ...], tuple[Grid, ...]]:
    """(image grids, video grids) of an episode's spans, each in order of offset."""
    ordered = sorted(spans, key=lambda s: s.offset)
    grids = {IMAGE: [], VIDEO: []}
    for s in ordered:
        grids[s.item.kind].append(tuple(int(x) for x in s.item.count.grid))
    return tuple(grids[IMAGE]), tuple(grids[VIDEO])


def _runs(types: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of equal values of ``types``."""
    n = types.shape[0]
    cut = np.flatnonzero(types[1:] != types[:-1]) + 1
    starts = np.concatenate([[0], cut]).astype(np.int64)
    return starts, np.append(starts[1:], n)


def _item_positions(start: int, grid: Grid, m: int, interval) -> np.ndarray:
    """(3, t * h/m * w/m) positions of one item starting at ``start`` (``get_vision_position_ids``)."""
    t, h, w = grid[0], grid[1] // m, grid[2] // m
    if isinstance(interval, np.floating):  # float32, as torch multiplies an int arange by a float tensor
        temporal = (np.arange(t, dtype=np.float32) * interval).astype(np.int64)
    else:
        temporal = np.arange(t, dtype=np.int64) * int(interval)
    out = np.empty((3, t, h, w), dtype=np.int64)
    out[0] = (temporal + start)[:, None, None]
    out[1] = (np.arange(h, dtype=np.int64) + start)[None, :, None]
    out[2] = (np.arange(w, dtype=np.int64) + start)[None, None, :]
    return out.reshape(3, -1)


def _intervals(spec: MropeSpec, videos: int, seconds: Sequence[float] | None) -> list:
    """Each video's temporal spacing: 1 (Qwen2-VL, Qwen3-VL), Qwen2.5-VL's
    ``tokens_per_second * seconds_per_grid`` (float32 when seconds are given, as a tensor)."""
    if spec.family != "qwen2_5_vl":
        return [1] * videos
    if seconds is None:
        tps = spec.tokens_per_second
        return [int(tps) if float(tps).is_integer() else np.float32(tps)] * videos
    if len(seconds) != videos:
        raise DatasetError(f"{len(seconds)} seconds_per_grid for {videos} video(s): give one per video")
    return [np.float32(np.float32(s) * np.float32(spec.tokens_per_second)) for s in seconds]


def mrope_positions(ids: np.ndarray, spec: MropeSpec, image_grids: Sequence[Grid] = (), video_grids: Sequence[Grid] = (),
                    seconds_per_grid: Sequence[float] | None = None, where: str = "the episode") -> np.ndarray:
    """The (3, len(ids)) int64 positions of one episode (module docstring): equal to
    ``model.get_rope_index(ids[None], mm_token_type_ids, image_grid_thw, video_grid_thw,
    second_per_grid_ts)[0][:, 0]``. A run of media tokens that the grids do not fill exactly
    is a ``DatasetError`` naming ``where``, the item and both counts."""
    ids = np.asarray(ids)
    n = ids.shape[0]
    types = np.zeros(n, dtype=np.int8)
    types[ids == spec.image_token_id] = IMAGE_TYPE
    types[ids == spec.video_token_id] = VIDEO_TYPE
    m = spec.merge_size
    grids = {IMAGE_TYPE: [tuple(int(x) for x in g) for g in image_grids],
             VIDEO_TYPE: [tuple(int(x) for x in g) for g in video_grids]}
    intervals = {IMAGE_TYPE: [1] * len(grids[IMAGE_TYPE]),
                 VIDEO_TYPE: _intervals(spec, len(grids[VIDEO_TYPE]), seconds_per_grid)}
    if spec.family == "qwen3_vl":  # one run per temporal patch: each a (1, h, w) grid
        grids[VIDEO_TYPE] = [(1, h, w) for t, h, w in grids[VIDEO_TYPE] for _ in range(t)]
        intervals[VIDEO_TYPE] = [1] * len(grids[VIDEO_TYPE])
    used = {IMAGE_TYPE: 0, VIDEO_TYPE: 0}
    out = np.empty((3, n), dtype=np.int64)
    pos = 0
    if n == 0:
        return out
    for s, e in zip(*_runs(types)):
        kind = int(types[s])
        if kind == TEXT_TYPE:
            out[:, s:e] = np.arange(pos, pos + e - s, dtype=np.int64)
            pos += int(e - s)
            continue
        at = int(s)
        while at < e:  # items of one kind side by side share a run: each takes its own grid
            k = used[kind]
            name = IMAGE if kind == IMAGE_TYPE else VIDEO
            if k >= len(grids[kind]):
                raise DatasetError(f"{where}: {name} tokens at {at} but only {len(grids[kind])} {name} grid(s) given; "
                                   f"every run of {name} tokens needs its grid (the media table's)")
            grid = grids[kind][k]
            size = grid[0] * (grid[1] // m) * (grid[2] // m)
            if at + size > e:
                raise DatasetError(f"{where}: {name} {k + 1} (grid {grid}) needs {size} tokens from {at}, but its run of "
                                   f"{name} tokens ends at {e}: the ids and the media table disagree")
            out[:, at:at + size] = _item_positions(pos, grid, m, intervals[kind][k])
            pos += max(grid[1], grid[2]) // m
            used[kind] += 1
            at += size
    for kind, name in ((IMAGE_TYPE, IMAGE), (VIDEO_TYPE, VIDEO)):
        if used[kind] != len(grids[kind]):
            raise DatasetError(f"{where}: {len(grids[kind])} {name} grid(s) given but the ids hold {used[kind]} "
                               f"{name} item(s): the ids and the media table disagree")
    return out


def packed_mrope(ids: np.ndarray, spec: MropeSpec, episodes: Sequence[EpisodeMedia]) -> np.ndarray:
    """The (3, len(ids)) positions of a packed row (or padding-free batch): each episode's
    ``mrope_positions`` computed alone and placed at its ``start``; 0 wherever no episode is
    (padding)::

        row        [ episode A (5 tokens) ][ episode B (4 tokens) ][ pad pad ]
        positions    A's own 3 x 5            B's own 3 x 4             0   0
    """
    ids = np.asarray(ids)
    out = np.zeros((3, ids.shape[0]), dtype=np.int64)
    for k, ep in enumerate(episodes):
        if ep.start < 0 or ep.length < 0 or ep.start + ep.length > ids.shape[0]:
            raise DatasetError(f"episode {k} of the row ([{ep.start}, {ep.start + ep.length})) lies outside its "
                               f"{ids.shape[0]} tokens")
        out[:, ep.start:ep.start + ep.length] = mrope_positions(
            ids[ep.start:ep.start + ep.length], spec, ep.image_grids, ep.video_grids, ep.seconds_per_grid,
            where=f"episode {k} of the row (tokens {ep.start}..{ep.start + ep.length - 1})")
    return out


def text_positions(length: int, episodes: Sequence[EpisodeMedia]) -> np.ndarray:
    """The plain positions of a packed row: 0, 1, 2 ... restarting at every episode's start,
    0 on padding. A Qwen-VL model finds a packed row's sequences from these (row 0 of a
    4-row ``position_ids``), since its mRoPE rows do not count up by one inside an image."""
    out = np.zeros(length, dtype=np.int64)
    for ep in episodes:
        out[ep.start:ep.start + ep.length] = np.arange(ep.length, dtype=np.int64)
    return out
