"""A model folder's processor settings: the family named, others refused by name, the defaults
those of the processor class that reads the file, pinned as JSON, and training vs serving
compared field by field."""

from __future__ import annotations

import orjson
import pytest

from sftdata.errors import ConfigError
from sftdata.media import (
    VideoInfo,
    check_settings_agree,
    image_count,
    read_processor_settings,
    settings_differences,
    settings_from_dicts,
    video_count,
)

pytest.importorskip("transformers")
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil  # noqa: E402
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402

from tests.helpers.vision_families import FAMILIES  # noqa: E402

QWEN2_VL = FAMILIES["qwen2_vl"].image
SUPPORTED = "Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, LLaVA-1.5, LLaVA-NeXT, Idefics3, SmolVLM"


@pytest.mark.parametrize("image,processor,config,family", [
    ({"processor_class": "Qwen2VLProcessor"}, {}, {}, "qwen2_vl"),
    ({"processor_class": "Qwen2_5_VLProcessor"}, {}, {}, "qwen2_5_vl"),
    ({"image_processor_type": "Qwen2VLImageProcessorFast"}, {"processor_class": "Qwen3VLProcessor"}, {}, "qwen3_vl"),
    ({"image_processor_type": "Qwen2VLImageProcessor"}, {}, {"model_type": "qwen2_5_vl"}, "qwen2_5_vl"),
    ({"image_processor_type": "Qwen2VLImageProcessor"}, {}, {}, "qwen2_vl"),
    ({"image_processor_type": "Gemma3ImageProcessorFast"}, {}, {}, "gemma3"),
    ({"image_processor_type": "CLIPImageProcessor"}, {"patch_size": 14}, {"model_type": "llava"}, "llava"),
    ({"image_processor_type": "LlavaNextImageProcessor"}, {"patch_size": 14}, {}, "llava_next"),
    ({"image_processor_type": "Idefics3ImageProcessor", "processor_class": "Idefics3Processor"}, {}, {}, "idefics3"),
    ({"image_processor_type": "SmolVLMImageProcessorPil"}, {}, {}, "smolvlm"),
])
def test_the_family_is_named_by_the_processor_class_or_the_image_processor(image, processor, config, family):
    assert settings_from_dicts(image, processor, config)["family"] == family


@pytest.mark.parametrize("image,processor,config,named", [
    ({"image_processor_type": "SiglipImageProcessor", "processor_class": "PaliGemmaProcessor"}, {}, {}, "PaliGemmaProcessor"),
    ({"image_processor_type": "CLIPImageProcessor"}, {}, {"model_type": "clip"}, "CLIPImageProcessor"),
    ({"image_processor_type": "MllamaImageProcessor"}, {}, {}, "MllamaImageProcessor"),
    ({}, {}, {"model_type": "pixtral"}, "pixtral"),
    ({}, {}, {}, "unnamed"),
])
def test_other_families_are_refused_by_name(image, processor, config, named):
    with pytest.raises(ConfigError, match=rf"^the model's processor is {named}: sftdata counts image tokens for "
                                          rf"{SUPPORTED} only$"):
        settings_from_dicts(image, processor, config)


def test_defaults_are_the_processor_classes():
    q = settings_from_dicts({"image_processor_type": "Qwen2VLImageProcessor"})
    cls = Qwen2VLImageProcessorPil()
    assert (q["min_pixels"], q["max_pixels"]) == (cls.size["shortest_edge"], cls.size["longest_edge"])
    assert (q["patch_size"], q["merge_size"], q["temporal_patch_size"]) == (cls.patch_size, cls.merge_size,
                                                                          cls.temporal_patch_size)
    i = settings_from_dicts({"image_processor_type": "Idefics3ImageProcessor"})
    cls = Idefics3ImageProcessorPil()
    assert (i["size"], i["max_image_size"], i["do_resize"], i["do_image_splitting"], i["image_seq_len"]) == (
        dict(cls.size), dict(cls.max_image_size), cls.do_resize, cls.do_image_splitting, 169)
    n = settings_from_dicts({"image_processor_type": "LlavaNextImageProcessor"}, {"patch_size": 14})
    assert n["image_grid_pinpoints"] == LlavaNextImageProcessorPil().image_grid_pinpoints
    assert n["crop_size"] == dict(LlavaNextImageProcessorPil().crop_size)


@pytest.mark.parametrize("published", [
    {"min_pixels": 1000, "max_pixels": 90000},
    {"size": {"shortest_edge": 1000, "longest_edge": 90000}},
    {"size": {"shortest_edge": 5, "longest_edge": 6}, "min_pixels": 1000, "max_pixels": 90000},
])
def test_qwen_pixel_bounds_as_the_processor_reads_them(published):
    s = settings_from_dicts({**published, "image_processor_type": "Qwen2VLImageProcessor"})
    proc = Qwen2VLImageProcessorPil(**published)
    assert (s["min_pixels"], s["max_pixels"]) == (proc.size["shortest_edge"], proc.size["longest_edge"]) == (1000, 90000)


def test_settings_a_processor_cannot_count_are_refused():
    with pytest.raises(ConfigError, match=r"^the Gemma 3 processor has do_pan_and_scan on: its crops depend on each "
                                          r"image, which sftdata does not count; turn it off \(the default\)$"):
        settings_from_dicts({"image_processor_type": "Gemma3ImageProcessor", "do_pan_and_scan": True})
    with pytest.raises(ConfigError, match=r"^the LLaVA-1.5 processor settings have no patch_size \(processor_config.json\)"):
        settings_from_dicts({"processor_class": "LlavaProcessor"})
    with pytest.raises(ConfigError, match=r"^the LLaVA-NeXT image processor has do_center_crop false"):
        settings_from_dicts({"processor_class": "LlavaNextProcessor", "do_center_crop": False}, {"patch_size": 14})


def _write(folder, **files):
    folder.mkdir(exist_ok=True)
    for name, content in files.items():
        (folder / f"{name}.json").write_bytes(content if isinstance(content, bytes) else orjson.dumps(content))
    return folder


def test_a_model_folder_is_read(tmp_path):
    folder = _write(tmp_path / "m", preprocessor_config=QWEN2_VL, config={"model_type": "qwen2_vl"},
                    video_preprocessor_config={"size": {"shortest_edge": 4096, "longest_edge": 65536}, "fps": 2,
                                               "do_sample_frames": True})
    s = read_processor_settings(folder)
    assert s == {"family": "qwen2_vl", "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2,
                 "temporal_patch_size": 2,
                 "video": {"min_pixels": 4096, "max_pixels": 65536, "patch_size": 14, "temporal_patch_size": 2,
                           "merge_size": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": True, "fps": 2,
                           "num_frames": None, "cap_pixels_per_frame": False, "max_video_tokens": 128000}}
    assert orjson.loads(orjson.dumps(s)) == s  # pinned as JSON in tokenizer_state.json, read back the same
    c = video_count(s, VideoInfo(frames=100, fps=25.0, width=320, height=240))
    # 100 frames at 25 fps sampled at 2 a second: 8 frames, t = 4; 240x320 within 65536 pixels: 196x280, 14x20 patches
    assert (c.frames, c.grid, c.processed, c.tokens) == (8, (4, 14, 20), (196, 280), 4 * 14 * 20 // 4)


def test_a_folder_whose_processor_config_nests_the_image_processor(tmp_path):
    folder = _write(tmp_path / "m", processor_config={"processor_class": "Idefics3Processor", "image_seq_len": 81,
                                                       "image_processor": {"max_image_size": {"longest_edge": 384},
                                                                           "size": {"longest_edge": 1536}}})
    s = read_processor_settings(folder)
    assert s == {"family": "idefics3", "do_resize": True, "size": {"longest_edge": 1536},
                 "max_image_size": {"longest_edge": 384}, "do_image_splitting": True, "image_seq_len": 81}
    # 800x600 -> longest edge 1536: 1536x1152 -> tiles of 384: 3 rows x 4 columns, plus the global image
    c = image_count(s, 800, 600)
    assert (c.grid, c.tokens) == ((3, 4), 81 * (3 * 4 + 1))


def test_settings_nested_in_processor_config_win_as_transformers_loads_them(tmp_path):
    nested = {**QWEN2_VL, "max_pixels": 1003520}
    video = {"size": {"shortest_edge": 4096, "longest_edge": 65536}}
    folder = _write(tmp_path / "m", preprocessor_config=QWEN2_VL, video_preprocessor_config={"fps": 9},
                    processor_config={"processor_class": "Qwen2VLProcessor", "image_processor": nested,
                                      "video_processor": video})
    s = read_processor_settings(folder)
    assert (s["max_pixels"], s["video"]["max_pixels"], s["video"]["fps"]) == (1003520, 65536, None)
    alone = read_processor_settings(_write(tmp_path / "n", preprocessor_config=QWEN2_VL,
                                           video_preprocessor_config={"fps": 9}))
    assert (alone["max_pixels"], alone["video"]["max_pixels"], alone["video"]["fps"]) == (12845056, 602112, 9)


def test_folder_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"^.*/empty has no preprocessor_config.json \(nor an image_processor in "
                                          r"processor_config.json\)"):
        read_processor_settings(_write(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"^.*/bad/preprocessor_config.json cannot be read as JSON"):
        read_processor_settings(_write(tmp_path / "bad", preprocessor_config=b"{nope"))
    with pytest.raises(ConfigError, match=r"^.*/list/preprocessor_config.json holds list, not a JSON object$"):
        read_processor_settings(_write(tmp_path / "list", preprocessor_config=[1]))


def test_training_and_serving_settings_are_compared_field_by_field():
    trained = settings_from_dicts(QWEN2_VL)
    check_settings_agree(trained, orjson.loads(orjson.dumps(trained)))
    served = settings_from_dicts({**QWEN2_VL, "max_pixels": 1003520}, video={"fps": 1.0, "do_sample_frames": True})
    assert settings_differences(trained, served) == [
        "max_pixels: 12845056 at training, 1003520 serving",
        "video.do_sample_frames: False at training, True serving",
        "video.fps: None at training, 1.0 serving",
        "video.max_pixels: 12845056 at training, 602112 serving",
        "video.min_pixels: 3136 at training, 100352 serving",
    ]
    with pytest.raises(ConfigError, match=r"^the serving processor counts image tokens differently from the one the "
                                          r"dataset was prepared with: max_pixels: 12845056 at training, 1003520 serving; "
                                          r"video.do_sample_frames: .* Serve with the training settings, or prepare again$"):
        check_settings_agree(trained, served)
    other = settings_from_dicts({"processor_class": "Gemma3Processor"})
    assert settings_differences(trained, other)[0] == "family: 'qwen2_vl' at training, 'gemma3' serving"


def test_counting_under_settings_of_no_known_family():
    with pytest.raises(ConfigError, match=r"^pinned processor settings of family 'pixtral': sftdata counts image tokens "
                                          rf"for {SUPPORTED} only$"):
        image_count({"family": "pixtral"}, 10, 10)
    with pytest.raises(ConfigError, match=r"^Gemma 3 takes no video in sftdata: video is counted for the Qwen family only$"):
        video_count(settings_from_dicts({"processor_class": "Gemma3Processor"}), VideoInfo(8, 1.0, 10, 10))
