"""store: a dataset with media read back: each episode's spans exactly as written, the pinned
processor settings, and every way a shard's media table (or the metadata announcing it) can
be wrong refused by name. A text dataset reads as before: no spans, no settings."""

from __future__ import annotations

import json
import shutil

import pytest

from sftdata.errors import DatasetError
from sftdata.store import open_dataset, scan_dataset
from sftdata.store.format import MEDIA_FILE, MEDIA_KEY
from sftdata.store.media_table import read_media_table
from tests.helpers.media_dataset import media_dataset, reseal, rewrite_metadata

SHARD = "train/shard_00000"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return media_dataset(tmp_path_factory.mktemp("media"), [[(56, 56), (100, 200)], [(300, 120)], []])


@pytest.fixture
def copy(built, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(built.root, root)
    return root


def _lines(root):
    return [json.loads(line) for line in (root / SHARD / MEDIA_FILE).read_text().splitlines()]


def _write(root, rows):
    """One line per row: a string as it is (a damaged line), anything else as JSON."""
    (root / SHARD / MEDIA_FILE).write_bytes(b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n"
                                                     for r in rows))
    reseal(root, SHARD, MEDIA_FILE)  # its recorded size and sha256 follow: only the media check sees it


def test_every_episode_reads_back_its_spans_and_the_settings(built):
    ds = open_dataset(built.root)
    assert ds.has_media and ds.metadata["format_version"] == 4
    assert ds.processor_settings == built.settings and ds.processor_settings["family"] == "qwen2_5_vl"
    got = [ds.media_spans("train", e) for e in range(3)]
    assert got == built.spans["train"]
    assert [[(s.offset, s.item.count.tokens, s.item.size) for s in spans] for spans in got] == \
        [[(28, 4, (56, 56)), (37, 28, (100, 200))], [(28, 44, (300, 120))], []]
    tokens, mask = ds.split("train").episode(0)
    assert tokens[28:32].tolist() == [built.image_pad] * 4 and mask[28:32].tolist() == [0] * 4
    assert tokens[27] != built.image_pad and tokens[32] != built.image_pad


def test_a_text_dataset_has_no_spans_and_no_settings(built, tmp_path):
    from sftdata.prepare import PrepareOptions, prepare
    from tests.helpers.data import chat, write_jsonl

    src = write_jsonl(tmp_path / "in.jsonl", [chat("hi", "hello")])
    prepare([src], tmp_path / "text", PrepareOptions(workers=1))
    ds = open_dataset(tmp_path / "text")
    assert (ds.has_media, ds.processor_settings, ds.media_spans("train", 0)) == (False, None, ())
    assert ds.metadata["format_version"] == 1 and not (tmp_path / "text" / SHARD / MEDIA_FILE).exists()


def test_the_table_is_read_once_and_only_when_asked(copy):
    ds = open_dataset(copy)
    shard = ds.split("train").shards[0]
    assert shard.media_table is None
    ds.media_spans("train", 1)
    first = shard.media_table
    ds.media_spans("train", 0)
    assert shard.media_table is first and sorted(first.spans) == [0, 1]


def test_an_episode_out_of_range_is_the_readers_own_error(built):
    with pytest.raises(DatasetError, match=r"episode 3 does not exist in split 'train', which has 3 episodes"):
        open_dataset(built.root).media_spans("train", 3)


def test_a_missing_media_table_refuses_the_dataset(copy):
    (copy / SHARD / MEDIA_FILE).unlink()
    with pytest.raises(DatasetError, match=r"train/shard_00000/media.jsonl is missing"):
        open_dataset(copy)


def test_media_counts_without_version_4_and_version_4_without_media_are_refused(copy):
    rewrite_metadata(copy, lambda m: m.update(format_version=1))
    with pytest.raises(DatasetError, match=r"a 'episodes' dataset with media is format_version 4, but this one "
                                           r"records 1"):
        open_dataset(copy)
    rewrite_metadata(copy, lambda m: (m.update(format_version=4), m.pop(MEDIA_KEY)))
    with pytest.raises(DatasetError, match=r"a 'episodes' dataset is format_version 1, but this one records 4"):
        open_dataset(copy)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda rows: [*rows[:1], "junk", *rows[1:]], r"line 2 of media.jsonl\): line 2 is not JSON"),
    (lambda rows: [rows[0], [1, 2], rows[2]], r"line 2 is not a JSON object"),
    (lambda rows: [rows[0], {k: v for k, v in rows[1].items() if k != "sha256"}, rows[2]], r"line 2 has no sha256"),
    (lambda rows: [{**rows[0], "extra": 1}, *rows[1:]], r"line 1 has unknown key\(s\) extra"),
    (lambda rows: [{**rows[0], "kind": "audio"}, *rows[1:]], r"line 1 has kind \"audio\", not 'image' or 'video'"),
    (lambda rows: [{**rows[0], "tokens": 0}, *rows[1:]], r"line 1 has tokens 0, not a whole number >= 1"),
    (lambda rows: [{**rows[0], "size": [56]}, *rows[1:]], r"line 1 has size \[56\], not \[width, height\]"),
    (lambda rows: [rows[0], rows[1], {**rows[2], "episode": 7}],
     r"line 3 places an item in episode 7 of the shard, which holds 3 episodes"),
    (lambda rows: [rows[0], {**rows[1], "offset": 1000}, rows[2]],
     r"media.jsonl \(episode 0 of train, line 2 of media.jsonl\): the media span at offset 1,000 \(28 tokens\) "
     r"runs past the end of episode 0 \(87 tokens\)"),
    (lambda rows: [rows[1], rows[0], rows[2]],
     r"the span at \(episode 0, offset 28\) comes after \(episode 0, offset 37\): media.jsonl is not in "
     r"\(episode, offset\) order"),
    (lambda rows: [rows[0], {**rows[1], "offset": 30}, rows[2]],
     r"the media span at offset 30 of episode 0 starts inside the one before it \(tokens \[28, 32\)\): the spans "
     r"overlap"),
])
def test_each_way_a_table_is_wrong_is_named_when_its_spans_are_read(copy, damage, message):
    _write(copy, damage(_lines(copy)))
    ds = open_dataset(copy)  # opening reads no media table
    with pytest.raises(DatasetError, match=message):
        ds.media_spans("train", 2)  # any episode of the shard: its table is read whole


def test_a_cut_table_is_named(copy):
    path = copy / SHARD / MEDIA_FILE
    path.write_bytes(path.read_bytes()[:-10])
    table = read_media_table(scan_dataset(copy).dataset.split("train").shards[0])
    assert [(p.check, p.code, p.where) for p in table.problems] == [("media", "not_json", "line 3 of media.jsonl")]
    assert str(table.problems[0]).startswith("train/shard_00000/media.jsonl (line 3 of media.jsonl): line 3 is not "
                                             "JSON (1 more lines like it in this shard). To fix: restore it")
