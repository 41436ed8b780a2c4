"""Media spans through staging and the exact split: each shard's media.jsonl holds the spans
of its own episodes, numbered within the shard, in (episode, offset) order; its counts are
in the shard's, the split's and the dataset's records; a shard without a media item has no
table; the bytes are the same whatever the windows the staging shard is copied in."""

from __future__ import annotations

import numpy as np
import orjson

from sftdata.media.counts import MediaCount
from sftdata.media.item import MediaItem, MediaSpan, span_from_row
from sftdata.prepare import split
from sftdata.store.format import MEDIA_FILE, STAGING_SPLIT, has_media, media_count
from sftdata.store.rows import Rows, shard_media
from sftdata.store.split_writer import SplitWriter


def _item(n: int, tokens: int) -> MediaItem:
    return MediaItem("image", f"/data/img{n}.png", f"{n:064x}", 100 + n, (28 * n, 28), (28, 28 * n),
                     MediaCount(tokens, (28, 28 * n), (1, 2, 2 * n)))


def _episodes(n: int):
    """``n`` episodes of 10 + i tokens; episode i holds i % 3 images of i + 1 tokens each."""
    lengths = np.array([10 + i for i in range(n)], np.int64)
    ids = np.arange(int(lengths.sum()), dtype=np.uint32)
    mask = (ids % 2).astype(np.uint8)
    media = [tuple(MediaSpan(1 + 3 * k, _item(i * 10 + k, i + 1)) for k in range(i % 3)) for i in range(n)]
    return Rows(ids, mask, lengths, np.arange(n, dtype=np.int64), media=media)


def _table(path) -> list[dict]:
    return [orjson.loads(line) for line in (path / MEDIA_FILE).read_bytes().splitlines()]


def test_each_shard_holds_its_episodes_spans_numbered_within_it(tmp_path):
    rows = _episodes(9)
    w = SplitWriter(tmp_path, "train", np.dtype(np.uint32), 40)
    split.add_rows(w, rows)
    meta = w.close()
    seen = []
    first = 0
    for sh in meta["shards"]:
        folder = tmp_path / "train" / sh["name"]
        n = sh["episodes"]
        mine = [(e, sp) for e in range(first, first + n) for sp in rows.media[e]]
        if not mine:
            assert not (folder / MEDIA_FILE).exists() and "media" not in sh and MEDIA_FILE not in sh["files"]
        else:
            lines = _table(folder)
            assert lines == [sp.row(e - first) for e, sp in mine]
            assert [span_from_row(r) for r in lines] == [(e - first, sp) for e, sp in mine]
            assert sh["media"] == {"items": len(mine), "images": len(mine), "videos": 0,
                                   "tokens": sum(sp.item.count.tokens for _, sp in mine)}
            assert set(sh["files"]) >= {MEDIA_FILE}
            assert shard_media(folder, 0, n) == [rows.media[e] for e in range(first, first + n)]
        seen += mine
        first += n
    assert len(meta["shards"]) > 3 and len(seen) == 9
    total = {"items": 9, "images": 9, "videos": 0, "tokens": sum(sp.item.count.tokens for _, sp in seen)}
    assert meta["media"] == total and media_count([meta]) == {"media": total}


def test_rows_kept_keep_their_spans():
    rows = _episodes(6)
    keep = np.array([True, False, True, True, False, True])
    assert rows.only(keep).media == [rows.media[i] for i in (0, 2, 3, 5)]
    assert rows.without([2]).media == [rows.media[i] for i in (0, 1, 3, 4, 5)]


def _split(root, rows, is_val):
    root.mkdir()
    stage = SplitWriter(root, STAGING_SPLIT, np.dtype(np.uint32), 1 << 62)
    split.add_rows(stage, rows)
    staged = stage.close()
    return split.split_staged(root, "episodes", staged, [], is_val, np.dtype(np.uint32), True, 60)


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_exact_split_carries_each_episodes_spans_into_its_split(tmp_path, monkeypatch):
    rows = _episodes(12)
    is_val = split.split_assignment(12, 0.25, 3)
    metas = _split(tmp_path / "a", rows, is_val)
    for name, chosen in (("train", np.flatnonzero(~is_val)), ("val", np.flatnonzero(is_val))):
        got = []
        for sh in metas[name]["shards"]:
            got += shard_media(tmp_path / "a" / name / sh["name"], 0, sh["episodes"]) or [()] * sh["episodes"]
        assert got == [rows.media[i] for i in chosen]
    monkeypatch.setattr(split, "COPY_TOKENS", 7)  # one episode a window
    _split(tmp_path / "b", rows, is_val)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_a_vision_models_split_gives_every_shard_its_table(tmp_path):
    rows = _episodes(9)
    w = SplitWriter(tmp_path, "train", np.dtype(np.uint32), 12, media=True)  # one episode a shard
    split.add_rows(w, rows)
    meta = w.close()
    first, empty = 0, 0
    for sh in meta["shards"]:
        folder = tmp_path / "train" / sh["name"]
        mine = [sp for e in range(first, first + sh["episodes"]) for sp in rows.media[e]]
        assert MEDIA_FILE in sh["files"] and sh["media"]["items"] == len(mine)
        assert len((folder / MEDIA_FILE).read_bytes().splitlines()) == len(mine)
        empty += not mine
        first += sh["episodes"]
    assert empty >= 1 and meta["media"]["items"] == 9
    w = SplitWriter(tmp_path, "val", np.dtype(np.uint32), 40, media=True)  # an empty split: one empty shard
    meta = w.close()
    assert meta["media"] == {"items": 0, "images": 0, "videos": 0, "tokens": 0}
    assert (tmp_path / "val" / "shard_00000" / MEDIA_FILE).read_bytes() == b""
    assert not has_media({"media": meta["media"]}) and has_media({"media": {"items": 1}})
