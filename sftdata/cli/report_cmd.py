"""``sftdata report``: one self-contained HTML page of a dataset (or two, compared)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from ..report import write_report
from .app import after_writing, app, handle_errors, out_console, print_json
from .options import DatasetArg, JsonOpt, QuietOpt, TokenDtypeOpt, dataset_dir, flat_token_dtype

OutputOpt = Annotated[Path, typer.Option("--output", "-o", metavar="FILE", show_default=False, help="The HTML file "
                                         "to write (replaced when it is a report sftdata wrote; never another file).")]
CompareOpt = Annotated[Path | None, typer.Option("--compare", metavar="OTHER", show_default=False, help="A second "
                                                 "dataset of the same kind: plots overlaid, figures side by side.")]
SplitOpt = Annotated[str, typer.Option("--split", metavar="NAME", help="train or val: the split the samples come "
                                       "from (and, with --compare, the split plotted).")]
SampleOpt = Annotated[int, typer.Option("--sample", metavar="K", help="Episodes (packed: rows) of --split drawn at "
                                        "random and shown token by token.")]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="N", help="Seed of --sample.")]
EpisodeOpt = Annotated[list[int] | None, typer.Option(
    "--episode", "-e", metavar="ID", show_default=False, help="Also show this episode of --split (global id, as "
                                                             "inspect and replay-order print it); repeatable.")]
RowOpt = Annotated[list[int] | None, typer.Option(
    "--row", "-r", metavar="ID", show_default=False, help="Packed datasets: also show this row of --split; "
                                                         "repeatable.")]
BlockOpt = Annotated[int | None, typer.Option(
    "--block-size", metavar="B", show_default=False, help="Mark the training block size: what truncating every "
                                                         "episode to one row of B + 1 tokens would cost.")]


def command_line(path: Path, output: Path, **opts) -> str:
    """The command as a user would type it (shown in the page's footer)."""
    words = ["sftdata", "report", str(path), "-o", str(output)]
    for flag, value in opts.items():
        name = "--" + flag.replace("_", "-")
        for v in value if isinstance(value, list) else [value]:
            words += [name, str(v)]
    return shlex.join(words)


@app.command("report")
@handle_errors
def report_cmd(
    path: DatasetArg,
    output: OutputOpt,
    compare: CompareOpt = None,
    split: SplitOpt = "train",
    sample: SampleOpt = 8,
    seed: SeedOpt = 0,
    episode: EpisodeOpt = None,
    row: RowOpt = None,
    block_size: BlockOpt = None,
    token_dtype: TokenDtypeOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Write one HTML page that shows a dataset: open it in a browser, send it as one file.

    Overview, plots (lengths, trained tokens, turns, trained share vs length, per input
    file, what truncation would cost; packed: fill and segments per row), rejected records
    with examples, and sample episodes token by token with the trained text highlighted.
    Works offline: the plots' script is inside the page. Needs the report extra: `pip
    install 'sftdata[report]'`. See docs/REPORT.md.

    Examples:

    * `sftdata report data/chat_sft -o report.html`
    * `sftdata report data/chat_sft -o report.html --block-size 2048 --sample 20 --episode 7`
    * `sftdata report data/chat_sft_packed -o packed.html` (rows, segments, fill)
    * `sftdata report data/a --compare data/b -o diff.html` (two datasets side by side)
    """
    path = dataset_dir(path)
    if compare is not None:
        compare = dataset_dir(compare)
    token_dtype = flat_token_dtype(token_dtype)
    given = {k: v for k, v in (("compare", compare), ("split", None if split == "train" else split),
                               ("sample", None if sample == 8 else sample), ("seed", seed or None),
                               ("episode", episode or None), ("row", row or None), ("block_size", block_size),
                               ("token_dtype", token_dtype)) if v is not None}
    summary = write_report(path, output, compare=compare, split=split, sample=sample, seed=seed, episodes=episode,
                           rows=row, block_size=block_size, token_dtype=token_dtype,
                           command=command_line(path, output, **given))
    with after_writing(summary.output):
        _show(summary, as_json, quiet)


def _show(summary, as_json: bool, quiet: bool) -> None:
    if as_json:
        print_json(summary.as_dict())
        return
    if quiet:
        return
    what = "rows" if summary.kind == "packed" else "episodes"
    line = Text(f"wrote {summary.output}", style="bold green")
    line.append(f" ({summary.bytes / 1e6:.1f} MB, {summary.plots} plots, {len(summary.samples)} sample {what}) in "
                f"{summary.seconds:.1f} s; open it in a browser")
    out_console.print(line, soft_wrap=True)
