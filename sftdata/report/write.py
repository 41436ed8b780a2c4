"""``sftdata report``: collect one dataset (or two, compared) and write the HTML page,
atomically, to a path that holds no file sftdata did not write."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import OutputExistsError, UsageError
from ..store.format import ROW_KINDS
from ..store.fsops import refuse_link
from ..store.reader import open_dataset
from ..util.oserrors import naming
from .collect import dataset_report
from .html import GENERATOR, render_page
from .plots import plotly_go
from .samples import TOKEN_BUDGET


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


def is_report(path: Path) -> bool:
    """True when ``path`` is a page this command wrote (its generator tag is in its head)."""
    try:
        with open(path, "rb") as f:
            return GENERATOR.encode() in f.read(2048)
    except OSError:
        return False


def check_output(output: Path, datasets: list[Path]) -> None:
    """Refuse a folder, a file sftdata did not write, and a path inside a dataset (its
    folder must hold only the files its metadata lists)."""
    refuse_link(output, "give the file it points to as -o, or remove the link")
    if output.is_dir():
        raise UsageError(f"-o {output} is a folder; give the path of the HTML file to write, e.g. {output / 'report.html'}")
    if output.exists() and not is_report(output):
        raise OutputExistsError(f"{output} exists and is not a report sftdata wrote; choose another path or remove it")
    where = output.resolve().parent
    for d in datasets:
        root = d.resolve()
        if where == root or root in where.parents:
            raise UsageError(f"-o {output} is inside the dataset {d}; write the report elsewhere (a dataset folder "
                             f"holds only its own files)")


def write_report(path: str | Path, output: str | Path, *, compare: str | Path | None = None, split: str = "train",
                 sample: int = 8, seed: int = 0, episodes: list[int] | None = None, rows: list[int] | None = None,
                 block_size: int | None = None, token_dtype=None, command: str = "sftdata report") -> ReportSummary:
    """Write the report of the dataset at ``path`` (compared with ``compare``) to ``output``."""
    t0 = time.perf_counter()
    plotly_go()  # the extra is missing: say so before any work
    output = Path(output)
    check_output(output, [Path(path)] + ([Path(compare)] if compare is not None else []))
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
    data = page.encode("utf-8")
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
