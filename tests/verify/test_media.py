"""verify's ``media`` check: a dataset with images passes; each way its media can be wrong
(a count that its size does not give, a span's tokens that are not the placeholder, a
placeholder no span records, a trained media token, no pinned settings, a damaged table) is
one named problem; ``--sources`` re-hashes the media. A text dataset skips the check by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sftdata.store.format import MASK_FILE, MEDIA_FILE, TOKENIZER_FILE, TOKENS_FILE, dumps_json
from sftdata.verify import verify
from tests.helpers.media_dataset import _sha, media_dataset, reseal, rewrite_metadata

SHARD = "train/shard_00000"
WORD_ID = 5562  # " dog" in Qwen's tokenizer


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return media_dataset(tmp_path_factory.mktemp("media"), [[(56, 56), (100, 200)], [(300, 120)], []])


@pytest.fixture
def copy(built, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(built.root, root)
    return root


def _media(report):
    return next(c for c in report.checks if c.name == "media")


def _problems(report, check="media"):
    return [(p.code, p.where, p.message) for p in report.problems if p.check == check]


def _set(root, fn, dtype, changes):
    path = root / SHARD / fn
    a = np.fromfile(path, dtype=dtype)
    for pos, value in changes.items():
        a[pos] = value
    a.tofile(path)
    reseal(root, SHARD, fn)


def _lines(root):
    return [json.loads(line) for line in (root / SHARD / MEDIA_FILE).read_text().splitlines()]


def _write_lines(root, rows):
    (root / SHARD / MEDIA_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    reseal(root, SHARD, MEDIA_FILE)


def _episode_start(root, e):
    return int(np.fromfile(root / SHARD / "episodes.idx", dtype="<u8").reshape(-1, 2)[e, 0])


def test_a_dataset_with_media_passes_every_check(built):
    report = verify(built.root)
    assert report.ok, [str(p) for p in report.problems]
    media = _media(report)
    assert (media.status, media.problems, media.note) == ("ok", 0, "")
    assert [c.name for c in report.checks].index("media") == [c.name for c in report.checks].index("mask_rule") + 1


def test_a_text_dataset_skips_the_check_by_name(tmp_path):
    from sftdata.prepare import PrepareOptions, prepare
    from tests.helpers.data import chat, write_jsonl

    prepare([write_jsonl(tmp_path / "in.jsonl", [chat("hi", "hello")])], tmp_path / "text", PrepareOptions(workers=1))
    report = verify(tmp_path / "text")
    assert report.ok
    media = _media(report)
    assert (media.status, media.note) == ("skipped", "no media (a text dataset)")


def test_a_count_its_size_does_not_give_is_named(copy):
    rows = _lines(copy)
    rows[0]["size"] = [300, 120]  # recorded 4 tokens, 56x56: the size now gives 44
    _write_lines(copy, rows)
    report = verify(copy)
    assert _problems(report) == [(
        "count", "episode 0 of train, line 1 of media.jsonl",
        f"the image {rows[0]['uri']} at offset 28 of episode 0: tokens 4 recorded, 44 re-derived; processed "
        "[56, 56] recorded, [112, 308] re-derived; grid [1, 4, 4] recorded, [1, 8, 22] re-derived (family "
        "'qwen2_5_vl', the settings pinned in tokenizer_state.json)")]
    assert [c.name for c in report.checks if c.status == "failed"] == ["media"]


def test_a_spans_token_that_is_not_the_placeholder_is_named(copy):
    _set(copy, TOKENS_FILE, "<u4", {_episode_start(copy, 0) + 30: WORD_ID})
    report = verify(copy)
    assert _problems(report) == [
        ("missing_placeholder", "episode 0 of train", "episode 0 holds 31 media token(s) but the spans of its "
         "media.jsonl account for 32: a span without its tokens")]
    assert [c.name for c in report.checks if c.status == "failed"] == ["media"]


def test_a_span_whose_tokens_are_elsewhere_or_of_another_kind_is_named(copy):
    start = _episode_start(copy, 0)
    toks = np.fromfile(copy / SHARD / TOKENS_FILE, dtype="<u4")
    first = int(np.flatnonzero(toks[start:] == 151655)[0])  # the first image's first token (offset 28)
    _set(copy, TOKENS_FILE, "<u4", {start + first: WORD_ID, start + first - 1: 151655})  # moved one token left
    assert _problems(verify(copy)) == [
        ("not_placeholder", "episode 0 of train, token 28 of it", "the image span at token 28 of episode 0 does not "
         "begin with its item's next media token: the media tokens before it are not those of the spans before it, "
         "or it is not a media token")]
    _set(copy, TOKENS_FILE, "<u4", {start + first: 151655, start + first - 1: toks[start + first - 1],
                                    start + first + 2: 151656})  # a video's token inside the image's
    assert _problems(verify(copy)) == [
        ("not_placeholder", "episode 0 of train, token 30 of it", "token 30 of episode 0 is <|video_pad|> in the "
         "image span there, not <|image_pad|> (id 151655): the tokens do not hold the image's")]


def test_a_placeholder_no_span_records_is_named(copy):
    start = _episode_start(copy, 1)
    _set(copy, TOKENS_FILE, "<u4", {start + 3: 151655})
    report = verify(copy)
    assert _problems(report) == [
        ("stray_placeholder", "episode 1 of train", "episode 1 holds 45 media token(s) but the spans of its "
         "media.jsonl account for 44: a media token without its media")]


def test_a_trained_media_token_is_named(copy):
    _set(copy, MASK_FILE, np.uint8, {_episode_start(copy, 1) + 40: 1})
    report = verify(copy)
    assert _problems(report) == [
        ("trained", "episode 1 of train, token 40 of it", "episode 1 trains the media token <|image_pad|> at token "
         "40: a media token is never trained (mask 0)")]
    assert [c.name for c in report.checks if c.status == "failed"] == ["counts", "mask_rule", "media", "stops"]


def test_no_pinned_settings_is_named(copy):
    state = json.loads((copy / TOKENIZER_FILE).read_text())
    del state["processor"]
    (copy / TOKENIZER_FILE).write_bytes(dumps_json(state))
    rewrite_metadata(copy, lambda m: m["files"].update({TOKENIZER_FILE: _sha(copy / TOKENIZER_FILE)}))
    report = verify(copy)
    assert [str(p) for p in report.problems] == [
        "tokenizer_state.json (processor): tokenizer_state.json records no processor settings, but the metadata "
        "records media: no count can be re-derived, nor a placeholder id found. To fix: re-create the dataset with "
        "`sftdata prepare-chat` / `sftdata prepare-tool`"]


def test_a_damaged_table_fails_the_media_check(copy):
    rows = _lines(copy)
    _write_lines(copy, [rows[1], rows[0], rows[2]])
    report = verify(copy)
    assert [(c, w) for c, w, _ in _problems(report)] == [("unsorted", "episode 0 of train, line 2 of media.jsonl")]


def test_a_missing_table_is_a_files_problem(copy):
    (copy / SHARD / MEDIA_FILE).unlink()
    report = verify(copy)
    assert [str(p).split(". To fix")[0] for p in report.problems] == [
        "train/shard_00000/media.jsonl: train/shard_00000/media.jsonl is missing"]
    assert [c.name for c in report.checks if c.status == "failed"] == ["files"]


def test_sources_rehashes_every_media_file(tmp_path):
    ds = media_dataset(tmp_path, [[(56, 56), (100, 200)]])
    report = verify(ds.root, sources=True)
    assert report.ok and report.reproducible is True
    first, second = ds.images[0]
    recorded = _lines(ds.root)[1]["sha256"]
    first.unlink()
    second.write_bytes(second.read_bytes() + b"\0")
    report = verify(ds.root, sources=True)
    assert _problems(report, "sources") == [
        ("media_missing", "line 1 of train/shard_00000/media.jsonl", f"media {first} is missing (media_missing): the "
         "dataset cannot be reproduced from its inputs"),
        ("changed", "line 2 of train/shard_00000/media.jsonl", f"media {second} has sha256 "
         f"{_sha(second)['sha256'][:16]}..., its media table recorded {recorded[:16]}...: it changed since prepare "
         "read it")]
    assert report.reproducible is False


def test_a_counts_rederivation_for_images_and_videos(built):
    from sftdata.media import MediaCount
    from sftdata.media.item import MediaItem, MediaSpan
    from sftdata.verify.media import rederive_count

    def span(kind, size, count):
        return MediaSpan(0, MediaItem(kind, "/x", "0" * 64, 1, size, size, count))

    s = built.settings
    assert rederive_count(s, span("image", (56, 56), MediaCount(4, (56, 56), (1, 4, 4))), {}) is None
    assert rederive_count(s, span("image", (56, 56), MediaCount(5, (56, 56), (1, 4, 4))), {}) == \
        "tokens 5 recorded, 4 re-derived"
    assert rederive_count(s, span("image", (10000, 10), MediaCount(5, (56, 56), (1, 4, 4))), {}).startswith(
        "its size 10000x10 cannot be counted: an image of 10000x10: the Qwen-VL processor refuses an aspect ratio "
        "over 200")
    video = MediaCount(2 * 6 * 8 // 4, (84, 112), (2, 6, 8), frames=4)
    assert rederive_count(s, span("video", (112, 84), video), {}) is None
    assert rederive_count(s, span("video", (112, 84), MediaCount(20, (84, 112), (2, 6, 8), frames=4)), {}) == \
        "tokens 20 recorded, 24 re-derived"
