"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL: our grid and token count of every image equal what the
model's own image processor returns (``Qwen2VLImageProcessorPil`` built offline from each
model's published settings), on images of many sizes and orientations read through our header;
video frame sampling and grids equal transformers' own ``sample_frames`` and ``patchify`` (the
video processor's module needs torchvision, so those two methods are run from its source)."""

from __future__ import annotations

import ast
import io
import math
import random
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from sftdata.errors import ConfigError
from sftdata.media import MEDIA_UNSUPPORTED, MediaError, VideoInfo, image_count, image_header, settings_from_dicts, video_count
from sftdata.media.qwen import qwen3_frame_indices, sampled_frames, smart_resize

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")
transformers = pytest.importorskip("transformers")
pil_qwen = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")

from tests.helpers.vision_families import FAMILIES, NOT_KWARGS  # noqa: E402

# the count-deciding fields of each model's preprocessor_config.json as published on the Hub
QWEN2_VL, QWEN2_5_VL, QWEN3_VL = (FAMILIES[name].image for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"))
# a training recipe's bounds (LLaMA-Factory's image_max_pixels 768 * 768, image_min_pixels 32 * 32)
QWEN2_5_VL_BOUNDED = {**QWEN2_5_VL, "min_pixels": 32 * 32, "max_pixels": 768 * 768}
MODELS = {"qwen2_vl": QWEN2_VL, "qwen2_5_vl": QWEN2_5_VL, "qwen3_vl": QWEN3_VL, "qwen2_5_vl_bounded": QWEN2_5_VL_BOUNDED}

rng = random.Random(43)
SIZES = [(1, 1), (28, 28), (27, 29), (480, 1280), (1280, 480), (4000, 200), (200, 4000), (640, 480), (1, 200),
         (56, 56), (3000, 3000)] + [(rng.randint(1, 1200), rng.randint(1, 1200)) for _ in range(36)]



def _processor(published: dict):
    kwargs = {k: v for k, v in published.items() if k not in NOT_KWARGS}
    return pil_qwen.Qwen2VLImageProcessorPil(**kwargs)


def _loaded(data: bytes):
    """The image as transformers' load_image hands it to a processor: EXIF orientation applied, RGB."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_image_grids_and_tokens_equal_the_processors(model, encode_image):
    published = MODELS[model]
    settings = settings_from_dicts(published)
    proc = _processor(published)
    cases = [encode_image(w, h) for w, h in SIZES]
    cases += [encode_image(300, 120, orientation=6), encode_image(300, 120, orientation=8),
              encode_image(97, 1001, fmt="PNG", mode="RGBA"), encode_image(640, 427, mode="L"),
              encode_image(1001, 97, fmt="PNG", mode="LA", orientation=5)]
    for data in cases:
        h = image_header(data)
        got = image_count(settings, h.width, h.height)
        out = proc(_loaded(data))
        grid = tuple(int(x) for x in out["image_grid_thw"][0])
        assert got.grid == grid, (model, h)
        assert got.tokens == out["pixel_values"].shape[0] // settings["merge_size"] ** 2 == grid[1] * grid[2] // 4
        assert got.processed == (grid[1] * settings["patch_size"], grid[2] * settings["patch_size"])
        assert got.tokens == proc.get_number_of_image_patches(h.height, h.width) // 4


def test_the_documented_example():
    settings = settings_from_dicts({**QWEN2_VL, "max_pixels": 1003520})
    c = image_count(settings, 640, 480)
    assert (c.tokens, c.grid, c.processed) == (391, (1, 34, 46), (476, 644))


@pytest.mark.parametrize("width,height", [(1, 201), (4020, 20), (201, 1)])
def test_an_aspect_ratio_over_200_is_refused_as_the_processor_refuses_it(width, height):
    settings = settings_from_dicts(QWEN2_VL)
    with pytest.raises(MediaError, match=rf"^an image of {width}x{height}: the Qwen-VL processor refuses an aspect "
                                         rf"ratio over 200 \(201.0\)$") as e:
        image_count(settings, width, height)
    assert e.value.reason == MEDIA_UNSUPPORTED
    with pytest.raises(ValueError, match="absolute aspect ratio must be smaller than 200"):
        _processor(QWEN2_VL)(Image.new("RGB", (width, height)))


def test_smart_resize_equals_transformers_on_many_sizes():
    r = random.Random(7)
    for _ in range(3000):
        h, w = r.randint(1, 9000), r.randint(1, 9000)
        if max(h, w) / min(h, w) > 200:
            continue
        low, high = r.choice([(3136, 1003520), (65536, 16777216), (1024, 589824), (3136, 12845056)])
        factor = r.choice([28, 32])
        assert smart_resize(h, w, factor, low, high) == pil_qwen.smart_resize(h, w, factor, low, high)


# ------------------------------------------------------------------------------------------ video
def _video_methods():
    """``sample_frames`` and ``patchify`` of transformers' Qwen2VLVideoProcessor, run from its source
    (the module imports torchvision, which is not installed here)."""
    torch = pytest.importorskip("torch")
    path = Path(transformers.__file__).parent / "models" / "qwen2_vl" / "video_processing_qwen2_vl.py"
    text = path.read_text()
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "Qwen2VLVideoProcessor")
    namespace = {"torch": torch, "math": math}
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in ("sample_frames", "patchify"):
            source = "from __future__ import annotations\n" + textwrap.dedent(ast.get_source_segment(text, fn))
            exec(compile(source, str(path), "exec"), namespace)
    return torch, namespace["sample_frames"], namespace["patchify"]


def _video_settings(**over) -> dict:
    published = {**QWEN2_VL, "min_pixels": 128 * 28 * 28, "max_pixels": 28 * 28 * 768, **over}
    return settings_from_dicts(QWEN2_VL, video=published)


@pytest.mark.parametrize("rule", [{"do_sample_frames": True, "fps": 2}, {"do_sample_frames": True, "fps": 0.5},
                                  {"do_sample_frames": True, "num_frames": 16}, {"do_sample_frames": True, "num_frames": 7},
                                  {"do_sample_frames": False},
                                  {"do_sample_frames": True, "fps": 1, "min_frames": 2, "max_frames": 12}])
def test_video_frames_and_grids_equal_the_video_processors(rule):
    torch, sample_frames, patchify = _video_methods()
    settings = _video_settings(**rule)
    video = settings["video"]
    r = random.Random(11)
    refused = short = 0
    for _ in range(40):
        info = VideoInfo(frames=r.randint(8, 400 if video["do_sample_frames"] else 48),
                         fps=r.choice([24.0, 25.0, 29.97, 30.0, 60.0]), width=r.randint(32, 160), height=r.randint(32, 160))
        short += video["num_frames"] == 16 and info.frames < 16
        if video["do_sample_frames"]:
            this = SimpleNamespace(num_frames=None, fps=None, temporal_patch_size=video["temporal_patch_size"],
                                   min_frames=video["min_frames"], max_frames=video["max_frames"])
            metadata = SimpleNamespace(total_num_frames=info.frames, fps=info.fps)
            try:
                want = len(sample_frames(this, metadata, fps=video["fps"], num_frames=video["num_frames"]))
            except ValueError:  # the processor refuses to sample more frames than the video has: so do we
                with pytest.raises(MediaError, match=rf"^a video of {info.frames} frames cannot be sampled to") as e:
                    sampled_frames(video, info)
                assert e.value.reason == MEDIA_UNSUPPORTED
                refused += 1
                continue
        else:
            want = info.frames
        assert sampled_frames(video, info) == want, (rule, info)
        got = video_count(settings, info)
        h, w = got.processed
        _, t, gh, gw = patchify(None, torch.zeros(1, got.frames, 1, h, w), video["patch_size"], video["merge_size"],
                                video["temporal_patch_size"])
        assert got.grid == (t, gh, gw) and got.tokens == t * gh * gw // 4 and got.frames == want
        assert got.processed == smart_resize(info.height, info.width, 28, video["min_pixels"], video["max_pixels"])
    assert refused == short


def test_the_sampled_count_follows_torchs_arange_length():
    """arange(0, total, total / n) can hold n + 1 items where total / n rounds down: the count is
    torch's, not n."""
    torch = pytest.importorskip("torch")
    seen = set()
    for total in range(1, 600):
        for n in range(2, total + 1, 2):
            info = VideoInfo(frames=total, fps=None, width=64, height=64)
            ours = sampled_frames({"temporal_patch_size": 2, "do_sample_frames": True, "num_frames": n}, info)
            assert ours == len(torch.arange(0, total, total / n))
            seen.add(ours - n)
    assert seen == {0, 1}  # both happen


def test_the_pixel_cap_shares_a_whole_video_budget():
    settings = _video_settings(cap_pixels_per_frame=True, max_video_tokens=1000)
    info = VideoInfo(frames=200, fps=None, width=1280, height=720)
    # budget int(1000 * 28 * 28 * 0.9) = 705600 pixels for 200 frames -> 705600 * 2 // 200 = 7056 a frame,
    # floored at int(100352 * 1.05) = 105369; smart_resize(720, 1280) within [100352, 105369] -> (224, 420)
    c = video_count(settings, info)
    assert (c.frames, c.processed, c.grid, c.tokens) == (200, (224, 420), (100, 16, 30), 12000)
    uncapped = video_count(_video_settings(), info)
    # uncapped: within [100352, 602112] -> (560, 1008), grid (100, 40, 72)
    assert (uncapped.processed, uncapped.tokens) == ((560, 1008), 100 * 40 * 72 // 4)


def test_video_errors():
    settings = _video_settings(do_sample_frames=True, fps=2)
    with pytest.raises(MediaError, match=r"^a video without a frame rate, sampled at fps frames a second") as e:
        video_count(settings, VideoInfo(frames=50, fps=None, width=64, height=64))
    assert e.value.reason == MEDIA_UNSUPPORTED
    with pytest.raises(MediaError, match=r"^a video of 1 frames cannot be sampled to 0 frames \(temporal patch 2\)"):
        video_count(settings, VideoInfo(frames=1, fps=30.0, width=64, height=64))
    with pytest.raises(ConfigError, match=r"^the video settings give both num_frames and fps"):
        video_count(_video_settings(do_sample_frames=True, fps=2, num_frames=8),
                    VideoInfo(frames=50, fps=25.0, width=64, height=64))
    with pytest.raises(MediaError, match=r"^a video sampled to 1 frames: the Qwen3-VL processor needs at least 2"):
        video_count(settings_from_dicts(QWEN3_VL, video=QWEN3_VL_VIDEO), VideoInfo(frames=1, fps=25.0, width=64, height=64))


# the published video_preprocessor_config.json of Qwen3-VL
QWEN3_VL_VIDEO = FAMILIES["qwen3_vl"].video


@pytest.mark.parametrize("rule", [{}, {"fps": 1}, {"fps": None, "num_frames": 9}, {"fps": None},
                                  {"size": {"longest_edge": 786432, "shortest_edge": 131072}, "cap_pixels_per_frame": True},
                                  {"do_sample_frames": False}])
def test_qwen3_video_frames_grids_and_timestamps_equal_its_processors(rule):
    """Qwen3-VL's video processor imports without torchvision: its own sample_frames,
    get_num_of_video_patches, its module's smart_resize and the processor's timestamps."""
    video_module = pytest.importorskip("transformers.models.qwen3_vl.video_processing_qwen3_vl")
    processing = pytest.importorskip("transformers.models.qwen3_vl.processing_qwen3_vl")
    published = {**QWEN3_VL_VIDEO, **rule}
    proc = video_module.Qwen3VLVideoProcessor(**{k: v for k, v in published.items() if k not in NOT_KWARGS})
    settings = settings_from_dicts(QWEN3_VL, video=published)
    v = settings["video"]
    r = random.Random(5)
    for _ in range(60):
        fps = r.choice([None, 24.0, 25.0, 29.97, 30.0, 60.0])
        info = VideoInfo(frames=r.randint(2, 900), fps=fps, width=r.randint(8, 1920), height=r.randint(8, 1080))
        if v["do_sample_frames"]:
            metadata = SimpleNamespace(total_num_frames=info.frames, fps=info.fps)
            indices = [int(i) for i in proc.sample_frames(metadata, num_frames=v["num_frames"], fps=v["fps"])]
        else:
            indices = list(range(info.frames))
        assert qwen3_frame_indices(v, info) == indices
        got = video_count(settings, info)
        n = len(indices)
        kwargs = {"cap_pixels_per_frame": v["cap_pixels_per_frame"]}
        assert got.tokens == proc.get_num_of_video_patches(n, info.height, info.width, kwargs) // 4, info
        factor = 32
        high = v["max_pixels"]
        if v["cap_pixels_per_frame"]:
            high = max(min(v["max_video_tokens"] * factor * factor, high // n), int(v["min_pixels"] * 1.05)) * n
        assert got.processed == video_module.smart_resize(n, info.height, info.width, 2, factor, v["min_pixels"], high)
        want = processing.Qwen3VLProcessor._calculate_timestamps(None, list(indices), info.fps or 24, 2)
        assert list(got.timestamps) == want and got.grid[0] == len(want) and got.frames == n
