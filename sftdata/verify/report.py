"""What ``verify`` returns: the checks it runs, their results, and the problems found."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..store import Problem
from ..store.format import in_check_order
from .sources import SourceCheck

_COMMON_HEAD = {
    "metadata": "metadata present, sftdata format, known version",
    "metadata_checksum": "metadata unedited: it hashes to the sha256 it records",
    "tokenizer": "tokenizer rebuilds with the recorded hash (ranks, or tokenizer.json) and is the metadata's",
    "files": "every file and shard present, none unlisted",
    "sizes": "file sizes agree with each other and with the metadata",
}
_COMMON_TAIL = {
    "vocab": "token ids below the vocabulary size",
    "mask_values": "mask values are 0 or 1",
    "ranges": "recorded token id and mask value ranges possible and equal to the data",
}
_STOPS = {
    "stops": "every trained reply ends with a trained stop id; the pad id is never trained and no stop id",
    "serving": "serving.json matches the tokenizer state and the data (stop ids, pad id, BOS, template)",
}
# run only when asked (``verify(sources=True)``, ``verify --sources``): it reads the input files
SOURCES_CHECK = {"sources": "input files recorded in the metadata present and unchanged"}
# ordered so that the most specific problem comes first (counts are often a consequence)
CHECKS: dict[str, str] = {
    **_COMMON_HEAD,
    "index": "episodes in bounds, sorted, contiguous, non-overlapping",
    "eos": "every episode ends with <|EOS|>",
    "counts": "episode, token, trained-token counts equal the metadata",
    **_COMMON_TAIL,
    "mask_rule": "the mask is the mask rule's, re-derived from the tokens",
    **_STOPS,
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
    **_STOPS,
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
    sources: list[SourceCheck] | None = None  # the recorded input files, when asked (--sources)
    reproducible: bool | None = None  # every input file matches (None: not asked, or none recorded)
    retokenized: dict | None = None  # --retokenize N: episodes re-encoded by the tokenizers library, how many differ
    cannot_stop: dict = field(default_factory=dict)  # split -> {"count", "episodes" (packed: "rows"): first ids}

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "layout": self.layout, "kind": self.kind, "quick": self.quick,
                "checks": [asdict(c) for c in self.checks], "problems": [p.as_dict() for p in self.problems],
                "notes": self.notes, "splits": self.splits, "bytes_read": self.bytes_read,
                "bytes_hashed": self.bytes_hashed, "seconds": round(self.seconds, 3),
                "sources": None if self.sources is None else [c.as_dict() for c in self.sources],
                "reproducible": self.reproducible, "cannot_stop": self.cannot_stop, "retokenized": self.retokenized}


def check_results(kind: str | None, problems: list[Problem], skipped: dict[str, str], extra: dict | None = None
                  ) -> tuple[list[Problem], list[CheckResult]]:
    """The problems in check order (the most specific first), and each check's result:
    failed when it found a problem, else skipped when it could not run (and why), else ok.
    ``extra``: checks run on request (``SOURCES_CHECK``), after the others."""
    checks = {**checks_for(kind), **(extra or {})}
    problems = in_check_order(problems, checks)
    results = []
    for name, desc in checks.items():
        n = sum(p.check == name for p in problems)
        status = "failed" if n else ("skipped" if name in skipped else "ok")
        results.append(CheckResult(name, desc, status, n, skipped.get(name, "")))
    return problems, results
