"""The rejected records of a dataset (``rejects.jsonl``), grouped by reason with a few
examples each, and counted per input file."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..records.rejects import CUT_REASON, SEAL_REASON


@dataclass
class RejectExample:
    record: int | None  # 0-based input record number
    where: str  # "file:line N" / "file:item N"
    message: str


@dataclass
class RejectGroup:
    reason: str
    count: int
    examples: list[RejectExample] = field(default_factory=list)


@dataclass
class Rejects:
    groups: list[RejectGroup]  # most frequent reason first
    by_file: dict[str, int]
    total: int
    unreadable_lines: int = 0  # lines of rejects.jsonl that are not a JSON object
    cut: str | None = None  # the closing line's words when the file lists only the first rejects


def read_rejects(path: str | Path | None, examples: int = 3) -> Rejects:
    """Group ``rejects.jsonl`` by reason (the first ``examples`` of each kept, in file
    order); a missing file gives no groups. Streams the file: a million rejects take
    about a second."""
    if path is None or not Path(path).is_file():
        return Rejects([], {}, 0)
    counts: Counter = Counter()
    files: Counter = Counter()
    shown: dict[str, list[RejectExample]] = {}
    bad, cut = 0, None
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                r = orjson.loads(line)
            except orjson.JSONDecodeError:
                r = None
            if not isinstance(r, dict):
                bad += 1
                continue
            reason = str(r.get("reason", "unknown"))
            if reason in (CUT_REASON, SEAL_REASON) and r.get("record") is None:  # a closing line, no reject
                cut = str(r.get("message", "")) if reason == CUT_REASON else cut
                continue
            counts[reason] += 1
            files[str(r.get("source", ""))] += 1
            got = shown.setdefault(reason, [])
            if len(got) < examples:
                rec = r.get("record")
                got.append(RejectExample(rec if isinstance(rec, int) else None, str(r.get("where", "")),
                                         str(r.get("message", ""))))
    groups = [RejectGroup(reason, n, shown[reason]) for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return Rejects(groups, dict(files), sum(counts.values()), bad, cut)
