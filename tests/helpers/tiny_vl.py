"""Tiny randomly initialised Qwen-VL models on CPU (hidden 32, one layer, vision depth 1,
vocabulary 200): the reference for mRoPE positions (``get_rope_index``) and for losses on
packed rows. Token ids 150-153 are the vision start, image, video and vision end tokens."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np

from sftdata.media import image_count, image_header, settings_from_dicts
from sftdata.media.item import MediaItem, MediaSpan

VOCAB = 200
VISION_START, IMAGE_ID, VIDEO_ID, VISION_END = 150, 151, 152, 153
TEXT_IDS = 150  # ordinary text ids are 0..149

_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "vocab_size": VOCAB, "bos_token_id": None, "eos_token_id": None}
_TOKENS = {"image_token_id": IMAGE_ID, "video_token_id": VIDEO_ID, "vision_start_token_id": VISION_START,
           "vision_end_token_id": VISION_END}


def tiny_config(family: str, *, patch_size: int = 14, merge_size: int = 2, tokens_per_second: int = 4):
    """The config of a tiny model of ``family`` (qwen2_vl, qwen2_5_vl, qwen3_vl)."""
    import transformers

    if family == "qwen2_vl":
        return transformers.Qwen2VLConfig(
            text_config={**_TEXT, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                                      "rope_theta": 10000.0}},
            vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2,
                           "spatial_merge_size": merge_size, "patch_size": patch_size, "temporal_patch_size": 2},
            **_TOKENS)
    if family == "qwen2_5_vl":
        return transformers.Qwen2_5_VLConfig(
            text_config={**_TEXT, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                                      "rope_theta": 10000.0}},
            vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                           "out_hidden_size": 32, "spatial_merge_size": merge_size, "patch_size": patch_size,
                           "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [0],
                           "tokens_per_second": tokens_per_second},
            **_TOKENS)
    if family == "qwen3_vl":
        return transformers.Qwen3VLConfig(
            text_config={**_TEXT, "head_dim": 16, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                                                       "mrope_interleaved": True, "rope_theta": 10000.0}},
            vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                           "out_hidden_size": 32, "spatial_merge_size": merge_size, "patch_size": patch_size,
                           "temporal_patch_size": 2, "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
            **_TOKENS)
    raise ValueError(family)


def tiny_model(family: str, cls: str = "Model", seed: int = 0, **kwargs):
    """A tiny ``<Family>Model`` (or ``ForConditionalGeneration``), weights from ``seed``, in eval mode."""
    import torch
    import transformers

    names = {"qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl": "Qwen3VL"}
    torch.manual_seed(seed)
    model = getattr(transformers, f"{names[family]}{cls}")(tiny_config(family, **kwargs))
    return model.eval()


# --------------------------------------------------------------------------- episodes with images
# a Qwen2-VL processor's published fields, bounded so that images stay a few dozen tokens
PUBLISHED = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64, "patch_size": 14, "temporal_patch_size": 2,
             "merge_size": 2, "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"}
TOKEN_IDS = {"<|image_pad|>": IMAGE_ID, "<|video_pad|>": VIDEO_ID, "<|vision_start|>": VISION_START,
             "<|vision_end|>": VISION_END}


PUBLISHED_BY_FAMILY = {"qwen2_vl": PUBLISHED, "qwen2_5_vl": {**PUBLISHED, "processor_class": "Qwen2_5_VLProcessor"},
                       "qwen3_vl": {**PUBLISHED, "processor_class": "Qwen3VLProcessor", "patch_size": 16,
                                    "min_pixels": 64 * 64, "max_pixels": 32 * 32 * 64}}


def settings(family: str = "qwen2_vl"):
    """The pinned settings of ``family``'s bounded processor (Qwen3-VL: patch 16)."""
    return settings_from_dicts(PUBLISHED_BY_FAMILY[family])


def write_image(path, width: int, height: int, *, fmt: str = "PNG", orientation: int | None = None, seed: int = 0):
    """An image of random pixels at ``path`` (EXIF ``orientation`` if given); returns the path."""
    from PIL import Image

    im = Image.frombytes("RGB", (width, height), random.Random(seed).randbytes(width * height * 3))
    kwargs = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif.tobytes()
    im.save(path, fmt, **kwargs)
    return path


def image_span(path, offset: int, pinned: dict):
    """The span prepare records for the image at ``path`` whose tokens start at ``offset``."""
    data = Path(path).read_bytes()
    h = image_header(data)
    item = MediaItem("image", str(path), hashlib.sha256(data).hexdigest(), len(data), (h.width, h.height),
                     (h.stored_width, h.stored_height), image_count(pinned, h.width, h.height))
    return MediaSpan(offset, item)


def vision_episode(rng, folder, pinned: dict, images: int, name: str) -> dict:
    """An item as ``SFTDataset`` gives one from a dataset with media: a prompt with ``images``
    images of random sizes (each inside vision start / end), then a reply; ``labels`` train
    the reply only (never a media token, never the first token)."""
    ids, spans = [rng.randrange(TEXT_IDS) for _ in range(rng.randint(1, 5))], []
    for k in range(images):
        path = write_image(folder / f"{name}-{k}.png", rng.randint(20, 300), rng.randint(20, 300), seed=rng.random())
        ids.append(VISION_START)
        span = image_span(path, len(ids), pinned)
        spans.append(span)
        ids += [IMAGE_ID] * span.item.count.tokens + [VISION_END] + [rng.randrange(TEXT_IDS) for _ in range(rng.randint(0, 4))]
    prompt = len(ids)
    ids += [rng.randrange(TEXT_IDS) for _ in range(rng.randint(2, 8))]
    ids = np.array(ids, dtype=np.int64)
    labels = np.where(np.arange(ids.shape[0]) >= prompt, ids, -100)
    return {"input_ids": ids, "labels": labels, "media": tuple(spans)}
