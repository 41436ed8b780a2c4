"""The media tables of a packed dataset built from one with images or videos.

Each packed shard gets its media table (``store.media_table``), ``episode`` being the
packed row's index in the shard and ``offset`` the item's first placeholder counted from
the row's first token. A segment holds the tokens ``[episode_start, episode_start + length
- prefix)`` of its episode at ``offset + prefix`` of its row, so an item at ``o`` of its
episode stands at ``offset + prefix + o - episode_start`` of the row::

    episode 7:   ... <image 1: 4 tokens at 28> ...       (episode_start 0, placed at row offset 40)
    row 3:       [episode 5: 40 tokens][episode 7: its image at 40 + 28 = 68] pad pad

Written after a split's rows (whichever engine built them), from the shards' segment
records and the source's tables: the same bytes for the same rows. A span is never cut:
a plan that would cut one (``--overlong truncate/split/keep_end`` on an episode longer
than a row, through an image) is refused by name, and stream packing (which cuts
conversations across rows and injects their context again) is refused up front.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..packing.plan import OVERLONG_POLICIES
from ..store.format import MEDIA_FILE, MEDIA_KEY, decode_segments
from ..store.media_table import write_media_table
from ..store.reader import Dataset
from ..store.shard import Shard

COUNTS = ("items", "images", "videos", "tokens")


def refuse_stream(ds: Dataset, strategy: str) -> None:
    """Stream packing cuts conversations across rows: refused for a dataset with media."""
    if ds.has_media and strategy == "stream":
        raise UsageError(f"{ds.root} holds images or videos: stream packing cuts conversations across rows and "
                         "injects their context again, which would cut or repeat a media item; use --strategy bfd")


def _counts(rows: list[dict]) -> dict:
    return {"items": len(rows), "images": sum(r["kind"] == "image" for r in rows),
            "videos": sum(r["kind"] == "video" for r in rows), "tokens": sum(r["tokens"] for r in rows)}


def _cut(split: str, episode: int, span, lo: int, hi: int) -> UsageError:
    ways = ", ".join(p for p in OVERLONG_POLICIES if p != "drop")
    return UsageError(f"episode {episode} of split {split} is longer than a row, and the part of it a row keeps "
                      f"(tokens [{lo:,}, {hi:,})) cuts its {span.item.kind} at tokens [{span.offset:,}, "
                      f"{span.offset + span.item.count.tokens:,}): a media item is never cut. Use --overlong drop, "
                      f"or a --block-size of at least the episode's length (--overlong {ways} cut episodes)")


def shard_rows(ds: Dataset, split: str, shard: Shard) -> list[dict]:
    """The media table lines of one packed shard (``shard``) of rows built from ``ds``'s ``split``."""
    if shard.segments is None or not shard.segments.shape[0]:
        return []
    seg = decode_segments(np.asarray(shard.segments))
    out = []
    for k in range(len(seg)):
        spans = ds.media_spans(split, int(seg.episode[k]))
        if not spans:
            continue
        lo = int(seg.episode_start[k])
        hi = lo + int(seg.length[k] - seg.prefix[k])
        base = int(seg.offset[k] + seg.prefix[k])
        for s in spans:
            end = s.offset + s.item.count.tokens
            if end <= lo or s.offset >= hi:
                continue
            if s.offset < lo or end > hi:
                raise _cut(split, int(seg.episode[k]), s, lo, hi)
            out.append(replace(s, offset=base + s.offset - lo).row(int(seg.row[k])))
    return out


def write_split_media(ds: Dataset, split: str, folder: Path, split_meta: dict) -> dict:
    """Every packed shard of ``split`` (in ``folder``, as ``split_meta`` lists them) given its
    media table, listed with its size and sha256 and counted in the shard's and the split's
    records; returns the split's counts."""
    total = dict.fromkeys(COUNTS, 0)
    for rec in split_meta["shards"]:
        shard = Shard(folder / rec["name"], ds.token_dtype, packed=True)
        rows = shard_rows(ds, split, shard)
        rec.setdefault("files", {})[MEDIA_FILE] = write_media_table(shard.path, rows)
        rec[MEDIA_KEY] = _counts(rows)
        for k in COUNTS:
            total[k] += rec[MEDIA_KEY][k]
    split_meta[MEDIA_KEY] = total
    return total
