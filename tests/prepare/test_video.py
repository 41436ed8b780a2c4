"""prepare-chat on video records for Qwen2-VL, Qwen2.5-VL and Qwen3-VL model folders built offline: each
video's frame count, rate and size read from its container, counted under the pinned video
settings; every kept episode's ids are transformers' ``processor.apply_chat_template(messages,
tokenize=True)`` (its video processor a stand-in returning the grids and metadata transformers'
own reading and sampling give for that video: what it reads with ``load_video(..., "pyav")``,
the frames Qwen3-VL's ``sample_frames`` keeps), no media token is trained, each span records
kind "video", its grid, frames and timestamps, ``verify`` passes, ``inspect`` names each video,
and a cut video is one named reject."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import numpy as np
import pytest

from sftdata.chat.loss_rule import rule_from_state
from sftdata.media import VideoInfo, read_processor_settings, video_count
from sftdata.media.item import span_from_row
from sftdata.prepare import PrepareOptions, pool, prepare
from sftdata.report import episode_view
from sftdata.report.views import dataset_tokenizer
from sftdata.store import open_dataset
from sftdata.store.format import MEDIA_FILE
from sftdata.verify import verify
from tests.helpers.data import write_jsonl
from tests.helpers.vision import encode_image, encode_video
from tests.helpers.vision_families import FAMILIES, NOT_KWARGS, family_folder, reference_processor

video_utils = pytest.importorskip("transformers.video_utils")

# (name, frames, fps, width, height, container, codec)
VIDEOS = [("walk.mp4", 24, 8, 96, 64, "mp4", "libx264"), ("tall.mp4", 30, Fraction(30000, 1001), 48, 112, "mp4", "libx264"),
          ("slow.avi", 10, 2, 80, 80, "avi", "mpeg4")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("video") / "data"
    root.mkdir()
    for name, frames, fps, w, h, fmt, codec in VIDEOS:
        encode_video(root / name, frames, fps, w, h, fmt, codec)
    (root / "cut.mp4").write_bytes((root / "walk.mp4").read_bytes()[:1500])
    (root / "photo.jpg").write_bytes(encode_image(300, 200))
    records = [
        {"messages": [{"role": "user", "content": [{"type": "video", "video": "walk.mp4"},
                                                   {"type": "text", "text": "What happens?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "A walk."}]}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Compare "},
                                                   {"type": "image", "image": "photo.jpg"},
                                                   {"type": "text", "text": " with "},
                                                   {"type": "video", "video": "tall.mp4"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "They differ."}]}]},
        {"messages": [{"role": "user", "content": "<video>Is it slow?"},
                      {"role": "assistant", "content": "Very."}], "videos": ["slow.avi"]},
        {"messages": [{"role": "user", "content": [{"type": "video", "video": "slow.avi"},
                                                   {"type": "text", "text": "And "},
                                                   {"type": "video", "video": "walk.mp4"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Both move."}]}]},
        {"messages": [{"role": "user", "content": [{"type": "video", "video": "cut.mp4"},
                                                   {"type": "text", "text": "Cut?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]}]},
    ]
    return root, write_jsonl(root / "records.jsonl", records), records


def _given(record: dict) -> tuple[list[dict], list[str]]:
    """The record's messages in content-part form (LLaMA-Factory's <video> as its part), and
    its videos in order."""
    videos, listed = [], iter(record.get("videos", []))
    messages = []
    for m in record["messages"]:
        content = m["content"]
        if isinstance(content, str):
            content = ([{"type": "video", "video": next(listed)}, {"type": "text", "text": content[len("<video>"):]}]
                       if content.startswith("<video>") else [{"type": "text", "text": content}])
        videos += [p["video"] for p in content if p["type"] == "video"]
        messages.append({**m, "content": content})
    return messages, videos


def _planned(processor, family: str, settings: dict, path) -> tuple:
    """(grid, metadata) transformers' video processor gives the video at ``path``: its PyAV
    reading, and for Qwen3-VL the frames its own ``sample_frames`` keeps."""
    _, meta = video_utils.load_video(str(path), backend="pyav")
    info = VideoInfo(frames=meta.total_num_frames, fps=meta.fps, width=meta.width, height=meta.height)
    meta.frames_indices = None
    if family == "qwen3_vl":
        module = pytest.importorskip("transformers.models.qwen3_vl.video_processing_qwen3_vl")
        real = module.Qwen3VLVideoProcessor(**{k: v for k, v in FAMILIES[family].video.items() if k not in NOT_KWARGS})
        meta.frames_indices = [int(i) for i in real.sample_frames(meta, num_frames=real.num_frames, fps=real.fps)]
    return video_count(settings, info).grid, meta


def _reference(processor, family: str, settings: dict, record: dict, base) -> list[int]:
    from tests.helpers.vision import loaded

    messages, videos = _given(record)
    processor.video_processor.plan = [_planned(processor, family, settings, base / v) for v in videos]
    given = [{**m, "content": [{"type": "image", "image": loaded(base / p["image"])} if p["type"] == "image" else p
                               for p in m["content"]]} for m in messages]
    out = processor.apply_chat_template(given, tokenize=True)
    return list(out[0] if out and isinstance(out[0], list) else out)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_every_video_episode_is_the_processors_and_verify_passes(data, family, tmp_path):
    root, src, records = data
    folder = family_folder(tmp_path / family, family)
    out = tmp_path / "ds"
    summary = prepare([src], out, PrepareOptions(tokenizer=str(folder)))
    assert summary.episodes == {"train": len(records) - 1}
    assert summary.rejected == {"media_unreadable": 1}
    (line,) = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert (line["record"], line["reason"], line["where"]) == (4, "media_unreadable", f"{src}:line 5")
    assert line["message"].startswith("video cut.mp4: a video that ends early: its 'mdat' box needs ")
    processor = reference_processor(folder, family)
    settings = read_processor_settings(folder)
    meta = json.loads((out / "dataset_metadata.json").read_text())
    state = json.loads((out / "tokenizer_state.json").read_text())
    media_ids = state["mask_rule"]["media_ids"]
    rule = rule_from_state(state)
    (shard,) = meta["splits"]["train"]["shards"]
    at = out / "train" / shard["name"]
    tokens = np.fromfile(at / "tokens.bin", dtype=np.dtype(meta["token_dtype"]))
    mask = np.fromfile(at / "mask.bin", dtype=np.uint8)
    index = np.fromfile(at / "episodes.idx", dtype="<u8").reshape(-1, 2)
    sources = np.fromfile(at / "sources.idx", dtype="<u8")
    for e, (start, length) in enumerate(index.tolist()):
        ids, m = tokens[start:start + length], mask[start:start + length]
        assert ids.tolist() == _reference(processor, family, settings, records[int(sources[e])], root), (family, e)
        assert m[np.isin(ids, media_ids)].sum() == 0 and m.sum() > 0
        assert np.array_equal(rule.masks(ids, np.array([ids.size])), m)
    spans = [span_from_row(json.loads(line)) for line in (at / MEDIA_FILE).read_text().splitlines()]
    videos = [(ep, s.item) for ep, s in spans if s.item.kind == "video"]
    assert [(ep, item.uri.rsplit("/", 1)[-1]) for ep, item in videos] == [
        (0, "walk.mp4"), (1, "tall.mp4"), (2, "slow.avi"), (3, "slow.avi"), (3, "walk.mp4")]
    for _, item in videos:
        name, frames, fps, w, h, *_ = next(v for v in VIDEOS if item.uri.endswith(v[0]))
        count = video_count(settings, VideoInfo(frames=frames, fps=float(fps), width=w, height=h))
        assert (item.size, item.stored, item.count) == ((w, h), (w, h), count)
        assert item.count.frames == (count.grid[0] * 2) and item.count.grid == count.grid
        assert len(item.count.timestamps) == (count.grid[0] if family == "qwen3_vl" else 0)
    assert meta["media"]["videos"] == 5 and meta["media"]["images"] == 1
    assert meta["media"]["tokens"] == int(np.isin(tokens, media_ids).sum())
    report = verify(out)
    assert report.ok, [str(p) for p in report.problems]
    assert next(c for c in report.checks if c.name == "media").status == "ok"


def test_a_video_under_a_family_without_video_is_one_named_reject(data, tmp_path):
    root, _, records = data
    text = {"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]}
    src = write_jsonl(root / "one.jsonl", [records[0], text])
    folder = family_folder(tmp_path / "gemma3", "gemma3")
    summary = prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=str(folder), allow_pad_as_stop=True))
    assert summary.rejected == {"media_unsupported": 1} and summary.episodes == {"train": 1}
    (line,) = [json.loads(x) for x in (tmp_path / "ds" / "rejects.jsonl").read_text().splitlines()]
    assert (line["record"], line["reason"], line["where"]) == (0, "media_unsupported", f"{src}:line 1")
    assert line["message"].startswith("video walk.mp4: Gemma 3 takes no video in sftdata: video is counted for the "
                                      "Qwen family only; leave the video out of the record, or give its frames as images")


@pytest.mark.parametrize("family, before, label", [
    ("qwen2_5_vl", "<|vision_start|>", "<video 1: 96x64, 24 frames -> 1680 tokens>"),
    ("qwen3_vl", "<0.3 seconds><|vision_start|>", "<video 1: 96x64, 6 frames -> 18 tokens>")])
def test_inspect_shows_a_video_as_one_label(data, family, before, label, tmp_path):
    """A Qwen3-VL video's tokens have timestamps between them: the label covers them all, from
    its first video token to its last."""
    root, _, records = data
    src = write_jsonl(root / f"walk_{family}.jsonl", records[:1])
    folder = family_folder(tmp_path / family, family)
    prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=str(folder)))
    ds = open_dataset(tmp_path / "ds")
    tok, rule, _ = dataset_tokenizer(ds)
    texts = [p.text for p in episode_view(ds, "train", 0, tok, rule).pieces]
    at = texts.index(label)
    assert "".join(texts[at - 2:at + 3]).endswith(f"user\n{before}{label}<|vision_end|>What happens?")
    assert not any("<|video_pad|>" in t or "seconds" in t for t in texts[at + 1:])


def test_one_and_two_workers_write_the_same_bytes(data, tmp_path, monkeypatch):
    _, src, _ = data
    folder = family_folder(tmp_path / "qwen3_vl", "qwen3_vl")
    opts = PrepareOptions(tokenizer=str(folder), val_split=0.3, seed=4, shard_tokens=200)
    prepare([src], tmp_path / "one", opts)
    monkeypatch.setattr(pool, "MAX_PART_BYTES", 300)  # several partitions, each staging its own episodes
    monkeypatch.setattr(pool, "MIN_PART_BYTES", 300)
    prepare([src], tmp_path / "two", dataclasses.replace(opts, workers=2))
    files = {str(p.relative_to(tmp_path / "one")): p.read_bytes() for p in sorted((tmp_path / "one").rglob("*"))
             if p.is_file() and p.name != "dataset_metadata.json"}
    assert files == {str(p.relative_to(tmp_path / "two")): p.read_bytes()
                     for p in sorted((tmp_path / "two").rglob("*")) if p.is_file() and p.name != "dataset_metadata.json"}
    one, two = (json.loads((tmp_path / d / "dataset_metadata.json").read_text()) for d in ("one", "two"))
    assert one["splits"] == two["splits"] and one["media"] == two["media"]
    assert (one["media"]["videos"], one["media"]["images"]) == (5, 1)
    assert sum(len(m["shards"]) for m in one["splits"].values()) >= 3
