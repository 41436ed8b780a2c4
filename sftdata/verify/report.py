"""What ``verify`` returns: the checks it runs, their results, and the problems found."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..store import Problem
from ..store.problems import in_check_order

_COMMON_HEAD = {
    "metadata": "metadata present, sftdata format, known version",
    "tokenizer": "tokenizer rebuilds with the recorded ranks hash",
    "files": "every file and shard present, none unlisted",
    "sizes": "file sizes agree with each other and with the metadata",
}
_COMMON_TAIL = {
    "vocab": "token ids below the vocabulary size",
    "mask_values": "mask values are 0 or 1",
}
# ordered so that the most specific problem comes first (counts are often a consequence)
CHECKS: dict[str, str] = {
    **_COMMON_HEAD,
    "index": "episodes in bounds, sorted, contiguous, non-overlapping",
    "eos": "every episode ends with <|EOS|>",
    "counts": "episode, token, trained-token counts equal the metadata",
    **_COMMON_TAIL,
    "mask_rule": "the mask is the mask rule's, re-derived from the tokens",
    "checksums": "sha256 of every file equals the metadata",
}
PACKED_CHECKS: dict[str, str] = {
    **_COMMON_HEAD,
    "rows": "whole rows of row_len tokens, one index record per row",
    "segments": "segments sorted, tiling each row from offset 0 (positions rebuild)",
    "counts": "row, segment, token, trained-token counts equal the metadata",
    "references": "segments' episodes and records agree, and match the source",
    **_COMMON_TAIL,
    "mask_rule": "the mask is the rule's per segment; 0 on injected tokens",
    "padding": "each row's tail after its segments is the padding id",
    "checksums": "sha256 of every file equals the metadata",
}

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total)


def checks_for(kind: str | None) -> dict[str, str]:
    return PACKED_CHECKS if kind == "packed" else CHECKS


@dataclass
class CheckResult:
    name: str
    description: str
    status: str  # "ok" | "failed" | "skipped"
    problems: int = 0
    note: str = ""


@dataclass
class VerifyReport:
    path: str
    layout: str | None
    kind: str | None
    quick: bool
    checks: list[CheckResult] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    splits: dict = field(default_factory=dict)  # split -> {"episodes", "tokens", "shards"}
    bytes_read: int = 0  # bytes of token/mask data checked plus bytes hashed
    bytes_hashed: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "layout": self.layout, "kind": self.kind, "quick": self.quick,
                "checks": [asdict(c) for c in self.checks], "problems": [p.as_dict() for p in self.problems],
                "notes": self.notes, "splits": self.splits, "bytes_read": self.bytes_read,
                "bytes_hashed": self.bytes_hashed, "seconds": round(self.seconds, 3)}


def check_results(kind: str | None, problems: list[Problem], skipped: dict[str, str]
                  ) -> tuple[list[Problem], list[CheckResult]]:
    """The problems in check order (the most specific first), and each check's result:
    failed when it found a problem, else skipped when it could not run (and why), else ok."""
    checks = checks_for(kind)
    problems = in_check_order(problems, checks)
    results = []
    for name, desc in checks.items():
        n = sum(p.check == name for p in problems)
        status = "failed" if n else ("skipped" if name in skipped else "ok")
        results.append(CheckResult(name, desc, status, n, skipped.get(name, "")))
    return problems, results
