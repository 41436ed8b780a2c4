"""``sftdata clean``: list, and with --yes remove, what runs that died left behind."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..storage.leftovers import CleanReport, clean
from ..storage.lock import OWNER_FILE
from ..util.memory import human
from .app import after_writing, app, err_console, handle_errors, print_json
from .options import JsonOpt, QuietOpt

STATE_STYLE = {"stale": "yellow", "live": "green", "unknown": "dim"}
STATE_TEXT = {"stale": "stale", "live": "in use", "unknown": "unknown (kept)"}


def _owner(d: dict) -> str:
    if d["pid"] is None:
        return "no owner record"
    return f"pid {d['pid']} on {d['host']}" + (f", started {d['started']}" if d["started"] else "")


def leftovers_table(r: CleanReport) -> Table:
    t = Table(title=f"Left by sftdata below {r.root}", title_justify="left", header_style="bold")
    for col in ("state", "kind", "path", "size", "owner"):
        t.add_column(col, justify="right" if col == "size" else "left")
    for x in r.leftovers:
        d = x.as_dict()
        state = "removed" if x.removed else STATE_TEXT[x.state]
        t.add_row(state, x.kind, str(x.path), human(x.bytes), _owner(d), style=STATE_STYLE[x.state])
    return t


def summary_line(r: CleanReport) -> str:
    stale, live, unknown = r.of_state("stale"), r.of_state("live"), r.of_state("unknown")
    if not r.leftovers:
        return f"nothing left behind by sftdata below {r.root}"
    kept = ", ".join(f"{len(v)} {k}" for k, v in (("in use", live), ("unknown", unknown)) if v)
    kept = f"; kept {kept}" if kept else ""
    if not stale:
        return f"no stale leftover below {r.root}{kept}"
    size = human(sum(x.bytes for x in stale))
    if not r.remove:
        return f"{len(stale)} stale leftover(s), {size}; remove them with `sftdata clean {r.root} --yes`{kept}"
    removed = [x for x in stale if x.removed]
    gone = f"removed {len(removed)} stale leftover(s), {human(r.freed_bytes)} freed"
    if len(removed) < len(stale):
        gone += f" ({len(stale) - len(removed)} came back into use or could not be removed, and were kept)"
    return gone + kept


def orphan_lines(r: CleanReport) -> list[str]:
    """A replaced dataset whose replacement never arrived may be the only copy: say how
    to put it back (clean never removes it)."""
    out = []
    for x in r.leftovers:
        if x.kind == "replaced" and x.state == "unknown" and not x.target.exists():
            record = x.path / OWNER_FILE
            undo = f" && rm {x.target / OWNER_FILE}" if record.is_file() else ""
            out.append(f"{x.path} holds the dataset that --overwrite was replacing when its run died, and "
                       f"{x.target} is not a complete dataset: check it, then move it back with "
                       f"`mv {x.path} {x.target}{undo}`")
    return out


@app.command("clean")
@handle_errors
def clean_command(
    folder: Annotated[Path, typer.Argument(metavar="DIR", show_default=False, help="Folder to search, with every "
                                           "folder below it (symbolic links are not followed).")],
    yes: Annotated[bool, typer.Option("--yes", "-y", metavar="", help="Remove the stale leftovers (without it, "
                                      "they are only listed).")] = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """List what sftdata runs that died left below DIR, and remove it with --yes.

    A run builds its dataset in a hidden staging folder beside the output
    (`.NAME.tmp-PID-...`) and holds a lock file beside it (`.NAME.sftdata-lock`); a run
    killed by the system or by `kill -9` leaves them behind. Only what sftdata provably
    made is a leftover: a folder holding sftdata's owner record, or named in the record
    of a lock file it left; a folder without one is yours, whatever its name, and is never
    listed. Each record names its owner process: a leftover whose owner is dead is stale
    and removed with --yes; one whose owner runs (a run in progress) is never touched, nor
    one whose owner cannot be told (another machine). The next run to the same output
    removes that output's stale leftovers itself. A run killed while removing the dataset
    --overwrite replaced leaves it half-removed (kind replaced): it is stale once a
    complete dataset stands at NAME (only the files its metadata lists are removed, the
    metadata last), and kept, with how to move it back, when NAME is missing. DIR itself
    must not be a symbolic link.

    Examples:

    * `sftdata clean data` (lists; removes nothing)
    * `sftdata clean data --yes` (removes the stale ones)
    * `sftdata clean . --json` (a JSON list for scripts)
    """
    report = clean(folder, remove=yes)
    with after_writing(folder) if yes else nullcontext():  # --yes removed what it found: a closed output costs the list
        _show(report, as_json, quiet)


def _show(report: CleanReport, as_json: bool, quiet: bool) -> None:
    if as_json:
        print_json(report.as_dict())
    elif not quiet:
        if report.leftovers:
            err_console.print(leftovers_table(report))
        err_console.print(summary_line(report), soft_wrap=True)
        for line in orphan_lines(report):
            err_console.print(line, soft_wrap=True)
