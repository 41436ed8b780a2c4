"""A record's media item once read and counted, and where its tokens sit in an episode: the
contract between the prepare pipeline (which makes them), the store (which writes one line
of a shard's media table per span) and verify, inspect, export and the loader (which read
the table back). Pure data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from .counts import MediaCount

IMAGE, VIDEO = "image", "video"
KINDS = (IMAGE, VIDEO)


@dataclass(frozen=True)
class MediaItem:
    """A reference read and counted: ``uri`` where its bytes came from, ``sha256`` and
    ``nbytes`` of those bytes, ``size`` (width, height) as shown (EXIF orientation applied),
    ``stored`` (width, height) as the file stores them, ``count`` what the processor makes
    of it (tokens, processed size, grid, frames)."""

    kind: str
    uri: str
    sha256: str
    nbytes: int
    size: tuple[int, int]
    stored: tuple[int, int]
    count: MediaCount


@dataclass(frozen=True)
class MediaSpan:
    """Where an item's placeholder tokens sit in an episode: ``offset`` (the first of its
    ``item.count.tokens`` placeholder tokens, counted from the episode's first token)."""

    offset: int
    item: MediaItem

    def row(self, episode: int) -> dict:
        """The span as one line of a shard's media table (``episode``: its index in the shard)."""
        c = self.item.count
        return {"episode": episode, "offset": self.offset, "tokens": c.tokens, "kind": self.item.kind,
                "uri": self.item.uri, "sha256": self.item.sha256, "bytes": self.item.nbytes,
                "size": list(self.item.size), "stored": list(self.item.stored), "processed": list(c.processed),
                "grid": list(c.grid), "frames": c.frames, "timestamps": list(c.timestamps)}


def span_from_row(row: dict) -> tuple[int, MediaSpan]:
    """A media table line back as (episode, span): the inverse of ``MediaSpan.row``."""
    count = MediaCount(int(row["tokens"]), tuple(row["processed"]), tuple(row["grid"]), int(row["frames"]),
                       tuple(row["timestamps"]))
    item = MediaItem(row["kind"], row["uri"], row["sha256"], int(row["bytes"]), tuple(row["size"]),
                     tuple(row["stored"]), count)
    return int(row["episode"]), MediaSpan(int(row["offset"]), item)
