"""The Typer app and its one registry of commands (each imported only when it runs or shows
its help), error mapping, output helpers and progress drawing (shared options: ``options``)."""

from __future__ import annotations

import copy
import errno
import functools
import importlib
import io
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated, NamedTuple

import orjson
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command_from_info

from .. import __version__
from ..errors import SftDataError
from ..util.progress import LazyProgress
from .terminal import escape_rendered, one_line


class Command(NamedTuple):
    module: str  # the module of sftdata.cli that defines the command
    help: str  # the first paragraph of the command's own help: its line in `sftdata --help`


# Every command, in the order `sftdata --help` lists them. A command's module (and the
# library it calls) is imported only when that command runs or shows its own help:
# `sftdata --help` imports no pipeline, `sftdata pack` only pack's. tests/test_cli_help.py
# checks that each ``help`` is the first paragraph of the command's own.
COMMANDS = {
    "prepare-chat": Command("prepare_cmd", "Prepare chat conversations (OpenAI `messages` or ShareGPT "
                                           "`conversations`) into a dataset."),
    "prepare-tool": Command("prepare_cmd", "Prepare tool-calling conversations (OpenAI `tools` + `tool_calls` + "
                                           "`role: tool`, or\nShareGPT/glaive `function_call` / `observation` "
                                           "turns) into a dataset."),
    "prepare-pref": Command("pref_cmd", "Prepare preference records (DPO/ORPO pairs, KTO rows) into a pair "
                                        "dataset, split in token space."),
    "prepare-rl": Command("pref_cmd", "Prepare RL prompts (GRPO) rendered with the generation prompt, every other "
                                      "column kept byte-exact."),
    "replay-order": Command("replay_cmd", "Print the episodes a training step (or a whole epoch) trained on, with "
                                          "their shard,\nlength and input record number, exactly as the loader "
                                          "ordered them."),
    "pack": Command("pack_cmd", "Pack episodes into fixed-length rows (several conversations per row) for faster "
                                "training."),
    "mix": Command("mix_cmd", "Mix prepared datasets at weights into one mixture file."),
    "export": Command("export_cmd", "Export a dataset as Parquet or JSONL for Hugging Face `datasets`, pyarrow and "
                                    "other trainers."),
    "inspect": Command("inspect_cmd", "Show what a dataset holds, or episodes (packed: rows) with their trained "
                                      "tokens."),
    "report": Command("report_cmd", "Write one HTML page that shows a dataset: open it in a browser, send it as "
                                    "one file."),
    "verify": Command("verify_cmd", "Check a dataset is intact and consistent; exit code 0 when clean, 1 when not."),
    "clean": Command("clean_cmd", "List what sftdata runs that died left below DIR, and remove it with --yes."),
}
_LISTING = "sftdata.listing"  # ctx.meta key, set while the root --help lists the commands


class _HelpTakesNoValue:
    """``--help`` / ``-h`` drawn without a value type (Typer would show ``<bool>``), like
    every other flag (metavar "")."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class _Command(_HelpTakesNoValue, TyperCommand):
    """A command of ``COMMANDS``: it runs under its ``--quiet`` and ``--json``
    (``quiet_output``), whatever its own code prints."""

    def invoke(self, ctx):
        with quiet_output(ctx.params.get("quiet", False), ctx.params.get("as_json", False)):
            return super().invoke(ctx)


class _LoadedCommands(Mapping):
    """``COMMANDS`` as click commands: every name is a key, a command's module is imported
    on first access. (Typer suggests a misspelt command from the keys.)"""

    def __init__(self, markup_mode):
        self._markup_mode = markup_mode
        self._loaded: dict = {}

    def __getitem__(self, name: str):
        if name not in COMMANDS:
            raise KeyError(name)
        if name not in self._loaded:
            importlib.import_module(f"{__package__}.{COMMANDS[name].module}")  # its decorator registers it on app
            info = copy.copy(next(c for c in app.registered_commands if c.name == name))
            info.cls = _Command
            self._loaded[name] = get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                                       rich_markup_mode=self._markup_mode)
        return self._loaded[name]

    def __iter__(self):
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class LazyGroup(_HelpTakesNoValue, TyperGroup):
    """The root command (click's lazy group): ``COMMANDS`` as its commands, its --help
    lists them from the registry alone."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.commands = _LoadedCommands(self.rich_markup_mode)

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        if name in COMMANDS and ctx.meta.get(_LISTING):
            return TyperCommand(name, help=COMMANDS[name].help)
        return super().get_command(ctx, name)

    def format_help(self, ctx, formatter) -> None:
        ctx.meta[_LISTING] = True
        try:
            super().format_help(ctx, formatter)
        finally:
            del ctx.meta[_LISTING]


HELP = """Turn chat and tool-calling conversations into training-ready SFT datasets, audit them, pack them,
and replay the training order.

A typical run (`sftdata COMMAND --help` explains each command and its options):

* `sftdata prepare-chat chats.jsonl --output-dir data/chat_sft --val-split 0.1` (or `prepare-tool`)
* `sftdata inspect data/chat_sft --episode 0` shows what is trained, `sftdata verify data/chat_sft` checks it
* `sftdata pack data/chat_sft --output-dir data/chat_sft_packed` (optional: several conversations per row)
* `sftdata mix data/chat_sft:0.8 data/tools_sft:0.2 -o data/mix.json` (optional: several datasets at weights)
* `python scripts/train.py --dataset data/chat_sft --config configs/sft/tiny.json`
* `sftdata replay-order data/chat_sft --config configs/sft/tiny.json --step 39` lists what step 39 trained on
* `sftdata report data/chat_sft -o report.html` draws the dataset on one page
* `sftdata export data/chat_sft -o exports/chat_sft` writes it as Parquet for Hugging Face datasets or pyarrow

Errors print one line (`error: ...`) and exit 1 (2 for a wrong option, 130 on Ctrl-C). Every command
takes `--json` (one JSON document on stdout, nothing else there) and `-q` (nothing printed but errors).
Docs: docs/CLI.md, FORMAT.md, TOOLS.md, TOKENIZERS.md, AUDIT.md, REPORT.md, PACKING.md, MIXTURES.md,
LOADER.md, TRAINING.md, INTEROP.md, SCALE.md."""

app = typer.Typer(
    name="sftdata",
    cls=LazyGroup,
    help=HELP,
    no_args_is_help=True,
    context_settings={"help_option_names": ["--help", "-h"]},
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # paragraphs reflow to the terminal; `code` and bullet lists render
)

PIPE_WIDTH = 200  # a pipe or a file is not a screen: no wrapping or cut columns at rich's default 80


def _console(stderr: bool = False) -> Console:
    """A terminal gets its own width; a pipe, a file or a log gets PIPE_WIDTH (unless
    COLUMNS says otherwise), so tables keep whole values and lines stay greppable."""
    # no dataset's text can drive the terminal: no markup ("[link=...]" in a file name) or emoji
    # codes read from printed strings (styles come from Text and style=), control characters escaped
    console = escape_rendered(Console(stderr=stderr, markup=False, emoji=False))
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPE_WIDTH
    return console


err_console = _console(stderr=True)
out_console = _console()

def _version(value: bool) -> None:
    if value:
        typer.echo(f"sftdata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, metavar="",
                                          help="Print the version and exit.")] = False,
) -> None:
    """sftdata: correct, reproducible SFT datasets."""
    _show_library_warnings()


def warn(message: str) -> None:
    err_console.print(Text("warning: ", style="bold yellow") + Text(one_line(message), style="yellow"), soft_wrap=True)


class _WarningsToStderr(logging.Handler):
    """The library's logged warnings (a config key that looks like a typo...) as
    ``warning: ...`` lines on stderr, never on stdout (``--json``, ``--csv``)."""

    def emit(self, record: logging.LogRecord) -> None:
        warn(record.getMessage())


def _show_library_warnings() -> None:
    log = logging.getLogger("sftdata")
    if not any(isinstance(h, _WarningsToStderr) for h in log.handlers):
        log.addHandler(_WarningsToStderr(level=logging.WARNING))


@contextmanager
def _printing(console: Console, on: bool):
    """``console`` prints (``on``) or prints nothing until the block ends."""
    quiet, console.quiet = console.quiet, not on
    try:
        yield
    finally:
        console.quiet = quiet


@contextmanager
def quiet_output(quiet: bool, as_json: bool):
    """What a command prints while it runs. ``as_json``: nothing reaches stdout but the
    document ``print_json`` writes (nothing drawn on ``out_console``). ``quiet``: nothing
    is printed but errors (``fail``) and the document --json or --csv asks for: no
    progress, table, note or warning (sftdata's logged warnings are still logged, for any
    other handler: only their printing stops), nor a library's ``warnings.warn``."""
    with ExitStack() as stack:
        if quiet or as_json:
            stack.enter_context(_printing(out_console, False))
        if quiet:
            stack.enter_context(_printing(err_console, False))
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
        yield


def fail(message: str, code: int = 1) -> typer.Exit:
    with _printing(err_console, True):  # an error is printed even under --quiet
        err_console.print(Text("error: ", style="bold red") + Text(one_line(message), style="red"), soft_wrap=True)
    return typer.Exit(code)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a job scheduler), raised like Ctrl-C so that the
    temporary folder of a dataset being written is removed on the way out."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


class ClosedStream(OSError):
    """A standard stream this command was started without (``>&-``, ``<&-``): reading or
    writing it is this error, never a crash (Python leaves ``sys.stdout`` None there)."""


class _Closed(io.TextIOBase):
    """What ``sys.stdin`` / ``sys.stdout`` are when the command was started with that stream
    closed: any read or write raises ``ClosedStream`` naming it."""

    def __init__(self, name: str, shell: str):
        self._what = f"standard {name} is closed, as with {shell}"

    def _closed(self, *args, **kw):
        raise ClosedStream(errno.EBADF, self._what)

    write = read = readline = readinto = read1 = _closed

    @property
    def buffer(self):
        return self

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def flush(self) -> None:
        pass


def plug_closed_stdio() -> None:
    """A command started with standard input, output or error closed gets ``/dev/null`` on
    that descriptor, so no file it opens (a lock, a shard) can take descriptor 0, 1 or 2 and
    receive what is printed; reading or writing a closed input or output is then
    ``ClosedStream``: one line, never an internal error."""
    for fd, name, shell in ((0, "input", "<&-"), (1, "output", ">&-"), (2, "error", "2>&-")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        plug = os.open(os.devnull, os.O_RDWR)
        if plug != fd:
            os.dup2(plug, fd)
            os.close(plug)
        if fd == 0:
            sys.stdin = _Closed(name, shell)
        elif fd == 1:
            sys.stdout = _Closed(name, shell)


@contextmanager
def after_writing(written: str | Path):
    """Printing the result of a command that has already written (committed) ``written``:
    a closed standard output costs the printout, said on stderr, never the exit code."""
    try:
        yield
    except ClosedStream as e:
        warn(f"{e.strerror}: the result was not printed; {written} was written")


_OS_HINTS = {
    errno.EACCES: "check the permissions of that path, or choose another one",
    errno.EPERM: "check the permissions of that path, or choose another one",
    errno.EROFS: "that file system is read-only: choose another path",
    errno.ENOSPC: "the disk is full: free some space, or choose another path",
    errno.EDQUOT: "the disk quota is exceeded: free some space, or choose another path",
    errno.ENOTDIR: "a part of that path is a file, not a folder: choose another path",
    errno.EISDIR: "that path is a folder; give a file",
    errno.EEXIST: "something is already there (perhaps a file where a folder is needed): choose another path",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
    errno.EFBIG: "the file is larger than this process may write (a file-size limit, ulimit -f, or the file "
                 "system's largest file): raise the limit, or choose another path",
}


def os_error_message(e: OSError) -> str:
    """``path: what the system said; what to do`` for an OSError the library did not
    turn into a typed error (a full disk mid-write, a path without permission...)."""
    if isinstance(e, ClosedStream):
        return f"{e.strerror}: nothing could be {'read' if 'input' in e.strerror else 'printed'}; run the command " \
               f"with it open (or redirected: {'< FILE' if 'input' in e.strerror else '> FILE'})"
    if e.filename and e.errno in (errno.EEXIST, errno.ENOTDIR):
        path = Path(e.filename)
        blocker = next((p for p in (path, *path.parents) if p.is_file()), None)
        if blocker is not None:
            return f"{blocker} is a file, where a folder is needed; remove it or choose another path"
    where = f"{e.filename}: " if e.filename else ""
    what = e.strerror or str(e)
    hint = _OS_HINTS.get(e.errno or 0)
    return f"{where}{what}" + (f"; {hint}" if hint else "")


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
        except BrokenPipeError:  # `sftdata ... | head`: the reader left; click ends quietly
            raise
        except OSError as e:
            raise fail(os_error_message(e), 1) from None
        except (typer.Exit, typer.Abort, typer.TyperException):  # typer's own exits and usage errors
            raise
        except Exception as e:  # a bug (or damage no check foresaw): one line, the traceback on request
            if os.environ.get("SFTDATA_DEBUG"):
                raise
            raise fail(f"internal error ({type(e).__name__}: {e}). This is a bug in sftdata: please report it "
                       f"with the command line. If a dataset is involved, `sftdata verify DATASET` may say what "
                       f"is wrong with it. SFTDATA_DEBUG=1 shows the traceback", 1) from None

    return wrapper


def print_json(obj) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    sys.stdout.flush()


def per_second(count: float, unit: str) -> str:
    """``12 records/s``, ``4,510 tokens/s``, ``38.2k tokens/s``, ``1.25M tokens/s``: a rate
    that reads at any size (never ``0.00M``)."""
    if count >= 999_950:  # from here on, k would read 1,000.0k
        return f"{count / 1e6:,.2f}M {unit}/s"
    if count >= 1e4:
        return f"{count / 1e3:,.1f}k {unit}/s"
    return f"{count:,.0f} {unit}/s"


class RateColumn(ProgressColumn):
    """records/s, and tokens/s where the task counts tokens (its ``tokens`` field is not None)."""

    def render(self, task) -> Text:
        elapsed = task.elapsed or 0.0
        if elapsed <= 0:
            return Text("")
        rate = per_second(task.fields.get("records", 0) / elapsed, "records")
        tokens = task.fields.get("tokens")
        if tokens is not None:
            rate += "  " + per_second(tokens / elapsed, "tokens")
        return Text(rate, style="cyan")


def make_progress(quiet: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(), RateColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=err_console, disable=quiet, transient=False,
    )


def rows_bar(verb: str, quiet: bool) -> tuple[LazyProgress, Callable]:
    """The progress of pack and export: ``VERB SPLIT``, a bar, rows done. Returns the bar
    (a context manager) and the callback the library calls with ``split``, ``rows_done``
    and ``rows_total``."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
               TextColumn("{task.completed:,.0f} rows"), TimeElapsedColumn())
    bar = LazyProgress(Progress(*columns, console=err_console, disable=quiet))
    return bar, lambda p: bar.update(f"{verb} {p.split}", completed=p.rows_done, total=p.rows_total)


def print_result(result, table, as_json: bool, quiet: bool, written: str | Path) -> None:
    """A command's result, once it has written ``written``: JSON on stdout with --json,
    else ``table(result)`` on stderr unless --quiet."""
    with after_writing(written):
        if as_json:
            print_json(result.as_dict())
        elif not quiet:
            err_console.print(table(result))


def main() -> None:
    plug_closed_stdio()
    signal.signal(signal.SIGTERM, _on_sigterm)
    app(prog_name="sftdata")
