"""``Problem``: one thing wrong with a dataset on disk, as data.

The reader finds the structural ones (``scan_dataset``; ``open_dataset`` raises the
first), ``verify`` adds what only a full read finds. Each names the check that found
it, the file (relative to the dataset folder), where (episode or row id, byte offset),
what is wrong and what to do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

RECREATE = "re-create the dataset with `sftdata prepare-chat` / `sftdata prepare-tool`"
REPACK = "re-create it with `sftdata pack`"


@dataclass(frozen=True)
class Problem:
    """One thing wrong: which check found it, in which file, where, what, and what to do."""

    check: str
    file: str  # relative to the dataset folder
    where: str  # "episode 12, byte 192 of episodes.idx" ... or ""
    message: str
    fix: str
    split: str | None = None
    episode: int | None = None  # global episode (packed: row) id within ``split``
    byte: int | None = None  # byte offset within ``file``
    code: str = ""  # finer kind within the check (index: out_of_bounds, overlap, gap ...)

    def __str__(self) -> str:
        loc = f"{self.file} ({self.where})" if self.where else self.file
        return f"{loc}: {self.message}. To fix: {self.fix}"

    def as_dict(self) -> dict:
        return asdict(self)


def more_like_it(n: int, what: str = "episodes") -> str:
    """A problem names the first offender in a shard; this says how many more there are."""
    return f" ({n - 1:,} more {what} like it in this shard)" if n > 1 else ""


def in_check_order(problems: list[Problem], order) -> list[Problem]:
    """``problems`` sorted by the position of their check in ``order`` (stable: within a
    check, the order they were found in)."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(problems, key=lambda p: rank[p.check])
