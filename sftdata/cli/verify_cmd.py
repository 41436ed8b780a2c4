"""``sftdata verify``: is a dataset intact and consistent? Exit 0 when clean, 1 when not."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Group
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from ..engine import check_engine, ray_engine
from ..errors import UsageError
from ..store.format import ROW_KINDS, is_mixture_file
from ..util.progress import LazyProgress
from ..verify import VerifyReport, verify
from ..verify.drift import versions
from ..verify.mixture import MixtureVerifyReport, verify_mixture
from .app import app, err_console, fail, handle_errors, out_console, print_json
from .options import DatasetOrMixtureArg, JsonOpt, QuietOpt, RayAddressOpt, TokenDtypeOpt, dataset_dir, flat_token_dtype
from .terminal import one_line

STATUS = {"ok": ("✓ ok", "green"), "failed": ("✗ failed", "bold red"), "skipped": ("– skipped", "dim")}

QuickOpt = Annotated[bool, typer.Option("--quick", metavar="", help="Skip the checksums (every other check still "
                                        "runs; file sizes are still compared with the metadata).")]
SourcesOpt = Annotated[bool, typer.Option("--sources", metavar="", help="Also re-hash the input files the metadata "
                                          "records (path, bytes, sha256) and say whether the dataset can be "
                                          "reproduced from them. Without it no input file is read.")]
RetokenizeOpt = Annotated[int, typer.Option("--retokenize", metavar="N", min=0, help="Sample N episodes (the same "
                                            "sample every run) and render their input records again with the "
                                            "tokenizer and template libraries installed now (drift): a record whose "
                                            "ids differ is a problem naming it (file:line) and the library versions "
                                            "then and now. With a model's own tokenizer.json the episodes are also "
                                            "decoded and re-encoded by the tokenizers library. 0 (default): none.")]
EngineOpt = Annotated[str, typer.Option("--engine", metavar="ENGINE", help="local (this process) or ray (one "
                                        "task per shard on a Ray cluster reads and checks it: ids, mask, mask rule, "
                                        "checksums; needs the ray extra). The report and exit code are the same "
                                        "either way.")]
TokenizerOpt = Annotated[str | None, typer.Option(
    "--tokenizer", metavar="NAME|PATH", help="Older flat layout only (it records no tokenizer): check ids, "
                                             "EOS endings and the mask rule with this tokenizer.")]


def draw_report(r: VerifyReport) -> Group:
    t = Table(title=f"verify {one_line(r.path)}", title_justify="left", header_style="bold")
    t.add_column("check")
    t.add_column("result")
    t.add_column("what it checks", style="dim")
    for c in r.checks:
        label, style = STATUS[c.status]
        if c.status == "failed":
            label += f" ({c.problems})"
        elif c.status == "skipped" and c.note:
            label += f" ({c.note})"
        t.add_row(c.name, Text(label, style=style), c.description)
    parts: list = [t]
    for p in r.problems:
        block = Text("✗ ", style="bold red")
        block.append(f"[{p.check}] ", style="red")
        block.append(one_line(p.file), style="bold")
        if p.where:
            block.append(f" ({one_line(p.where)})")
        block.append(f"\n    {one_line(p.message)}\n")
        block.append(f"    fix: {one_line(p.fix)}", style="cyan")
        parts.append(block)
    if r.sources:
        parts.append(draw_sources(r))
    if r.retokenized and not r.retokenized.get("skipped"):
        k, d = r.retokenized["episodes"], r.retokenized["differ"]
        what = "sequence(s) of sampled rows" if r.kind in ROW_KINDS else "sampled episode(s)"
        parts.append(Text(f"retokenize: {k:,} {what} re-encoded by the tokenizers library, "
                          f"{'all equal to the stored ids' if not d else f'{d:,} differ'}",
                          style="green" if not d else "bold red"))
    if r.drift and not r.drift.get("skipped"):
        k, d, u = r.drift["episodes"], r.drift["differ"], r.drift["unread"]
        unread = f" ({u:,} more not, their input cannot be read as it was)" if u else ""
        what, stored = ("sampled row(s)", "ids and masks") if r.kind in ROW_KINDS else ("sampled episode(s)", "ids")
        parts.append(Text(f"drift: {k:,} {what} rendered again from their input records{unread}, "
                          f"{'all equal to the stored ' + stored if not d else f'{d:,} differ'}; {versions(**r.drift)}",
                          style="green" if not d else "bold red"))
    for n in r.notes:
        parts.append(Text(f"note: {n}", style="yellow"))
    mb = r.bytes_read / 1e6
    read = f"{mb:,.1f} MB" if mb >= 1 else f"{r.bytes_read:,} bytes"
    speed = mb / r.seconds if r.seconds > 0 else 0.0
    rate = f" ({speed:,.{0 if speed >= 100 else 1 if speed >= 1 else 2}f} MB/s)" if r.seconds > 0 and mb >= 1 else ""
    if r.ok:
        parts.append(Text(f"OK: no problem found; {read} checked in {r.seconds:.2f} s{rate}", style="bold green"))
    else:
        parts.append(Text(f"FAILED: {len(r.problems)} problem(s); {read} checked in {r.seconds:.2f} s",
                          style="bold red"))
    return Group(*parts)


SOURCE_STATUS = {"matches": ("✓ matches", "green"), "missing": ("✗ missing", "bold red"),
                 "changed": ("✗ changed", "bold red"), "unreadable": ("✗ unreadable", "bold red")}


def draw_sources(r: VerifyReport) -> Group:
    """The input files (--sources) and whether the dataset can be reproduced from them."""
    t = Table(title="input files (--sources)", title_justify="left", header_style="bold")
    t.add_column("path")
    t.add_column("result")
    t.add_column("bytes", justify="right")
    t.add_column("sha256 recorded", style="dim")
    for c in r.sources:
        label, style = SOURCE_STATUS[c.status]
        t.add_row(c.path, Text(label, style=style), "" if c.bytes is None else f"{c.bytes:,}", (c.sha256 or "")[:16])
    n = len(r.sources)
    if r.reproducible:
        line = Text(f"all {n} input file(s) match: the dataset can be reproduced from them", style="green")
    else:
        bad = sum(c.status != "matches" for c in r.sources)
        line = Text(f"{bad} of {n} input file(s) missing or changed: the dataset cannot be reproduced from them",
                    style="bold red")
    return Group(t, line)


def draw_mixture_report(r: MixtureVerifyReport) -> Group:
    """Each member's report, then the mixture's own checks and the verdict."""
    parts: list = []
    for name, rep in r.members:
        parts += [Text(f"member {name}", style="bold"), draw_report(rep)]
    t = Table(title=f"mixture {one_line(r.path)} (sha256 {r.sha256})", title_justify="left", header_style="bold")
    for col in ("check", "result", "what it checks"):
        t.add_column(col, style="dim" if col == "what it checks" else None)
    for name, desc, n in r.checks():
        label, style = STATUS["failed" if n else "ok"]
        t.add_row(name, Text(label + (f" ({n})" if n else ""), style=style), desc)
    parts.append(t)
    for p in r.problems:
        parts.append(Text("✗ ", style="bold red") + Text(f"[{p.check}] {one_line(p.file)} ({one_line(p.where)})\n    "
                                                          f"{one_line(p.message)}\n", style="red")
                     + Text(f"    fix: {one_line(p.fix)}", style="cyan"))
    bad = sum(not rep.ok for _, rep in r.members)
    verdict = (Text(f"OK: the mixture and its {len(r.members)} member(s) are intact", style="bold green") if r.ok else
               Text(f"FAILED: {len(r.problems)} mixture problem(s), {bad} member(s) with problems", style="bold red"))
    parts.append(verdict)
    return Group(*parts)


@app.command("verify")
@handle_errors
def verify_cmd(
    path: DatasetOrMixtureArg,
    quick: QuickOpt = False,
    token_dtype: TokenDtypeOpt = None,
    tokenizer: TokenizerOpt = None,
    sources: SourcesOpt = False,
    retokenize: RetokenizeOpt = 0,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Check a dataset is intact and consistent; exit code 0 when clean, 1 when not.

    Files, sizes, counts, the episode index (packed: rows and segments), EOS endings, token
    ids, the loss mask against the mask rule, the metadata against the tokenizer state and the
    data, and sha256 checksums. Every problem names the file, the episode or byte offset, what
    is wrong and what to do (docs/AUDIT.md).

    Examples:

    * `sftdata verify data/chat_sft`
    * `sftdata verify data/chat_sft --quick` (no checksums)
    * `sftdata verify data/chat_sft --sources` (are the input files unchanged?)
    * `sftdata verify data/llama --retokenize 200` (render 200 sampled records again with today's libraries)
    * `sftdata verify data/chat_sft --json | jq .ok` (exit code 1 when a problem was found)
    * `sftdata verify data/mix.json` (a mixture: every member, and that none changed since it was made)
    * `sftdata verify /shared/sft --engine ray` (one task per shard on a Ray cluster; docs/SCALE.md)
    """
    executor = ray_engine(ray_address) if check_engine(engine) == "ray" else None
    if ray_address is not None and executor is None:
        raise UsageError("--ray-address needs --engine ray")
    mixture = is_mixture_file(path)
    if mixture and (token_dtype is not None or tokenizer is not None):
        raise UsageError("--token-dtype and --tokenizer are for older flat layouts, not for a mixture")
    if mixture and retokenize:
        raise UsageError("--retokenize applies to one dataset: give a member folder of the mixture")
    if not mixture:
        path = dataset_dir(path)
    token_dtype = flat_token_dtype(token_dtype)
    bar = Progress(TextColumn("[bold]verify"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeElapsedColumn(), console=err_console, disable=quiet or as_json, transient=True)
    with LazyProgress(bar) as lazy:
        step = lambda done, total: lazy.update("verify", completed=done, total=total)
        if mixture:
            report = verify_mixture(path, quick=quick, sources=sources, progress=step, executor=executor)
        else:
            rerender = None
            if retokenize:
                from ..prepare.rerender import rerender_records  # lazy: the build pipeline loads for --retokenize

                rerender = rerender_records
            report = verify(path, quick=quick, token_dtype=token_dtype, tokenizer=tokenizer, sources=sources,
                            retokenize_episodes=retokenize, progress=step, executor=executor, rerender=rerender)
    if as_json:
        print_json(report.as_dict())
    elif quiet:
        if not report.ok:
            raise fail(failed_line(report))
    else:
        out_console.print(draw_mixture_report(report) if mixture else draw_report(report))
    raise typer.Exit(0 if report.ok else 1)


def failed_line(r: VerifyReport | MixtureVerifyReport) -> str:
    """A failed verify in one line (--quiet): how many problems, and the first."""
    members = getattr(r, "members", [])
    problems = [*r.problems, *(p for _, rep in members for p in rep.problems)]
    return (f"{r.path}: verify found {len(problems):,} problem(s); the first: [{problems[0].check}] {problems[0]}; "
            f"`sftdata verify {r.path}` without --quiet lists them all")
