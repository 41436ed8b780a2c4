"""The proof that a packed Qwen-VL batch trains as its episodes alone: a tiny randomly
initialised ``Qwen2VLForConditionalGeneration`` (and Qwen2.5-VL's, Qwen3-VL's; hidden 32, one
layer, vision depth 1, seed fixed) in float64 on CPU. Each episode run alone takes the model's own path (the
processor's pixels, ``mm_token_type_ids``, the model's own ``get_rope_index``); the packed
row and the padding-free batch are ``vision_collate``'s (each episode's own mRoPE rows,
row 0 the plain positions from which transformers confines attention to each episode).
The losses of every trained token are equal; 1-D positions, or mRoPE rows without the
plain row that confines attention, give other losses (so the check can fail)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from sftdata.interop.media import image_processor
from sftdata.torch import VisionCollator
from tests.helpers.tiny_vl import IMAGE_ID, TOKEN_IDS, VIDEO_ID, settings, tiny_model, vision_episode

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")
pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def family(request):
    return request.param


@pytest.fixture(scope="module")
def model(family):
    patch = settings(family)["patch_size"]
    return tiny_model(family, "ForConditionalGeneration", seed=43, patch_size=patch).to(torch.float64)


@pytest.fixture(scope="module")
def pinned(family):
    return settings(family)


def token_losses(logits, labels) -> np.ndarray:
    """The cross-entropy of every trained target, in order (float64): logits[t] scores labels[t + 1]."""
    logits, labels = logits.reshape(-1, logits.shape[-1])[:-1], labels.reshape(-1)[1:]
    keep = labels != -100
    return torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="none").numpy()


def alone(model, pinned, episode):
    """The model's own forward on one episode: the processor's pixels, its token types, and
    positions it computes itself. Returns (token losses, the model's summed loss)."""
    ids = torch.from_numpy(episode["input_ids"])[None]
    labels = torch.from_numpy(episode["labels"])[None]
    kwargs = {"mm_token_type_ids": (ids == IMAGE_ID).int() + 2 * (ids == VIDEO_ID).int()}
    if episode["media"]:
        pictures = [ImageOps.exif_transpose(Image.open(s.item.uri)).convert("RGB") for s in episode["media"]]
        out = image_processor(pinned)(images=pictures, return_tensors="pt")
        kwargs.update(pixel_values=out["pixel_values"].double(), image_grid_thw=out["image_grid_thw"])
    with torch.no_grad():
        res = model(input_ids=ids, labels=labels, num_items_in_batch=1, use_cache=False, **kwargs)
    return token_losses(res.logits, labels), float(res.loss)


def batched(model, batch):
    with torch.no_grad():
        keys = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "pixel_values",
                                                        "image_grid_thw") if k in batch}
        res = model(**keys, labels=batch["labels"], num_items_in_batch=1, use_cache=False)
    return token_losses(res.logits, batch["labels"]), float(res.loss)


def _episodes(tmp_path, pinned, images, seed):
    rng = random.Random(seed)
    return [vision_episode(rng, tmp_path, pinned, n, f"s{seed}-{k}") for k, n in enumerate(images)]


def _packed_row(eps, pad: int) -> dict:
    ids = np.concatenate([e["input_ids"] for e in eps] + [np.zeros(pad, np.int64)])
    labels = np.concatenate([e["labels"] for e in eps] + [np.full(pad, -100, np.int64)])
    starts = np.cumsum([0] + [e["input_ids"].shape[0] for e in eps])
    spans = tuple(replace(s, offset=s.offset + int(starts[k])) for k, e in enumerate(eps) for s in e["media"])
    return {"input_ids": ids, "labels": labels, "seq_lengths": np.array([e["input_ids"].shape[0] for e in eps]),
            "media": spans}


@pytest.mark.parametrize("images,seed", [([1, 2, 1], 1), ([2, 0, 3], 2), ([1, 1], 3)])
def test_a_packed_rows_loss_is_the_sum_of_its_episodes_alone(tmp_path, model, pinned, images, seed):
    eps = _episodes(tmp_path, pinned, images, seed)
    refs = [alone(model, pinned, e) for e in eps]
    want = np.concatenate([r[0] for r in refs])
    collator = VisionCollator.of(pinned, TOKEN_IDS)
    packed = collator([_packed_row(eps, pad=4)])
    assert packed["position_ids"].shape[0] == 4 and "attention_mask" not in packed
    got, loss = batched(model, packed)
    assert got.shape == want.shape and want.shape[0] == sum(int((e["labels"] != -100).sum()) for e in eps)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert loss == pytest.approx(sum(r[1] for r in refs), rel=1e-6)  # the model's loss: float32 inside
    flat, _ = batched(model, VisionCollator.of(pinned, TOKEN_IDS, padding_free=True)(eps))
    np.testing.assert_allclose(flat, want, rtol=1e-10, atol=1e-12)
    padded_batch = collator(eps)  # one episode a row, right-padded: attention_mask and (3, B, T) positions
    assert padded_batch["attention_mask"].shape[0] == len(eps) and padded_batch["position_ids"].shape[0] == 3
    padded, _ = batched(model, padded_batch)
    np.testing.assert_allclose(padded, want, rtol=1e-10, atol=1e-12)


def test_plain_positions_or_no_text_row_give_other_losses(tmp_path, model, pinned):
    """The controls (each differs by over 1e-6, 10,000 times the matching runs' error): the
    same packed row with 1-D positions on all rows (a packer that ignores mRoPE), or with the
    mRoPE rows alone (no row 0: transformers then cannot find the episodes, and the second
    attends to the first). The model's own positions of the whole row as one sequence do
    match: they shift each later episode's three rows by one constant, and rotary attention
    sees only differences."""
    eps = _episodes(tmp_path, pinned, [1, 2], 4)
    want = np.concatenate([alone(model, pinned, e)[0] for e in eps])
    batch = VisionCollator.of(pinned, TOKEN_IDS)([_packed_row(eps, pad=0)])
    plain = {**batch, "position_ids": batch["position_ids"][:1].expand(4, -1, -1)}
    assert np.abs(batched(model, plain)[0] - want).max() > 1e-6
    no_text_row = {**batch, "position_ids": batch["position_ids"][1:]}
    first = int((eps[0]["labels"] != -100).sum())
    got = batched(model, no_text_row)[0]
    np.testing.assert_allclose(got[:first], want[:first], rtol=1e-10)  # the first episode sees nothing before it
    assert np.abs(got[first:] - want[first:]).max() > 1e-6
    ids = batch["input_ids"]
    whole, _ = model.model.get_rope_index(ids, (ids == IMAGE_ID).int(), image_grid_thw=batch["image_grid_thw"])
    shifted = {**batch, "position_ids": torch.cat([batch["position_ids"][:1], whole], dim=0)}
    np.testing.assert_allclose(batched(model, shifted)[0], want, rtol=1e-9)
