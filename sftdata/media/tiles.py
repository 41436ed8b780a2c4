"""Gemma 3, LLaVA-1.5, LLaVA-NeXT and Idefics3 / SmolVLM: an image's token count, decided as
their processors decide it (transformers ``models/<family>/processing_*.py`` and the
``image_processing_pil_*.py`` they call). Pure functions of (pinned settings, width, height).

* Gemma 3: ``image_seq_length`` soft tokens for every image (pan-and-scan off).
* LLaVA-1.5: the center crop's patches, ``(crop_h // patch) * (crop_w // patch)``, plus
  ``num_additional_image_tokens`` (a CLS), less one under the ``default`` feature strategy:
  336 / 14 -> 24 * 24 + 1 - 1 == 576.
* LLaVA-NeXT (anyres): the base crop's patches, plus the best resolution among
  ``image_grid_pinpoints`` cut into crops, unpadded back to the image's aspect ratio, with one
  newline token a row (``LlavaNextProcessor._get_number_of_features``).
* Idefics3 / SmolVLM: the longest edge resized to ``size``, then up to multiples of
  ``max_image_size`` and cut into rows x cols tiles of it, each ``image_seq_len`` tokens, plus
  one global image of ``image_seq_len``; a picture no larger than one tile is the global image
  alone.
"""

from __future__ import annotations

import math

from .counts import MediaCount

IDEFICS3_MAX_IMAGE_SIZE = 4096  # the processors' absolute bound on a resized side


def gemma3_image(settings: dict, width: int, height: int) -> MediaCount:
    size = settings["size"]
    return MediaCount(tokens=settings["image_seq_length"], processed=(size["height"], size["width"]))


def _vision_features(settings: dict, patches: int) -> int:
    """A vision tower's ``patches`` plus its extra tokens, less the CLS the default strategy drops."""
    tokens = patches + settings["num_additional_image_tokens"]
    return tokens - 1 if settings["vision_feature_select_strategy"] == "default" else tokens


def llava_image(settings: dict, width: int, height: int) -> MediaCount:
    crop, patch = settings["crop_size"], settings["patch_size"]
    h, w = crop["height"], crop["width"]
    return MediaCount(tokens=_vision_features(settings, (h // patch) * (w // patch)), processed=(h, w))


def select_best_resolution(height: int, width: int, pinpoints: list) -> tuple[int, int]:
    """The (height, width) of ``pinpoints`` that keeps most of the image and wastes least
    (transformers' ``image_processing_utils.select_best_resolution``)."""
    best, most, least = None, 0, float("inf")
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = pw * ph - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (ph, pw), effective, wasted
    return best


def llava_next_image(settings: dict, width: int, height: int) -> MediaCount:
    crop, patch = settings["crop_size"], settings["patch_size"]
    ch, cw = crop["height"], crop["width"]
    best_h, best_w = select_best_resolution(height, width, settings["image_grid_pinpoints"])
    rows, cols = best_h // ch, best_w // cw
    cur_h, cur_w = (ch // patch) * rows, (cw // patch) * cols
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= (cur_h - new_h) // 2 * 2
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= (cur_w - new_w) // 2 * 2
    base = (ch // patch) * (cw // patch)
    tokens = _vision_features(settings, base) + cur_h * cur_w + cur_h
    return MediaCount(tokens=tokens, processed=(ch, cw), grid=(rows, cols))


def _longest_edge_to(height: int, width: int, longest: int) -> tuple[int, int]:
    """``_resize_output_size_rescale_to_max_len``: the longest edge becomes ``longest`` (up or
    down), the other follows the aspect ratio, rounded up to even."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    return max(height, 1), max(width, 1)


def _below(height: int, width: int, bound: int) -> tuple[int, int]:
    """``_resize_output_size_scale_below_upper_bound``: the longest edge at most ``bound``."""
    aspect = width / height
    if width >= height and width > bound:
        width, height = bound, int(bound / aspect)
    elif height > width and height > bound:
        height, width = bound, int(bound * aspect)
    return max(height, 1), max(width, 1)


def _to_tile_multiples(height: int, width: int, tile: int) -> tuple[int, int]:
    """``resize_for_vision_encoder``: both sides up to multiples of ``tile``."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def idefics3_image(settings: dict, width: int, height: int) -> MediaCount:
    tile, seq = settings["max_image_size"]["longest_edge"], settings["image_seq_len"]
    h, w = height, width
    if settings["do_resize"]:
        h, w = _below(*_longest_edge_to(h, w, settings["size"]["longest_edge"]), IDEFICS3_MAX_IMAGE_SIZE)
    rows = cols = 0
    if settings["do_image_splitting"]:
        h, w = _to_tile_multiples(h, w, tile)
        if h > tile or w > tile:
            rows, cols = (h - tile) // tile + 1, (w - tile) // tile + 1
    return MediaCount(tokens=seq * (rows * cols + 1), processed=(tile, tile), grid=(rows, cols))
