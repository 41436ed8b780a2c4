"""The media columns of an export of a dataset with images or videos: ``images`` (and
``videos`` where the dataset holds any) beside ``input_ids`` / ``labels``, each row's items in
the order their placeholder tokens stand.

A cell is the item's uri (where prepare read it); with ``--media-bytes`` it is Hugging Face
``datasets``' Image layout instead, ``{"bytes", "path"}``: the bytes read again from the uri
and checked against the sha256 the media table recorded (a changed or missing file is a
``DatasetError`` naming it; JSONL holds the bytes as base64). An inline ``data:`` item's bytes
are not kept in the dataset: its cell holds ``bytes`` null, and the export says how many.
"""

from __future__ import annotations

import base64

import numpy as np

from ..errors import DatasetError
from ..media import MediaError, read_media
from ..media.item import IMAGE, VIDEO, MediaSpan
from ..store.format import MEDIA_KEY
from ..store.media_table import MediaTable, read_media_table
from ..store.reader import Dataset
from ..store.shard import Shard

COLUMNS = {IMAGE: "images", VIDEO: "videos"}


def media_columns(ds: Dataset) -> list[str]:
    """The media columns of an export of ``ds``: none for a text dataset; ``images``, and
    ``videos`` where the metadata counts a video."""
    if not ds.has_media:
        return []
    videos = ((ds.metadata or {}).get(MEDIA_KEY) or {}).get("videos")
    return [COLUMNS[IMAGE]] + ([COLUMNS[VIDEO]] if videos else [])


class MediaCells:
    """Each exported row's media cells: ``rows(shard, items, windows)``."""

    def __init__(self, columns: list[str], with_bytes: bool, jsonl: bool):
        self.columns = columns
        self.with_bytes = with_bytes
        self.jsonl = jsonl
        self.inline = 0  # data: items whose bytes are not kept
        self._table: tuple[str, MediaTable] | None = None  # the table of the shard being exported (one at a time)

    def spans(self, shard: Shard, item: int) -> tuple[MediaSpan, ...]:
        """The spans of local item ``item`` of ``shard``; its table is read once and kept until
        the next shard (memory stays one shard's table), a damaged one refused by name."""
        if self._table is None or self._table[0] != shard.rel:
            table = read_media_table(shard)
            if table.problems:
                raise DatasetError(f"{shard.root}: {table.problems[0]}. Run `sftdata verify {shard.root}` for the "
                                   "full report")
            self._table = (shard.rel, table)
        return self._table[1].spans.get(int(item), ())

    def cell(self, span: MediaSpan):
        item = span.item
        if not self.with_bytes:
            return item.uri
        if item.uri.startswith("data:"):
            self.inline += 1
            return {"bytes": None, "path": None}
        try:
            got = read_media(item.uri)
        except MediaError as e:
            raise DatasetError(f"--media-bytes: {item.uri} cannot be read again ({e.reason}: {e.detail}); restore it, "
                               "or export without --media-bytes (the uris)") from None
        if got.sha256 != item.sha256:
            raise DatasetError(f"--media-bytes: {item.uri} has sha256 {got.sha256[:16]}..., the dataset recorded "
                               f"{item.sha256[:16]}...: it changed since prepare read it; restore it, or prepare "
                               "again")
        data = base64.b64encode(got.data).decode("ascii") if self.jsonl else got.data
        return {"bytes": data, "path": item.uri}

    def rows(self, shard: Shard, items: np.ndarray, windows: np.ndarray | None = None) -> dict[str, list[list]]:
        """The cells of each exported row: local item ``items[k]`` of ``shard`` (an episode, or a
        packed row), and with ``windows`` only the spans inside ``[windows[k, 0], windows[k, 1])``
        of it (a packed row's segment), in token order."""
        out: dict[str, list[list]] = {c: [] for c in self.columns}
        for k, item in enumerate(items.tolist()):
            spans = self.spans(shard, item)
            if windows is not None:
                a, b = int(windows[k, 0]), int(windows[k, 1])
                spans = tuple(s for s in spans if a <= s.offset < b)
            for kind, column in COLUMNS.items():
                if column in out:
                    out[column].append([self.cell(s) for s in spans if s.item.kind == kind])
        return out

    def note(self) -> list[str]:
        return [f"--media-bytes: {self.inline:,} inline data: item(s) have no bytes in the dataset (bytes null)"] \
            if self.inline else []


def parquet_type(pa, with_bytes: bool):
    """A media column's Parquet type: a list of uris, or of Hugging Face's Image struct."""
    if with_bytes:
        return pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    return pa.list_(pa.string())
