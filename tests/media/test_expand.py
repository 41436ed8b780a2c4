"""The placeholder expansion of every family, proven against the model's own processor: for
each family a model folder is built offline (tests/helpers/vision_families.py: a tokenizer
with the family's tokens, TRL's template, the published processor settings), transformers'
processor loads it, and on conversations holding images of many sizes, orientations and
modes our ids (the template's render, ``expand_text`` with our counts, tokenized) equal
``processor.apply_chat_template(messages, tokenize=True)``; our expanded text equals the
text the processor tokenizes (its replacements, ``return_text_replacement_offsets``); and
each item's first token sits where the documented rule finds it. Video: Qwen3-VL's
timestamped patches and Qwen2-VL's repetition, the processor's own text replacement run on
the grids our count gives (proven equal to the video processors' in test_qwen.py)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from sftdata.errors import ConfigError
from sftdata.media import (
    MediaCount,
    VideoInfo,
    image_count,
    image_header,
    read_processor_settings,
    settings_from_dicts,
    video_count,
)
from sftdata.media.expand import expand_text, expansion, item_token, media_tokens, placeholders
from sftdata.media.settings import tokenizer_tokens

np = pytest.importorskip("numpy")
pytest.importorskip("PIL.Image")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from transformers.image_utils import load_image  # noqa: E402
from transformers.video_utils import VideoMetadata  # noqa: E402

from tests.helpers.vision_families import FAMILIES, NOT_KWARGS, family_folder, reference_processor  # noqa: E402

rng = random.Random(43)
SIZES = [(1, 1), (28, 28), (336, 336), (480, 1280), (1280, 480), (4000, 200), (200, 4000), (640, 480), (1, 30),
         (364, 365), (1456, 1456), (2000, 3000)] + [(rng.randint(1, 1600), rng.randint(1, 1600)) for _ in range(8)]
TEXTS = ["Describe the picture.", "What is in this image?", "Compare them."]
REPLIES = ["A cat on a mat.", "Two dogs and a boat."]


def _files(encode_image, folder):
    """Image files of every case: plain JPEGs of SIZES, EXIF-rotated ones, PNG with alpha, grayscale."""
    cases = [(encode_image(w, h), "jpg") for w, h in SIZES]
    cases += [(encode_image(640, 200, orientation=6), "jpg"), (encode_image(640, 200, orientation=8), "jpg"),
              (encode_image(97, 1001, fmt="PNG", mode="RGBA"), "png"), (encode_image(1001, 333, mode="L"), "jpg")]
    folder.mkdir()
    paths = []
    for i, (data, ext) in enumerate(cases):
        path = folder / f"{i}.{ext}"
        path.write_bytes(data)
        paths.append(path)
    return paths


def _conversations(paths):
    """Conversations of one to three images each, placed before, between and after the text,
    in the first and a later user turn."""
    r = random.Random(7)
    out, rest = [], list(paths)
    while rest:
        n = min(len(rest), r.randint(1, 3))
        take, rest = rest[:n], rest[n:]
        first = [{"type": "image", "image": str(take[0])}, {"type": "text", "text": r.choice(TEXTS)}]
        if len(take) > 1:
            first.append({"type": "image", "image": str(take[1])})
        messages = [{"role": "user", "content": first},
                    {"role": "assistant", "content": [{"type": "text", "text": r.choice(REPLIES)}]}]
        if len(take) > 2:
            messages += [{"role": "user", "content": [{"type": "text", "text": r.choice(TEXTS)},
                                                       {"type": "image", "image": str(take[2])}]},
                         {"role": "assistant", "content": [{"type": "text", "text": r.choice(REPLIES)}]}]
        out.append((messages, take))
    return out


def _replaced(text: str, offsets: list[dict]) -> str:
    """The text the processor tokenized: ``text`` with each of its replacements made."""
    out, pos = [], 0
    for o in offsets:
        start, end = o["span"]
        out += [text[pos:start], o["replacement"]]
        pos = end
    return "".join(out + [text[pos:]])


def _ids(processor, text: str) -> list[int]:
    return processor.tokenizer(text, add_special_tokens=False)["input_ids"]


def _first_tokens(ids, token_id: int, counts) -> list[int]:
    """Each item's first token by the rule expand.py documents: the j-th occurrence of its
    token, j the tokens the earlier items hold."""
    at = np.flatnonzero(np.asarray(ids) == token_id)
    assert at.size == sum(counts)  # no stray copy of the token outside the expansions
    return [int(at[sum(counts[:k])]) for k in range(len(counts))]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_ids_equal_the_processors_apply_chat_template(tmp_path, encode_image, name):
    folder = family_folder(tmp_path / "model", name)
    processor = reference_processor(folder, name)
    settings = read_processor_settings(folder)
    assert "tokens" not in settings  # the published token names are the processor's defaults
    token = item_token(settings, "image")
    token_id = processor.tokenizer.convert_tokens_to_ids(token)
    for messages, paths in _conversations(_files(encode_image, tmp_path / "images")):
        counts = []
        for p in paths:
            h = image_header(p.read_bytes(), str(p))
            counts.append(image_count(settings, h.width, h.height))
        render = processor.apply_chat_template(messages, tokenize=False)
        ours_text = expand_text(settings, render, [("image", c) for c in counts])
        ours = _ids(processor, ours_text)
        out = processor.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            processor_kwargs={"return_text_replacement_offsets": True})
        assert ours == list(out["input_ids"][0]), (name, [p.name for p in paths])
        offsets = out["text_replacement_offsets"][0]
        assert ours_text == _replaced(render, offsets)
        # where each item's first token sits: found in the processor's own replacement
        enc = processor.tokenizer(ours_text, add_special_tokens=False)
        starts = [o["new_span"][0] + o["replacement"].index(token) for o in offsets]
        assert _first_tokens(ours, token_id, [c.tokens for c in counts]) == [enc.char_to_token(s) for s in starts]


def test_gemma3_text_around_the_image_is_part_of_the_expansion(tmp_path, encode_image):
    """Gemma 3's expansion opens and closes with ``\\n\\n``, which the tokenizer may merge with
    the text beside it: the render must be expanded before it is tokenized, never tokenized
    first with the placeholder's ids replaced afterwards."""
    folder = family_folder(tmp_path / "model", "gemma3")
    processor = reference_processor(folder, "gemma3")
    settings = read_processor_settings(folder)
    path = tmp_path / "a.jpg"
    path.write_bytes(encode_image(64, 48))
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hello."}, {"type": "image", "image": str(path)},
                                             {"type": "text", "text": "Bye."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]}]
    render = processor.apply_chat_template(messages, tokenize=False)
    assert "Hello.<start_of_image>Bye." in render
    count = image_count(settings, 64, 48)
    expanded = expand_text(settings, render, [("image", count)])
    assert "Hello.\n\n<start_of_image>" + "<image_soft_token>" * 256 + "<end_of_image>\n\nBye." in expanded
    theirs = list(processor.apply_chat_template(messages, tokenize=True)[0])
    assert _ids(processor, expanded) == theirs
    before, after = render.split("<start_of_image>")
    spliced = _ids(processor, before) + _ids(processor, expansion(settings, "image", count)) + _ids(processor, after)
    assert spliced != theirs
    assert _ids(processor, "\n\nBye.") != _ids(processor, "\n\n") + _ids(processor, "Bye.")  # why


# ------------------------------------------------------------------------------------------ video
def _video_processor_frames(published: dict, info: VideoInfo) -> list[int]:
    """The frames Qwen3-VL's own video processor samples (its module needs no torchvision)."""
    module = pytest.importorskip("transformers.models.qwen3_vl.video_processing_qwen3_vl")
    proc = module.Qwen3VLVideoProcessor(**{k: v for k, v in published.items() if k not in NOT_KWARGS})
    meta = VideoMetadata(total_num_frames=info.frames, fps=info.fps)
    return [int(i) for i in proc.sample_frames(meta, num_frames=proc.num_frames, fps=proc.fps)]


@pytest.mark.parametrize("name", ["qwen3_vl", "qwen2_vl", "qwen2_5_vl"])
def test_qwen_video_ids_equal_the_processors(tmp_path, encode_image, name):
    folder = family_folder(tmp_path / "model", name)
    processor = reference_processor(folder, name)
    settings = read_processor_settings(folder)
    picture = tmp_path / "a.jpg"
    picture.write_bytes(encode_image(300, 200))
    h = image_header(picture.read_bytes())
    r = random.Random(17)
    for _ in range(12):
        # Qwen2-VL's published video settings keep every frame: its videos are kept short
        info = VideoInfo(frames=r.randint(2, 600 if name == "qwen3_vl" else 96),
                         fps=r.choice([None, 24.0, 25.0, 29.97, 30.0, 60.0]), width=r.randint(16, 1280), height=r.randint(16, 720))
        if name != "qwen3_vl" and info.fps is None:
            info = replace(info, fps=25.0)
        count = video_count(settings, info)
        indices = _video_processor_frames(FAMILIES[name].video, info) if name == "qwen3_vl" else None
        meta = VideoMetadata(total_num_frames=info.frames, fps=info.fps, frames_indices=indices)
        processor.video_processor.plan = [(count.grid, meta)]
        video_first = r.random() < 0.5
        parts = [{"type": "video", "video": "clip.mp4"}, {"type": "image", "image": str(picture)}]
        messages = [{"role": "user", "content": (parts if video_first else parts[::-1]) + [
                        {"type": "text", "text": "What happens?"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "A cat jumps."}]}]
        render = processor.apply_chat_template(messages, tokenize=False)
        items = [("video", count), ("image", image_count(settings, h.width, h.height))]
        ours_text = expand_text(settings, render, items if video_first else items[::-1])
        out = processor(text=render, images=[load_image(str(picture))], videos=[np.zeros((info.frames, 2, 2, 3), np.uint8)],
                        return_text_replacement_offsets=True)
        assert ours_text == _replaced(render, out["text_replacement_offsets"][0]), info
        ids = _ids(processor, ours_text)
        assert ids == list(out["input_ids"][0])
        video_id = processor.tokenizer.convert_tokens_to_ids(item_token(settings, "video"))
        assert int((np.asarray(ids) == video_id).sum()) == count.tokens


def test_the_documented_expansions():
    qwen3 = settings_from_dicts({"processor_class": "Qwen3VLProcessor"})
    video = MediaCount(tokens=8, processed=(64, 64), grid=(2, 4, 4), frames=4, timestamps=(0.25, 1.75))
    patch = "<|vision_start|>" + "<|video_pad|>" * 4 + "<|vision_end|>"
    assert expansion(qwen3, "video", video) == f"<0.2 seconds>{patch}<1.8 seconds>{patch}"
    assert expansion(qwen3, "image", MediaCount(3, (28, 28))) == "<|image_pad|>" * 3
    # the template's marks around a video are dropped with its placeholder, those around an image kept
    image = MediaCount(2, (32, 32), (1, 2, 4))
    wrapped = "a<|vision_start|><|video_pad|><|vision_end|>b<|vision_start|><|image_pad|><|vision_end|>"
    assert expand_text(qwen3, wrapped, [("video", video), ("image", image)]) == (
        f"a<0.2 seconds>{patch}<1.8 seconds>{patch}b<|vision_start|><|image_pad|><|image_pad|><|vision_end|>")
    assert expand_text(qwen3, "a<|video_pad|>b", [("video", video)]) == f"a<0.2 seconds>{patch}<1.8 seconds>{patch}b"
    qwen2 = settings_from_dicts({"processor_class": "Qwen2VLProcessor"})
    assert expansion(qwen2, "video", video) == "<|video_pad|>" * 8
    gemma = settings_from_dicts({"processor_class": "Gemma3Processor"}, {"image_seq_length": 2})
    assert expansion(gemma, "image", image_count(gemma, 5, 5)) == (
        "\n\n<start_of_image><image_soft_token><image_soft_token><end_of_image>\n\n")
    llava = settings_from_dicts({"processor_class": "LlavaProcessor"}, {"patch_size": 14})
    assert expansion(llava, "image", MediaCount(3, (336, 336))) == "<image><image><image>"
    tiles = settings_from_dicts({"processor_class": "Idefics3Processor"}, {"image_seq_len": 2})
    f, i = "<fake_token_around_image>", "<image>" * 2
    assert expansion(tiles, "image", MediaCount(2, (364, 364), (0, 0))) == f"{f}<global-img>{i}{f}"
    assert expansion(tiles, "image", MediaCount(10, (364, 364), (2, 2))) == (
        f"{f}<row_1_col_1>{i}{f}<row_1_col_2>{i}\n{f}<row_2_col_1>{i}{f}<row_2_col_2>{i}\n\n{f}<global-img>{i}{f}")


FAMILY_TOKENS = {  # family: (placeholders, media tokens)
    "qwen2_vl": ({"image": "<|image_pad|>", "video": "<|video_pad|>"}, ("<|image_pad|>", "<|video_pad|>")),
    "qwen3_vl": ({"image": "<|image_pad|>", "video": "<|video_pad|>"}, ("<|image_pad|>", "<|video_pad|>")),
    "gemma3": ({"image": "<start_of_image>"}, ("<image_soft_token>",)),
    "llava": ({"image": "<image>"}, ("<image>",)),
    "llava_next": ({"image": "<image>"}, ("<image>",)),
    "idefics3": ({"image": "<image>"}, ("<image>",)),
    "smolvlm": ({"image": "<image>"}, ("<image>",)),
}


@pytest.mark.parametrize("name", sorted(FAMILY_TOKENS))
def test_placeholders_and_media_tokens(name):
    family = FAMILIES[name]
    settings = settings_from_dicts(family.image, family.processor, family.config)
    assert (placeholders(settings), media_tokens(settings)) == FAMILY_TOKENS[name]


# ------------------------------------------------------------------------------ tokens a tokenizer renames
RENAMED = {  # family: (folder overrides, the pinned tokens, the template's text changed from, to)
    "llava": ({"processor": {"image_token": "<img>"}, "specials": ("<img>",)}, {"image_token": "<img>"},
              ("<image>", "<img>")),
    "gemma3": ({"tokenizer_config": {"extra_special_tokens": {"image_token": "<soft>"}}, "specials": ("<soft>",)},
               {"image_token": "<soft>"}, None),
    "smolvlm": ({"tokenizer_config": {"global_image_token": "<glb>",
                                      "fake_image_token": {"__type": "AddedToken", "content": "<fk>"}},
                 "specials": ("<glb>", "<fk>")}, {"global_image_token": "<glb>", "fake_image_token": "<fk>"}, None),
}


@pytest.mark.parametrize("name", sorted(RENAMED))
def test_tokens_a_tokenizer_or_processor_renames_are_pinned_and_written(tmp_path, encode_image, name):
    overrides, pinned, change = RENAMED[name]
    template = None
    if change is not None:
        template = (family_folder(tmp_path / "plain", name) / "chat_template.jinja").read_text().replace(*change)
    folder = family_folder(tmp_path / "model", name, template=template, **overrides)
    processor = reference_processor(folder, name)
    settings = read_processor_settings(folder)
    assert settings["tokens"] == pinned
    paths = _files(encode_image, tmp_path / "images")[8:12]
    messages = [{"role": "user", "content": [{"type": "image", "image": str(p)} for p in paths] + [
                    {"type": "text", "text": "Compare them."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A cat on a mat."}]}]
    counts = [image_count(settings, h.width, h.height) for h in (image_header(p.read_bytes()) for p in paths)]
    render = processor.apply_chat_template(messages, tokenize=False)
    ours = expand_text(settings, render, [("image", c) for c in counts])
    assert all(token in ours for token in pinned.values())
    assert _ids(processor, ours) == list(processor.apply_chat_template(messages, tokenize=True)[0])


def test_the_token_names_a_tokenizer_config_gives():
    config = {"bos_token": "<s>", "image_token": {"__type": "AddedToken", "content": "<a>", "special": True},
              "video_token": None, "eoi_token": {"content": "<d>"}, "chat_template": "x",
              "extra_special_tokens": {"image_token": "<b>", "boi_token": "<c>"}}
    assert tokenizer_tokens(config) == {"bos_token": "<s>", "image_token": "<b>", "boi_token": "<c>"}
    assert tokenizer_tokens({"image_token": {"__type": "AddedToken", "content": "<a>"}}) == {"image_token": "<a>"}
    assert tokenizer_tokens({"extra_special_tokens": ["<x>"], "image_token": "<a>"}) == {"image_token": "<a>"}


def test_idefics3_writes_its_own_tokens_whatever_the_tokenizer_names():
    """Idefics3's processor fixes its token strings in code; SmolVLM's reads the tokenizer's."""
    tokenizer = {"image_token": "<x>", "global_image_token": "<g>"}
    image = FAMILIES["idefics3"].image
    assert "tokens" not in settings_from_dicts(image, FAMILIES["idefics3"].processor, tokenizer=tokenizer)
    smol = settings_from_dicts(FAMILIES["smolvlm"].image, FAMILIES["smolvlm"].processor, tokenizer=tokenizer)
    assert smol["tokens"] == {"image_token": "<x>", "global_image_token": "<g>"}
    assert placeholders(smol) == {"image": "<x>"} and media_tokens(smol) == ("<x>",)
    # the tokenizer's name wins over LLaVA's processor setting, as in LlavaProcessor.__init__
    llava = settings_from_dicts(FAMILIES["llava"].image, {**FAMILIES["llava"].processor, "image_token": "<p>"},
                                FAMILIES["llava"].config, tokenizer={"image_token": "<t>"})
    assert llava["tokens"] == {"image_token": "<t>"}


# ------------------------------------------------------------------------------------------ errors
def test_expand_text_errors():
    gemma = settings_from_dicts({"processor_class": "Gemma3Processor"}, {"image_seq_length": 2})
    one = ("image", image_count(gemma, 5, 5))
    with pytest.raises(ValueError, match=r"^the render holds 1 media placeholder\(s\) \('<start_of_image>'\) where the "
                                         r"record has 2 media item\(s\)$"):
        expand_text(gemma, "a<start_of_image>b", [one, one])
    with pytest.raises(ValueError, match=r"^the render holds 2 media placeholder\(s\) .* where the record has 1 media"):
        expand_text(gemma, "<start_of_image> <start_of_image>", [one])
    with pytest.raises(ValueError, match=r"^the render holds 2 media token\(s\) '<image_soft_token>' that no "
                                         r"placeholder wrote: the model would read them as image positions$"):
        expand_text(gemma, "a<start_of_image>b<image_soft_token><image_soft_token>", [one])
    with pytest.raises(ConfigError, match=r"^Gemma 3 takes no video in sftdata: video is expanded for the Qwen family "
                                          r"only$"):
        expansion(gemma, "video", one[1])
    with pytest.raises(ConfigError, match=r"^sftdata does not expand the media placeholders of pixtral: it expands "
                                          r"those of Qwen2-VL, .*, SmolVLM$"):
        expand_text({"family": "pixtral"}, "x", [])
    qwen = settings_from_dicts({"processor_class": "Qwen3VLProcessor"})
    image = ("image", MediaCount(1, (32, 32), (1, 2, 2)))
    with pytest.raises(ValueError, match=r"^the render's placeholder 1 is '<\|video_pad\|>' \(a video's\) where the "
                                         r"record's media item 1 is an image$"):
        expand_text(qwen, "<|video_pad|><|image_pad|>", [image, ("video", MediaCount(1, (32, 32), (1, 2, 2)))])
    with pytest.raises(ValueError, match=r"^a video of 2 temporal patches has 1 timestamps"):
        expansion(qwen, "video", MediaCount(2, (32, 32), (2, 2, 2), 4, (0.5,)))
    tiles = settings_from_dicts({"processor_class": "Idefics3Processor"}, {"image_seq_len": 2})
    with pytest.raises(ValueError, match=r"^an image of 1x2 tiles holds 6 tokens of 2 a tile, not 4"):
        expansion(tiles, "image", MediaCount(4, (364, 364), (1, 2)))


def test_a_placeholder_inside_an_expansion_is_not_read_again():
    tiles = settings_from_dicts({"processor_class": "Idefics3Processor"}, {"image_seq_len": 1})
    a, b = MediaCount(3, (364, 364), (1, 2)), MediaCount(1, (364, 364), (0, 0))
    out = expand_text(tiles, "<image>x<image>", [("image", a), ("image", b)])
    assert out == expansion(tiles, "image", a) + "x" + expansion(tiles, "image", b)
    assert out.count("<image>") == 4
