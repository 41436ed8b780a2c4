"""What prepare, pack and export say about their build key (docs/CLI.md, "Up to date"): a target
that is up to date, and why one is rebuilt."""

from __future__ import annotations

from rich.text import Text

from ..store.build_key import BuildCheck
from .app import after_writing, err_console, print_json, print_result, warn


def show_rebuild(check: BuildCheck) -> None:
    """``rebuilding DIR: what changed; ...`` on stderr, before the work (nothing for a new target)."""
    if check.changes:
        err_console.print(Text(f"rebuilding {check.target.location}: " + "; ".join(check.changes), style="cyan"),
                          soft_wrap=True)


def show_up_to_date(output_dir: str, key: str | None, libraries_changed: list[str]) -> None:
    """``DIR: up to date (build key 3f9a...)`` on stderr, and a warning when the libraries
    that made it are not the ones installed now."""
    err_console.print(Text(f"{output_dir}: up to date (build key {(key or '')[:12]}...); nothing to do (--force "
                           f"rebuilds it)", style="green"), soft_wrap=True)
    if libraries_changed:
        warn(f"{output_dir} was made with other library versions ({'; '.join(libraries_changed)}): "
             f"`sftdata verify {output_dir} --retokenize 200` checks that they still render and encode it alike")


def show_prepared(summary, table, output_dir, as_json: bool, quiet: bool) -> bool:
    """A prepare command's result: its ``--json``, the up-to-date line, or the ``table`` of
    ``summary`` and where its rejects are. True where the command may add notes of its own
    (a build that ran, not ``--quiet``)."""
    if as_json:
        with after_writing(output_dir):
            print_json(summary.as_dict())
        return False
    if summary.up_to_date:
        if not quiet:
            show_up_to_date(summary.output_dir, summary.build_key, summary.libraries_changed)
        return False
    if quiet:
        return False
    err_console.print(table(summary))
    if summary.rejected:
        err_console.print(f"rejected records and their reasons: {summary.output_dir}/rejects.jsonl", style="yellow")
    return True


def show_built(report, table, output_dir, as_json: bool, quiet: bool) -> None:
    """pack's and export's result: the up-to-date line (unless ``--json`` or ``--quiet``),
    else the report as a table or JSON (``print_result``)."""
    if report.up_to_date and not as_json:
        if not quiet:
            show_up_to_date(report.output_dir, report.build_key, [])
        return
    print_result(report, table, as_json, quiet, output_dir)
