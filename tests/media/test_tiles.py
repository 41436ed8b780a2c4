"""Gemma 3, LLaVA-1.5, LLaVA-NeXT, Idefics3 and SmolVLM: our token count of every image equals
the count the model's own processor expands ``<image>`` to. Each image processor is built
offline from the model's published settings (the PIL classes: torchvision is not needed) and
run on generated images; its output goes through the processor class's own
``replace_image_token`` (called on a stand-in holding the processor's settings, as no tokenizer
is needed to count), and we count the image tokens in the text it returns."""

from __future__ import annotations

import io
import random
from types import SimpleNamespace

import pytest

from sftdata.media import image_count, image_header, settings_from_dicts

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")
pytest.importorskip("transformers")
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil  # noqa: E402
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil  # noqa: E402
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor  # noqa: E402
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil  # noqa: E402
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor  # noqa: E402
from transformers.models.llava.processing_llava import LlavaProcessor  # noqa: E402
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil  # noqa: E402
from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor  # noqa: E402
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil  # noqa: E402
from transformers.models.smolvlm.processing_smolvlm import SmolVLMProcessor  # noqa: E402

from tests.helpers.vision_families import FAMILIES, NOT_KWARGS  # noqa: E402

rng = random.Random(3)
SIZES = [(1, 1), (28, 28), (336, 336), (480, 1280), (1280, 480), (4000, 200), (200, 4000), (640, 480), (1, 300),
         (364, 365), (1456, 1456), (2000, 3000)] + [(rng.randint(1, 2000), rng.randint(1, 2000)) for _ in range(16)]


def _images(encode_image):
    """(header size, the image as load_image hands it to a processor) of every case."""
    cases = [encode_image(w, h) for w, h in SIZES]
    cases += [encode_image(640, 200, orientation=6), encode_image(640, 200, orientation=8),
              encode_image(97, 1001, fmt="PNG", mode="RGBA"), encode_image(1001, 333, mode="L")]
    for data in cases:
        h = image_header(data)
        with Image.open(io.BytesIO(data)) as im:
            yield h, ImageOps.exif_transpose(im).convert("RGB")


def _build(cls, published: dict):
    return cls(**{k: v for k, v in published.items() if k not in NOT_KWARGS})


def _count(text: str, token: str) -> int:
    return text.count(token)


# ------------------------------------------------------------------------------------ Gemma 3
GEMMA3, GEMMA3_PROCESSOR = FAMILIES["gemma3"].image, FAMILIES["gemma3"].processor


def test_gemma3_counts_equal_the_processors(encode_image):
    settings = settings_from_dicts(GEMMA3, GEMMA3_PROCESSOR)
    proc = _build(Gemma3ImageProcessorPil, GEMMA3)
    this = SimpleNamespace(full_image_sequence="\n\n<boi>" + "<img>" * 256 + "<eoi>\n\n")
    for h, im in _images(encode_image):
        out = proc(im, return_tensors="np")
        text = Gemma3Processor.replace_image_token(this, out, 0)
        got = image_count(settings, h.width, h.height)
        assert got.tokens == _count(text, "<img>") == 256
        assert got.processed == tuple(out["pixel_values"].shape[-2:]) == (896, 896)


# ------------------------------------------------------------------------------------ LLaVA-1.5
LLAVA, LLAVA_PROCESSOR = FAMILIES["llava"].image, FAMILIES["llava"].processor


@pytest.mark.parametrize("strategy,extra,want", [("default", 1, 576), ("full", 1, 577), ("default", 0, 575)])
def test_llava_counts_equal_the_processors(encode_image, strategy, extra, want):
    processor = {**LLAVA_PROCESSOR, "vision_feature_select_strategy": strategy, "num_additional_image_tokens": extra}
    settings = settings_from_dicts(LLAVA, processor)
    proc = _build(CLIPImageProcessorPil, LLAVA)
    this = SimpleNamespace(patch_size=14, num_additional_image_tokens=extra, vision_feature_select_strategy=strategy,
                           image_token="<image>")
    for h, im in list(_images(encode_image))[:8]:
        out = proc(im, return_tensors="np")
        got = image_count(settings, h.width, h.height)
        assert got.tokens == _count(LlavaProcessor.replace_image_token(this, out, 0), "<image>") == want
        assert got.processed == tuple(out["pixel_values"].shape[-2:])


# ------------------------------------------------------------------------------------ LLaVA-NeXT
LLAVA_NEXT, LLAVA_NEXT_PROCESSOR = FAMILIES["llava_next"].image, FAMILIES["llava_next"].processor
GRID_3X3 = [[336 * a, 336 * b] for a in (1, 2, 3) for b in (1, 2, 3)]


@pytest.mark.parametrize("pinpoints", ["published", "3x3"])
def test_llava_next_counts_equal_the_processors(encode_image, pinpoints):
    published = LLAVA_NEXT if pinpoints == "published" else {**LLAVA_NEXT, "image_grid_pinpoints": GRID_3X3}
    settings = settings_from_dicts(published, LLAVA_NEXT_PROCESSOR)
    proc = _build(LlavaNextImageProcessorPil, published)
    this = SimpleNamespace(image_processor=proc, patch_size=14, num_additional_image_tokens=1,
                           vision_feature_select_strategy="default", image_token="<image>")
    this._get_unpadded_features = lambda *a: LlavaNextProcessor._get_unpadded_features(this, *a)
    this._get_number_of_features = lambda *a: LlavaNextProcessor._get_number_of_features(this, *a)
    for h, im in _images(encode_image):
        out = proc(im, return_tensors="np")
        assert [int(x) for x in out["image_sizes"][0]] == [h.height, h.width]
        got = image_count(settings, h.width, h.height)
        assert got.tokens == _count(LlavaNextProcessor.replace_image_token(this, out, 0), "<image>"), h
        rows, cols = got.grid
        assert out["pixel_values"].shape[1] == rows * cols + 1 and got.processed == (336, 336)


# ------------------------------------------------------------------------------------ Idefics3 / SmolVLM
IDEFICS3 = FAMILIES["idefics3"].image
SMOLVLM_INSTRUCT = {**IDEFICS3, "max_image_size": {"longest_edge": 384}, "size": {"longest_edge": 1536}}
SMOLVLM2 = FAMILIES["smolvlm"].image
TILED = {"idefics3": (IDEFICS3, 169, Idefics3ImageProcessorPil, Idefics3Processor),
         "smolvlm_instruct": (SMOLVLM_INSTRUCT, 81, Idefics3ImageProcessorPil, Idefics3Processor),
         "smolvlm2": (SMOLVLM2, 64, SmolVLMImageProcessorPil, SmolVLMProcessor),
         "idefics3_unsplit": ({**IDEFICS3, "do_image_splitting": False}, 169, Idefics3ImageProcessorPil, Idefics3Processor)}


@pytest.mark.parametrize("model", sorted(TILED))
def test_tiled_counts_equal_the_processors(encode_image, model):
    published, seq, image_cls, processor_cls = TILED[model]
    settings = settings_from_dicts(published, {"image_seq_len": seq, "processor_class": published["processor_class"]})
    proc = _build(image_cls, published)
    this = SimpleNamespace(image_seq_len=seq, fake_image_token="<fake_token_around_image>", image_token="<image>",
                           global_image_tag="<global-img>", global_image_token="<global-img>")
    tile = published["max_image_size"]["longest_edge"]
    for h, im in _images(encode_image):
        out = proc(im, return_row_col_info=True)
        got = image_count(settings, h.width, h.height)
        assert got.grid == (out["rows"][0][0], out["cols"][0][0]), (model, h)
        assert got.tokens == _count(processor_cls.replace_image_token(this, out, 0), "<image>")
        rows, cols = got.grid
        assert out["pixel_values"].shape[1] == rows * cols + 1 and got.processed == (tile, tile)
