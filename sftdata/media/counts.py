"""What every family's count returns: the tokens one image or video expands to, and how."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MediaCount:
    """``tokens``: how many image (or video) placeholder tokens the processor expands the item
    to; ``processed``: (height, width) of the pixels the vision tower sees (one tile for tiling
    families); ``grid``: the family's layout, ``(t, h, w)`` patches for the Qwen family (what
    ``image_grid_thw`` / ``video_grid_thw`` hold), ``(rows, cols)`` tiles for LLaVA-NeXT and
    Idefics3 / SmolVLM, ``()`` for a fixed count; ``frames``: the frames a video keeps (0 for
    an image)."""

    tokens: int
    processed: tuple[int, int]
    grid: tuple[int, ...] = ()
    frames: int = 0
    timestamps: tuple[float, ...] = ()
