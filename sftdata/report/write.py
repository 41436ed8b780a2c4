"""``sftdata report``: collect one dataset (or two, compared) and write the HTML page,
atomically, to a path that holds no file sftdata did not write: a file there is replaced
only when it is a page sftdata wrote, unchanged (its last line records its sha256)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import OutputExistsError, UsageError
from ..storage.fsops import refuse_link
from ..store.format import ROW_KINDS, dataset_holding
from ..store.reader import open_dataset
from ..util.oserrors import naming
from .collect import dataset_report
from .html import GENERATOR, render_page
from .plots import plotly_go
from .samples import TOKEN_BUDGET

SEAL = b"<!-- sftdata report sha256 "  # the page's last line: SEAL, the sha256 of the bytes before it, SEAL_END
SEAL_END = b" -->\n"
MAX_REPORT_BYTES = 1 << 30  # a larger file is not a page sftdata wrote


@dataclass
class ReportSummary:
    output: str
    bytes: int
    seconds: float
    dataset: str
    compare: str | None
    kind: str
    plots: int
    samples: list[dict] = field(default_factory=list)  # {"split", "episode"} (packed: "row") of each drawn sample

    def as_dict(self) -> dict:
        return asdict(self)


def seal(page: bytes) -> bytes:
    """``page`` with its last line recording the sha256 of everything before it: how a
    page sftdata wrote, unchanged since, is told from any other file (``is_report``)."""
    return page + SEAL + hashlib.sha256(page).hexdigest().encode() + SEAL_END


def is_report(path: Path) -> bool:
    """True when ``path`` is a page this command wrote and nobody changed since: its
    generator tag in its head, and its last line the sha256 of everything before it. A
    file merely carrying the tag (a copy edited, a page of the user's) is not one."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_REPORT_BYTES:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    body, sep, tail = data.rpartition(SEAL)
    return bool(sep) and GENERATOR.encode() in body[:2048] and \
        tail == hashlib.sha256(body).hexdigest().encode() + SEAL_END


def check_output(output: Path) -> None:
    """Refuse a folder, a file sftdata did not write, and a path inside a dataset (its
    folder must hold only the files its metadata lists)."""
    refuse_link(output, "give the file it points to as -o, or remove the link")
    if output.is_dir():
        raise UsageError(f"-o {output} is a folder; give the path of the HTML file to write, e.g. {output / 'report.html'}")
    if output.exists() and not is_report(output):
        raise OutputExistsError(f"{output} exists and is not a report sftdata wrote; choose another path or remove it")
    inside = dataset_holding(output)
    if inside is not None:
        raise UsageError(f"-o {output} is inside the dataset {inside}; write the report elsewhere (a dataset folder "
                         f"holds only its own files)")


def write_report(path: str | Path, output: str | Path, *, compare: str | Path | None = None, split: str = "train",
                 sample: int = 8, seed: int = 0, episodes: list[int] | None = None, rows: list[int] | None = None,
                 block_size: int | None = None, token_dtype=None, command: str = "sftdata report") -> ReportSummary:
    """Write the report of the dataset at ``path`` (compared with ``compare``) to ``output``."""
    t0 = time.perf_counter()
    plotly_go()  # the extra is missing: say so before any work
    output = Path(output)
    check_output(output)
    share = TOKEN_BUDGET // (1 if compare is None else 2)  # the page's samples draw TOKEN_BUDGET tokens in all
    reports = [dataset_report(path, split=split, sample=sample, seed=seed, episodes=episodes, rows=rows,
                              block_size=block_size, token_dtype=token_dtype, token_budget=share)]
    if compare is not None:
        kind = open_dataset(compare, token_dtype=token_dtype).kind
        if kind != reports[0].overview.kind:
            raise UsageError(f"--compare needs two datasets of one kind: {path} is {reports[0].overview.kind}, "
                             f"{compare} is {kind}")
        reports.append(dataset_report(compare, split=split, sample=sample, seed=seed, block_size=block_size,
                                      token_dtype=token_dtype, token_budget=share))
    page, plots = render_page(reports, command)
    data = seal(page.encode("utf-8"))
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    try:
        with naming(tmp, f"while writing {output}"), os.fdopen(fd, "wb") as f:  # a full disk names the file
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    key = "row" if reports[0].packed or reports[0].overview.kind in ROW_KINDS else "episode"
    drawn = [{"split": s.split, key: getattr(s, key)} for s in reports[0].samples]
    return ReportSummary(output=str(output), bytes=len(data), seconds=round(time.perf_counter() - t0, 3),
                         dataset=str(path), compare=None if compare is None else str(compare),
                         kind=reports[0].overview.kind, plots=plots, samples=drawn)
