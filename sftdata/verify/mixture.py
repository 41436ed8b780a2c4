"""Verify a mixture file: each member dataset in full (``verify``), and the mixture's own
checks: every member present, unchanged since the mixture was made (its metadata's
sha256), and trainable beside the others (same tokenizer and format)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DatasetError
from ..store.format import Problem
from ..store.mixture import check_compatible, member_root, metadata_checksum, read_mixture
from ..store.reader import open_dataset
from ..tasks import Engine
from .run import ProgressFn, VerifyReport, verify

MIXTURE_CHECKS = {
    "members": "every member folder exists",
    "member_checksums": "each member's dataset_metadata.json hashes to the sha256 the mixture records",
    "compatible": "members share tokenizer, kind, format version (packed: block size, pad id)",
}
REMIX = "re-create the mixture with `sftdata mix` (a new run), or restore the member as it was"


@dataclass
class MixtureVerifyReport:
    path: str
    sha256: str
    problems: list[Problem] = field(default_factory=list)  # the mixture's own
    members: list[tuple[str, VerifyReport]] = field(default_factory=list)  # (name, report) of each member verified

    @property
    def ok(self) -> bool:
        return not self.problems and all(r.ok for _, r in self.members)

    def checks(self) -> list[tuple[str, str, int]]:
        """(name, description, problems) of each mixture check."""
        return [(k, d, sum(p.check == k for p in self.problems)) for k, d in MIXTURE_CHECKS.items()]

    def as_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "mixture_sha256": self.sha256,
                "checks": [{"name": k, "description": d, "status": "failed" if n else "ok", "problems": n}
                           for k, d, n in self.checks()],
                "problems": [p.as_dict() for p in self.problems],
                "members": [{"name": n, **r.as_dict()} for n, r in self.members]}


def verify_mixture(path: str | Path, *, quick: bool = False, sources: bool = False,
                   progress: ProgressFn | None = None, executor: Engine | None = None) -> MixtureVerifyReport:
    """Every member verified (``verify``, its shards checked by ``executor`` when given),
    then the mixture's checks; never stops at the first problem.
    Raises ``DatasetError`` only when ``path`` is not a readable mixture."""
    mixture, sha = read_mixture(path)
    rep = MixtureVerifyReport(str(path), sha)
    names, datasets = [], []
    for m in mixture.members:
        root = member_root(path, m)
        if not root.is_dir():
            rep.problems.append(Problem("members", str(root), f"member {m.name}", "the member folder does not exist "
                                        "(paths are relative to the mixture file's folder)", REMIX))
            continue
        try:
            got = metadata_checksum(root)
        except DatasetError as e:
            rep.problems.append(Problem("member_checksums", str(root), f"member {m.name}", str(e), REMIX))
            got = None
        if got is not None and got != m.metadata_sha256:
            rep.problems.append(Problem("member_checksums", str(root / "dataset_metadata.json"), f"member {m.name}",
                                        f"it hashes to {got}, the mixture recorded {m.metadata_sha256}: the dataset "
                                        f"changed since the mixture was made, so the mixture's order would differ",
                                        REMIX))
        report = verify(root, quick=quick, sources=sources, progress=progress, executor=executor)
        rep.members.append((m.name, report))
        if report.ok:
            names.append(m.name)
            datasets.append(open_dataset(root))
    if len(datasets) > 1:
        try:
            check_compatible(names, datasets, str(path))
        except DatasetError as e:
            rep.problems.append(Problem("compatible", str(path), "", str(e), "mix only datasets made with the same "
                                        "tokenizer and format"))
    return rep
