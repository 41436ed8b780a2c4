"""A shard's media table (``format.MEDIA_FILE``): one JSON line per media item, the item's
``sftdata.media.item.MediaSpan.row`` with ``episode`` its item's index in the shard (an
episode, or a packed row) and ``offset`` the item's first placeholder token counted from
that item's first token; lines in (episode, offset) order::

    {"episode": 0, "offset": 14, "tokens": 391, "kind": "image", "uri": "file:///data/cat.jpg", ...}

Read once per shard, the first time a reader asks for its spans (``Dataset.media_spans``;
the loader of a text dataset never imports this module), and checked as it is read: each
line a JSON object of exactly the row's keys and types, and the spans placed as
``structure.check_media_spans`` wants them. What is wrong is a ``Problem`` of the ``media``
check naming the line; ``verify`` reports them all, a reader refuses the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from ..errors import DatasetError
from ..media.item import KINDS, MediaSpan, span_from_row
from ..util.hashing import sha256_file
from ..util.oserrors import naming
from .format import MEDIA_FILE, RESTORE, Problem, more_like_it
from .shard import Shard
from .structure import check_media_spans

MEDIA_CHECK = "media"
SHA256_HEX = 64


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62


def _ints(v, n: int | None = None) -> bool:
    return isinstance(v, list) and (n is None or len(v) == n) and all(_count(x) for x in v)


def _sha(v) -> bool:
    return isinstance(v, str) and len(v) == SHA256_HEX and all(c in "0123456789abcdef" for c in v)


# every key of a line (MediaSpan.row) and what its value must be
FIELDS = {
    "episode": (_count, "a whole number >= 0"), "offset": (_count, "a whole number >= 0"),
    "tokens": (lambda v: _count(v) and v > 0, "a whole number >= 1"),
    "kind": (lambda v: v in KINDS, " or ".join(map(repr, KINDS))),
    "uri": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "sha256": (_sha, "64 lowercase hex digits"), "bytes": (_count, "a whole number >= 0"),
    "size": (lambda v: _ints(v, 2), "[width, height]"), "stored": (lambda v: _ints(v, 2), "[width, height]"),
    "processed": (lambda v: _ints(v, 2), "[height, width]"), "grid": (_ints, "a list of whole numbers"),
    "frames": (_count, "a whole number >= 0"),
    "timestamps": (lambda v: isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          for x in v), "a list of numbers"),
}


@dataclass
class MediaTable:
    """A shard's media table as read: the spans of each local item (only items that hold
    media appear), the columns the checks use (one entry per well-formed line: local item,
    offset, tokens, kind, its 1-based line number) and every problem found."""

    spans: dict[int, tuple[MediaSpan, ...]] = field(default_factory=dict)
    entries: list[tuple[int, MediaSpan]] = field(default_factory=list)  # (local item, span) per well-formed line
    items: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    offsets: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    kinds: list[str] = field(default_factory=list)
    lines: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    problems: list[Problem] = field(default_factory=list)


def _line_problem(shard: Shard, line: int, message: str, code: str, n: int = 1) -> Problem:
    return Problem(MEDIA_CHECK, shard.file(MEDIA_FILE), f"line {line:,} of {MEDIA_FILE}",
                   message + more_like_it(n, "lines"), RESTORE + shard.recreate, shard.split, code=code)


def _wrong(row) -> str | None:
    """What is wrong with one parsed line, or None."""
    if not isinstance(row, dict):
        return "is not a JSON object"
    keys = set(row)
    if keys != set(FIELDS):
        missing, extra = sorted(set(FIELDS) - keys), sorted(keys - set(FIELDS))
        return "has " + "; ".join(([f"no {', '.join(missing)}"] if missing else []) +
                                  ([f"unknown key(s) {', '.join(extra)}"] if extra else []))
    for key, (ok, words) in FIELDS.items():
        if not ok(row[key]):
            return f"has {key} {orjson.dumps(row[key]).decode()[:60]}, not {words}"
    return None


def read_media_table(shard: Shard) -> MediaTable:
    """The media table of ``shard``, every problem of it recorded (a missing file is one)."""
    path = shard.path / MEDIA_FILE
    table = MediaTable()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        table.problems.append(Problem("files", shard.file(MEDIA_FILE), "", f"{shard.file(MEDIA_FILE)} is missing: "
                                      "a dataset with media has a media table in every shard",
                                      RESTORE + shard.recreate, shard.split))
        return table
    rows, lines, bad = [], [], []
    for n, raw in enumerate(data.splitlines(), 1):
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError:
            bad.append((n, "is not JSON", "not_json"))
            continue
        why = _wrong(row)
        if why:
            bad.append((n, why, "bad_line"))
            continue
        rows.append(row)
        lines.append(n)
    if data and not data.endswith(b"\n"):
        bad.append((data.count(b"\n") + 1, "does not end with a newline: the file was cut", "cut"))
    if bad:
        n, why, code = bad[0]
        table.problems.append(_line_problem(shard, n, f"line {n} {why}", code, len(bad)))
    table.items = np.array([r["episode"] for r in rows], np.int64)
    table.offsets = np.array([r["offset"] for r in rows], np.int64)
    table.tokens = np.array([r["tokens"] for r in rows], np.int64)
    table.kinds = [r["kind"] for r in rows]
    table.lines = np.array(lines, np.int64)
    table.problems += check_media_spans(shard, table.items, table.offsets, table.tokens, table.lines)
    table.entries = [span_from_row(row) for row in rows]
    grouped: dict[int, list[MediaSpan]] = {}
    for item, span in table.entries:
        grouped.setdefault(item, []).append(span)
    table.spans = {k: tuple(v) for k, v in grouped.items()}
    return table


def shard_media(shard: Shard) -> MediaTable:
    """``read_media_table`` of ``shard``, read once and kept on the shard."""
    if shard.media_table is None:
        shard.media_table = read_media_table(shard)
    return shard.media_table


def item_spans(shard: Shard, local: int) -> tuple[MediaSpan, ...]:
    """The spans of local item ``local`` of ``shard``; ``DatasetError`` naming the first
    problem of its media table when it has one."""
    table = shard_media(shard)
    if table.problems:
        raise DatasetError(f"{shard.root}: {table.problems[0]}. Run `sftdata verify {shard.root}` for the full report")
    return table.spans.get(int(local), ())


def write_media_table(folder: Path, rows: list[dict]) -> dict:
    """``rows`` (``MediaSpan.row`` lines, in (item, offset) order) as the media table of the
    shard folder ``folder``; its file record for the metadata (bytes, sha256)."""
    path = folder / MEDIA_FILE
    with naming(path):
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
