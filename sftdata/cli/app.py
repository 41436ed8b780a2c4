"""The Typer app, shared options, error mapping and progress drawing."""

from __future__ import annotations

import functools
import signal
import sys
from typing import Annotated, Callable

import orjson
import typer
from rich.console import Console
from rich.progress import (BarColumn, Progress, ProgressColumn, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.text import Text

from .. import __version__
from ..errors import SftDataError

app = typer.Typer(
    name="sftdata",
    help="Turn chat and tool-calling conversations into training-ready SFT datasets, audit them, "
         "pack them, and replay the training order.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

err_console = Console(stderr=True)
out_console = Console()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON result on stdout "
                                                      "(and nothing else there).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or table on stderr.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"sftdata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """sftdata: correct, reproducible SFT datasets."""


def fail(message: str, code: int = 1) -> "typer.Exit":
    err_console.print(Text("error: ", style="bold red") + Text(message, style="red"), soft_wrap=True)
    return typer.Exit(code)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a job scheduler), raised like Ctrl-C so that the
    temporary folder of a dataset being written is removed on the way out."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def handle_errors(fn: Callable) -> Callable:
    """Map library errors to a red message and an exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SftDataError as e:
            raise fail(str(e), e.exit_code) from None
        except KeyboardInterrupt as e:
            if isinstance(e, Terminated):
                raise fail("terminated (SIGTERM); nothing was written to the output", 143) from None
            raise fail("interrupted; nothing was written to the output", 130) from None

    return wrapper


def print_json(obj) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    sys.stdout.flush()


class RateColumn(ProgressColumn):
    """records/s and tokens/s from the task's fields."""

    def render(self, task) -> Text:
        elapsed = task.elapsed or 0.0
        if elapsed <= 0:
            return Text("")
        rec = task.fields.get("records", 0) / elapsed
        tok = task.fields.get("tokens", 0) / elapsed
        return Text(f"{rec:,.0f} rec/s  {tok / 1e6:,.2f}M tok/s", style="cyan")


def make_progress(quiet: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(), RateColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=err_console, disable=quiet, transient=False,
    )


def main() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    app(prog_name="sftdata")
