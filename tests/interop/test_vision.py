"""vision_collate: a batch of items with images holds the ids and labels of ``collate``,
the pixels and grids the model's image processor makes of the media files (read again,
their sha256 checked, EXIF orientation applied), and each episode's own mRoPE positions;
made in the DataLoader's workers; a changed file, a resizing processor, a cut span are
each one named error."""

from __future__ import annotations

import pickle
import random
from dataclasses import replace

import numpy as np
import pytest

from sftdata.errors import ConfigError, DatasetError
from sftdata.interop import media as media_module
from sftdata.interop.collate import Collator
from sftdata.interop.media import MediaChangedError, MediaLoader, ResolutionDriftError, image_processor
from sftdata.media import settings_from_dicts
from sftdata.media.rope import mrope_positions
from sftdata.store.reader import Dataset
from sftdata.torch import SFTDataset, VisionCollator, media_token_ids, vision_collate
from tests.helpers.loader import make_dataset
from tests.helpers.tiny_vl import IMAGE_ID, PUBLISHED, TOKEN_IDS, image_span, settings, vision_episode, write_image

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pinned():
    return settings()


@pytest.fixture
def episodes(tmp_path, pinned):
    rng = random.Random(7)
    return [vision_episode(rng, tmp_path, pinned, images, f"e{k}") for k, images in enumerate([2, 0, 1, 3])]


def _collator(pinned, **kw) -> VisionCollator:
    return VisionCollator.of(pinned, TOKEN_IDS, **kw)


def _spec(pinned):
    return _collator(pinned).spec


def _expected_pixels(pinned, eps):
    """What the processor makes of every image of the batch, in token order, loaded as
    transformers' load_image loads it."""
    pictures = [ImageOps.exif_transpose(Image.open(s.item.uri)).convert("RGB") for e in eps for s in e["media"]]
    out = image_processor(pinned)(images=pictures, return_tensors="np")
    return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])


def _packed_row(eps, pad: int, pad_id: int = 0) -> dict:
    """The episodes laid end to end in one row, as a packed dataset's item (offsets row-relative)."""
    ids = np.concatenate([e["input_ids"] for e in eps] + [np.full(pad, pad_id, np.int64)])
    labels = np.concatenate([e["labels"] for e in eps] + [np.full(pad, -100, np.int64)])
    starts = np.cumsum([0] + [e["input_ids"].shape[0] for e in eps])
    spans = tuple(replace(s, offset=s.offset + int(starts[k])) for k, e in enumerate(eps) for s in e["media"])
    lengths = np.array([e["input_ids"].shape[0] for e in eps], np.int64)
    pos = np.concatenate([np.arange(n) for n in lengths] + [np.zeros(pad, np.int64)])
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "seq_lengths": lengths, "media": spans}


def test_padded_episodes_hold_the_texts_batch_the_processors_pixels_and_each_episodes_positions(pinned, episodes):
    out = _collator(pinned, pad_id=5).numpy(episodes)
    text = Collator(pad_id=5).numpy(episodes)
    for key in ("input_ids", "labels", "attention_mask"):
        np.testing.assert_array_equal(out[key], text[key])
    pixels, grids = _expected_pixels(pinned, episodes)
    np.testing.assert_array_equal(out["pixel_values"], pixels)
    assert out["image_grid_thw"].tolist() == [list(s.item.count.grid) for e in episodes for s in e["media"]]
    assert out["image_grid_thw"].tolist() == grids.tolist() and out["image_grid_thw"].shape == (6, 3)
    assert out["pixel_values"].shape[0] == int(grids.prod(1).sum())
    T = out["input_ids"].shape[1]
    assert out["position_ids"].shape == (3, 4, T)
    for k, e in enumerate(episodes):
        n = e["input_ids"].shape[0]
        grids_k = [s.item.count.grid for s in e["media"]]
        np.testing.assert_array_equal(out["position_ids"][:, k, :n], mrope_positions(e["input_ids"], _spec(pinned), grids_k))
        assert (out["position_ids"][:, k, n:] == 0).all()
    assert sorted(out) == ["attention_mask", "image_grid_thw", "input_ids", "labels", "pixel_values", "position_ids"]


def test_a_packed_row_has_four_position_rows_text_then_each_episodes_own_mrope(pinned, episodes):
    halves = [episodes[:2], episodes[2:]]
    L = max(sum(e["input_ids"].shape[0] for e in h) for h in halves) + 3
    rows = [_packed_row(h, pad=L - sum(e["input_ids"].shape[0] for e in h)) for h in halves]
    out = _collator(pinned).numpy(rows)
    assert out["position_ids"].shape == (4, 2, L) and out["use_cache"] is False
    for r, eps in enumerate([episodes[:2], episodes[2:]]):
        np.testing.assert_array_equal(out["position_ids"][0, r], rows[r]["position_ids"])
        at = 0
        for e in eps:
            n = e["input_ids"].shape[0]
            want = mrope_positions(e["input_ids"], _spec(pinned), [s.item.count.grid for s in e["media"]])
            np.testing.assert_array_equal(out["position_ids"][1:, r, at:at + n], want)
            at += n
        assert (out["position_ids"][:, r, at:] == 0).all()
    pixels, _ = _expected_pixels(pinned, episodes)
    np.testing.assert_array_equal(out["pixel_values"], pixels)


def test_padding_free_lays_the_episodes_end_to_end_with_their_positions(pinned, episodes):
    out = _collator(pinned, padding_free=True).numpy([_packed_row(episodes[:3], pad=2), _packed_row(episodes[3:], pad=1)])
    assert _collator(pinned, padding_free=True).numpy(episodes)["position_ids"].tolist() == out["position_ids"].tolist()
    ids = np.concatenate([e["input_ids"] for e in episodes])
    np.testing.assert_array_equal(out["input_ids"][0], ids)
    assert out["position_ids"].shape == (4, 1, ids.shape[0])
    assert out["cu_seq_lens_q"].tolist() == np.cumsum([0] + [e["input_ids"].shape[0] for e in episodes]).tolist()
    want = np.concatenate([mrope_positions(e["input_ids"], _spec(pinned), [s.item.count.grid for s in e["media"]])
                           for e in episodes], axis=1)
    np.testing.assert_array_equal(out["position_ids"][1:, 0], want)
    np.testing.assert_array_equal(out["position_ids"][0, 0], np.concatenate([np.arange(e["input_ids"].shape[0])
                                                                             for e in episodes]))
    np.testing.assert_array_equal(out["pixel_values"], _expected_pixels(pinned, episodes)[0])


def test_exif_orientation_is_applied_before_the_processor(tmp_path, pinned):
    """A portrait photo stored landscape with EXIF orientation 6: the grid recorded from the
    header (sides swapped) is the grid the processor makes of the turned pixels."""
    path = write_image(tmp_path / "rot.jpg", 300, 120, fmt="JPEG", orientation=6)
    span = image_span(path, 1, pinned)
    assert span.item.size == (120, 300) and span.item.count.grid == (1, 22, 8)
    ids = np.array([1] + [IMAGE_ID] * span.item.count.tokens + [2])
    out = _collator(pinned).numpy([{"input_ids": ids, "labels": ids, "media": (span,)}])
    assert out["image_grid_thw"].tolist() == [[1, 22, 8]]


def test_a_text_only_batch_has_no_pixels_and_plain_positions(pinned):
    ids = np.arange(6)
    out = _collator(pinned).numpy([{"input_ids": ids, "labels": ids}])
    assert "pixel_values" not in out and out["position_ids"].tolist() == [[list(range(6))]] * 3


def test_a_changed_file_is_named(tmp_path, pinned, episodes):
    path = episodes[0]["media"][1].item.uri
    write_image(path, 40, 40, seed=99)
    with pytest.raises(MediaChangedError, match=rf"item 0 of the batch: {path} changed since the dataset was prepared: "
                                                r"sha256 [0-9a-f]{16}\.\.\., recorded [0-9a-f]{16}\.\.\."):
        _collator(pinned).numpy(episodes)


def test_a_missing_file_and_an_inline_item_are_named(tmp_path, pinned, episodes):
    gone = episodes[3]["media"][0]
    (tmp_path / gone.item.uri).unlink()
    with pytest.raises(DatasetError, match=r"item 3 of the batch: image at token \d+ cannot be read again: .*no such file"):
        _collator(pinned).numpy(episodes)
    inline = replace(gone, item=replace(gone.item, uri="data:"))
    with pytest.raises(DatasetError, match="was an inline data: URL, whose bytes the dataset does not keep"):
        MediaLoader(pinned).images([("episode 9", inline)])


def test_a_processor_that_resizes_differently_is_resolution_drift(pinned, episodes):
    other = image_processor({**pinned, "max_pixels": 28 * 28 * 16})
    with pytest.raises(ResolutionDriftError, match=r"item 0 of the batch: the image processor makes a \d+x\d+ image "
                                                   r"\(.*\) a grid of \(1, \d+, \d+\), the dataset recorded \(1, \d+, \d+\)"):
        _collator(pinned, processor=other).numpy(episodes)


def test_video_a_cut_span_and_other_families_are_refused(pinned, episodes):
    e = episodes[0]
    s = e["media"][0]
    end = s.offset + s.item.count.tokens - 1
    cut = {**e, "input_ids": e["input_ids"][:end], "labels": e["labels"][:end]}
    with pytest.raises(ConfigError, match=rf"item 0 of the batch: its image at tokens {s.offset}\.\.{end} is cut by the "
                                          rf"item's end \({end} tokens\): a block_size shorter than the episode cuts media"):
        _collator(pinned).numpy([cut])
    video = replace(s, item=replace(s.item, kind="video"))
    with pytest.raises(ConfigError, match=f"a video at token {s.offset}: sftdata loads the pixels of images only so far"):
        MediaLoader(pinned).images([("item 0", video)])
    with pytest.raises(ConfigError, match="sftdata loads the pixels of the Qwen-VL family only so far, not Gemma 3's"):
        image_processor({"family": "gemma3"})


def test_decoding_happens_in_the_dataloaders_workers(monkeypatch, pinned, episodes):
    """The main process decodes nothing: with workers (forked, so they keep the counter's
    patch) every image is decoded there; the batches equal the in-process collation."""
    decoded = []
    real = media_module.decode_image
    monkeypatch.setattr(media_module, "decode_image", lambda data, where="": decoded.append(where) or real(data, where))
    collator = _collator(pinned)
    loader = torch.utils.data.DataLoader(episodes, batch_size=2, collate_fn=collator, num_workers=2,
                                         multiprocessing_context="fork")
    batches = list(loader)
    assert decoded == []
    for b, got in enumerate(batches):
        want = collator(episodes[2 * b:2 * b + 2])
        assert sorted(got) == sorted(want)
        for k in want:
            assert torch.equal(got[k], want[k])
    assert len(decoded) == 6  # the in-process collation above decoded them, here


def test_sftdataset_items_carry_their_spans_and_vision_collate_reads_the_pinned_settings(tmp_path, monkeypatch, pinned):
    """The wiring: a dataset with media gives each item its spans (the store reader's
    media_spans); vision_collate takes the settings and token ids its tokenizer_state pins."""
    path = make_dataset(tmp_path / "ds", [12, 9, 15])
    spans = {1: (image_span(write_image(tmp_path / "a.png", 56, 56), 2, pinned),)}
    monkeypatch.setattr(Dataset, "has_media", True, raising=False)
    monkeypatch.setattr(Dataset, "media_spans", lambda self, split, i: spans.get(i, ()), raising=False)
    ds = SFTDataset(path)
    assert ds[1]["media"] == spans[1] and ds[0]["media"] == ()
    with pytest.raises(ConfigError, match=r"pins no processor settings \(no \"processor\" in tokenizer_state.json\)"):
        vision_collate(ds)
    ds.dataset.tokenizer_state = {**ds.dataset.tokenizer_state, "processor": pinned, "added_tokens": TOKEN_IDS}
    c = vision_collate(ds, tokens_per_second=2)
    assert (c.spec.image_token_id, c.spec.video_token_id, c.spec.merge_size, c.text.pad_id) == (IMAGE_ID, 152, 2,
                                                                                               ds.pad_id)
    assert media_token_ids({"special_tokens": {"<|EOS|>": 3}, "added_tokens": {"<|image_pad|>": 7}}) == {
        "<|EOS|>": 3, "<|image_pad|>": 7}


def test_the_collator_pickles_without_its_processor(pinned, episodes):
    c = _collator(pinned)
    first = c.numpy(episodes[:1])  # builds the processor
    assert c.loader._built is not None
    again = pickle.loads(pickle.dumps(c))
    assert again.loader._built is None and again.loader.settings == pinned == settings_from_dicts(PUBLISHED)
    np.testing.assert_array_equal(again.numpy(episodes[:1])["pixel_values"], first["pixel_values"])
