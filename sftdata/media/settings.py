"""A model folder's processor settings: which family it is, and the fields that decide each
image's (and video's) token count, pinned as a plain dict for ``tokenizer_state.json``.

The family comes from ``processor_class`` (``processor_config.json``, else
``preprocessor_config.json``), else from ``image_processor_type`` (its ``Fast`` / ``Pil``
suffix dropped) with ``config.json``'s ``model_type`` where one image processor serves several
families. A family sftdata cannot count is refused up front, by name. Missing fields take the
defaults of the processor class that would read the file, so the pinned settings are the ones
the processor uses.

The token strings a processor writes (``<|image_pad|>``, ``<start_of_image>``, ``<image>``...)
are its class's defaults unless the tokenizer names others as attributes (``tokenizer_config.json``:
a top-level ``<name>_token`` key, or ``extra_special_tokens`` as a dict), or, for LLaVA,
``processor_config.json``'s ``image_token``: those that differ from the defaults are pinned
under ``"tokens"``, so a folder with the usual tokens pins the same settings as before.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from ..errors import ConfigError

IMAGE_FILES = ("preprocessor_config.json",)
PROCESSOR_FILE = "processor_config.json"
VIDEO_FILE = "video_preprocessor_config.json"
TOKENIZER_FILE = "tokenizer_config.json"
FAMILY_NAMES = {"qwen2_vl": "Qwen2-VL", "qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL", "gemma3": "Gemma 3",
                "llava": "LLaVA-1.5", "llava_next": "LLaVA-NeXT", "idefics3": "Idefics3", "smolvlm": "SmolVLM"}
SUPPORTED = ", ".join(FAMILY_NAMES.values())
PROCESSOR_CLASSES = {"Qwen2VLProcessor": "qwen2_vl", "Qwen2_5_VLProcessor": "qwen2_5_vl", "Qwen3VLProcessor": "qwen3_vl",
                     "Gemma3Processor": "gemma3", "LlavaProcessor": "llava", "LlavaNextProcessor": "llava_next",
                     "Idefics3Processor": "idefics3", "SmolVLMProcessor": "smolvlm"}
IMAGE_PROCESSOR_TYPES = {"Gemma3ImageProcessor": "gemma3", "LlavaNextImageProcessor": "llava_next",
                         "Idefics3ImageProcessor": "idefics3", "SmolVLMImageProcessor": "smolvlm"}
QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# the defaults of the processor classes that read these files (transformers models/<family>/)
QWEN_IMAGE = {"size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}, "patch_size": 14,
              "temporal_patch_size": 2, "merge_size": 2}
QWEN_VIDEO = {"size": {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}, "patch_size": 14,
              "temporal_patch_size": 2, "merge_size": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": False,
              "fps": None, "num_frames": None, "cap_pixels_per_frame": False, "max_video_tokens": 128000}
QWEN3_VIDEO = {**QWEN_VIDEO, "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}, "patch_size": 16,
               "do_sample_frames": True, "fps": 2, "max_video_tokens": 768}
TILED = {"size": {"longest_edge": 4 * 364}, "max_image_size": {"longest_edge": 364}, "do_resize": True,
         "do_image_splitting": True}
LLAVA_NEXT_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
SQUARE_224 = {"height": 224, "width": 224}
# the token strings each family's processor writes, as its class defaults them (Gemma 3's processor
# has none of its own: it reads the tokenizer's, and these are the ones Gemma 3's tokenizer names)
_QWEN_TOKENS = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"}
_TILE_TOKENS = {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                "global_image_token": "<global-img>"}
FAMILY_TOKENS = {"qwen2_vl": _QWEN_TOKENS, "qwen2_5_vl": _QWEN_TOKENS,
                 "qwen3_vl": {**_QWEN_TOKENS, "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"},
                 "gemma3": {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>",
                            "eoi_token": "<end_of_image>"},
                 "llava": {"image_token": "<image>"}, "llava_next": {"image_token": "<image>"},
                 "idefics3": _TILE_TOKENS, "smolvlm": _TILE_TOKENS}
FIXED_TOKENS = ("idefics3",)  # its processor writes the defaults whatever the tokenizer names


def _base_name(type_name: str | None) -> str | None:
    if not type_name:
        return None
    for suffix in ("Fast", "Pil"):
        type_name = type_name.removesuffix(suffix)
    return type_name


def identify_family(image: dict, processor: dict, config: dict) -> str:
    """The family of a processor, or a ``ConfigError`` naming the one sftdata cannot count."""
    processor_class = processor.get("processor_class") or image.get("processor_class")
    if processor_class in PROCESSOR_CLASSES:
        return PROCESSOR_CLASSES[processor_class]
    image_type = _base_name(image.get("image_processor_type"))
    model_type = config.get("model_type")
    if image_type in IMAGE_PROCESSOR_TYPES:
        return IMAGE_PROCESSOR_TYPES[image_type]
    if image_type == "Qwen2VLImageProcessor":
        return model_type if model_type in QWEN else "qwen2_vl"
    if image_type == "CLIPImageProcessor" and model_type == "llava":
        return "llava"
    named = processor_class or image_type or model_type or "unnamed"
    raise ConfigError(f"the model's processor is {named}: sftdata counts image tokens for {SUPPORTED} only")


def _qwen_pixels(d: dict, defaults: dict) -> dict:
    """min_pixels / max_pixels as the Qwen-VL processors' __init__ sets them: the top-level
    fields win over ``size`` (whose keys are shortest_edge / longest_edge, or the older
    min_pixels / max_pixels)."""
    size = dict(d.get("size") or defaults["size"])
    low = d.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels")
    high = d.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels")
    if not low or not high:
        raise ConfigError(f"the Qwen-VL processor settings need min_pixels and max_pixels (or size.shortest_edge "
                          f"and size.longest_edge); got size={d.get('size')!r}")
    return {"min_pixels": int(low), "max_pixels": int(high)}


def _qwen(family: str, image: dict, video: dict | None) -> dict:
    d = {**QWEN_IMAGE, **image}
    out = {"family": family, **_qwen_pixels(image, QWEN_IMAGE),
           **{k: int(d[k]) for k in ("patch_size", "merge_size", "temporal_patch_size")}}
    defaults = QWEN3_VIDEO if family == "qwen3_vl" else QWEN_VIDEO
    v = {**defaults, **(video if video is not None else image)}
    out["video"] = {**_qwen_pixels(video if video is not None else image, defaults),
                    **{k: v[k] for k in defaults if k != "size"}}
    out["video"]["cap_pixels_per_frame"] = bool(out["video"]["cap_pixels_per_frame"])
    return out


def _llava(family: str, image: dict, processor: dict) -> dict:
    if processor.get("patch_size") is None:
        raise ConfigError(f"the {FAMILY_NAMES[family]} processor settings have no patch_size "
                          f"({PROCESSOR_FILE}): its processor cannot expand <image> without it")
    if image.get("do_center_crop") is False:
        raise ConfigError(f"the {FAMILY_NAMES[family]} image processor has do_center_crop false: its token count then "
                          f"depends on the pixels, which sftdata does not support")
    out = {"family": family, "crop_size": dict(image.get("crop_size") or SQUARE_224),
           "patch_size": int(processor["patch_size"]),
           "num_additional_image_tokens": int(processor.get("num_additional_image_tokens") or 0),
           "vision_feature_select_strategy": processor.get("vision_feature_select_strategy")}
    if family == "llava_next":
        out["image_grid_pinpoints"] = [list(p) for p in image.get("image_grid_pinpoints") or LLAVA_NEXT_PINPOINTS]
    return out


def _token_text(value) -> str | None:
    """A token as a tokenizer config writes it: a string, or a dict marked ``"__type":
    "AddedToken"`` (transformers reads no other dict as a token)."""
    if isinstance(value, dict) and value.get("__type") == "AddedToken":
        value = value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_tokens(tokenizer: dict) -> dict[str, str]:
    """The named tokens a tokenizer gets as attributes from its ``tokenizer_config.json``, as
    transformers 5 reads them: each top-level ``<name>_token`` key, then ``extra_special_tokens``
    when it is a dict (which wins)."""
    named = {k: _token_text(v) for k, v in tokenizer.items() if k.endswith("_token")}
    extra = tokenizer.get("extra_special_tokens")
    if isinstance(extra, dict):
        named.update({k: _token_text(v) for k, v in extra.items()})
    return {k: v for k, v in named.items() if v is not None}


def _pinned_tokens(family: str, processor: dict, tokenizer: dict) -> dict[str, str]:
    """The token strings the family's processor would write that differ from its defaults:
    the tokenizer's attributes win over the processor's own setting (LLaVA's ``image_token``)."""
    defaults = FAMILY_TOKENS[family]
    if family in FIXED_TOKENS:
        return {}
    found = {"image_token": processor["image_token"]} if family in ("llava", "llava_next") and \
        isinstance(processor.get("image_token"), str) else {}
    named = tokenizer_tokens(tokenizer)
    found.update({k: named[k] for k in defaults if k in named})
    return {k: v for k, v in found.items() if v != defaults[k]}


def family_tokens(settings: dict) -> dict[str, str]:
    """The token strings a family's processor writes under pinned settings: its defaults, with
    the pinned ``"tokens"`` over them."""
    return {**FAMILY_TOKENS[settings["family"]], **settings.get("tokens", {})}


def settings_from_dicts(image: dict, processor: dict | None = None, config: dict | None = None,
                        video: dict | None = None, tokenizer: dict | None = None) -> dict:
    """The pinned settings from the parsed files: the image processor's (``preprocessor_config.json``),
    the processor's (``processor_config.json``), the model's (``config.json``), the video
    processor's (``video_preprocessor_config.json``, None when the folder has none) and the
    tokenizer's (``tokenizer_config.json``: the token strings it names)."""
    processor, config = processor or {}, config or {}
    family = identify_family(image, processor, config)
    out = _family_settings(family, image, processor, video)
    tokens = _pinned_tokens(family, processor, tokenizer or {})
    return {**out, "tokens": tokens} if tokens else out


def _family_settings(family: str, image: dict, processor: dict, video: dict | None) -> dict:
    if family in QWEN:
        return _qwen(family, image, video)
    if family == "gemma3":
        if image.get("do_pan_and_scan") or processor.get("do_pan_and_scan"):
            raise ConfigError("the Gemma 3 processor has do_pan_and_scan on: its crops depend on each image, which "
                              "sftdata does not count; turn it off (the default)")
        return {"family": family, "image_seq_length": int(processor.get("image_seq_length") or 256),
                "size": dict(image.get("size") or SQUARE_224)}
    if family in ("llava", "llava_next"):
        return _llava(family, image, processor)
    d = {**TILED, **image}
    return {"family": family, "do_resize": bool(d["do_resize"]), "size": {"longest_edge": int(d["size"]["longest_edge"])},
            "max_image_size": {"longest_edge": int(d["max_image_size"]["longest_edge"])},
            "do_image_splitting": bool(d["do_image_splitting"]),
            "image_seq_len": int(processor.get("image_seq_len") or 169)}


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise ConfigError(f"{path} cannot be read as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def read_processor_settings(folder: str | Path) -> dict:
    """The pinned settings of a model folder's processor (see ``settings_from_dicts``), read in
    transformers' order: a settings dict nested in ``processor_config.json``, then the
    processor's own file; the token strings from ``tokenizer_config.json``. A folder without
    an image processor's settings is a ``ConfigError`` naming the files it looked for."""
    folder = Path(folder)
    processor = _read_json(folder / PROCESSOR_FILE) or {}
    image_file = _read_json(folder / IMAGE_FILES[0])
    image = _nested(processor, "image_processor", image_file)
    if image is None:
        raise ConfigError(f"{folder} has no {IMAGE_FILES[0]} (nor an image_processor in {PROCESSOR_FILE}): a vision "
                          f"model's folder holds the settings of its image processor there")
    video = _nested(processor, "video_processor", _read_json(folder / VIDEO_FILE))
    return settings_from_dicts(image, processor, _read_json(folder / "config.json") or {}, video,
                               _read_json(folder / TOKENIZER_FILE) or {})


def _nested(processor: dict, key: str, own_file: dict | None) -> dict | None:
    """The settings transformers loads: nested in processor_config.json first, then the
    processor's own file (a video processor without one falls back to the image settings)."""
    nested = processor.get(key)
    return nested if isinstance(nested, dict) else own_file


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def settings_differences(trained: dict, served: dict) -> list[str]:
    """Each field where two pinned settings disagree, as ``field: A at training, B serving``."""
    a, b = _flatten(trained), _flatten(served)
    return [f"{k}: {a.get(k, '(absent)')!r} at training, {b.get(k, '(absent)')!r} serving"
            for k in sorted(set(a) | set(b)) if a.get(k, "(absent)") != b.get(k, "(absent)")]


def check_settings_agree(trained: dict, served: dict) -> None:
    """A ``ConfigError`` naming every field the serving processor decides differently: the
    tokens per image would then differ from the ones the model was trained on."""
    diffs = settings_differences(trained, served)
    if diffs:
        raise ConfigError("the serving processor counts image tokens differently from the one the dataset was "
                          "prepared with: " + "; ".join(diffs) + ". Serve with the training settings, or prepare again")


def known_family(settings: dict, known, refusal: str) -> str:
    """The family pinned in ``settings`` where it is one of ``known``; else a ``ConfigError``:
    ``refusal`` (formatted with the ``family`` and the ``supported`` ones)."""
    family = settings.get("family")
    if family not in known:
        raise ConfigError(refusal.format(family=family, name=FAMILY_NAMES.get(family, family), supported=SUPPORTED))
    return family
