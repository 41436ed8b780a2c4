"""Options shared by several commands, as ``Annotated`` aliases defined once (the help
text is part of the CLI's contract: tests/contract/), the checks of shared arguments, and
a declared option's Typer parameter (``declared_option``; sftdata.options declares them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import DatasetError, UsageError
from ..options.option import SHARED, Option
from ..options.values import SIZE, size_bytes
from ..storage.location import dataset_path
from ..store.format import TOKEN_DTYPES


def parse_size(text: str) -> int:
    """Bytes from ``67108864``, ``64M``, ``64MiB`` or ``1G`` (K, M, G are powers of 1024)."""
    try:
        return size_bytes(text)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def dataset_dir(path: Path) -> Path:
    """A command's dataset argument, checked before the library opens it, so that a file
    (often the input given by mistake) or a wrong path says what to give instead. A
    ``file://`` URL is the folder it names; an object-store URL (``s3://bucket/sft``) its
    copy in the local cache, fetched first when needed."""
    path = dataset_path(path)
    if path.is_file():
        raise DatasetError(f"{path} is a file, not a dataset folder: give the folder that `sftdata prepare-chat` / "
                           f"`prepare-tool` wrote (its --output-dir); to make one from this file: "
                           f"sftdata prepare-chat {path} --output-dir DIR")
    if not path.exists():
        raise DatasetError(f"dataset folder {path} does not exist; check the path, or make the dataset with "
                           f"`sftdata prepare-chat INPUT --output-dir {path}`")
    return path


def flat_token_dtype(value: str | None) -> str | None:
    """``--token-dtype`` of the older flat layout: uint16 or uint32 (numpy would take
    any dtype name, or fail with its own TypeError)."""
    if value is not None and value not in TOKEN_DTYPES:
        raise UsageError(f"--token-dtype must be {' or '.join(TOKEN_DTYPES)}, got {value!r}")
    return value


# metavar "": a flag takes no value, so help shows none (typer would show <bool>). Every command takes
# both, as parameters named as_json and quiet, which app.quiet_output reads (tests/cli/test_quiet_json.py).
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print the result as "
                                       "one JSON document on stdout, and nothing else there (progress and warnings "
                                       "go to stderr).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="Print nothing "
                                        "but errors and the document --json or --csv asks for: no progress bar, "
                                        "table, note or warning.")]
DatasetArg = Annotated[Path, typer.Argument(metavar="DATASET", show_default=False, help="Dataset folder (the "
                                           "--output-dir of prepare-chat, prepare-tool or pack).")]
DatasetOrMixtureArg = Annotated[Path, typer.Argument(metavar="DATASET", show_default=False, help="Dataset folder (the "
                                                     "--output-dir of prepare-chat, prepare-tool or pack), or a "
                                                     "mixture file (`sftdata mix`).")]
TokenDtypeOpt = Annotated[str | None, typer.Option("--token-dtype", metavar="DTYPE", help="Older flat layout only: "
                                                      "dtype of tokens.bin, uint16 or uint32 (default).")]


def declared_option(o: Option, command: str = "", panel: bool = True):
    """The ``Annotated`` Typer parameter of a declared option for ``command`` (in its help
    panel unless not ``panel``)."""
    base = {SIZE: int, list: list[str], dict: list[str]}.get(o.type, o.type)
    nullable = o.nullable or o.type in (list, dict) or o.cli_default is None
    extra = {"parser": parse_size} if o.type is SIZE else {}
    # a build command's flag also has its --no- form: the command line can undo a --config file's true
    no_form = o.type is bool and panel
    flags = (f"{o.flags[0]}/--no-{o.flags[0][2:]}", *o.flags[1:]) if no_form else o.flags
    return Annotated[base | None if nullable else base, typer.Option(
        *flags, metavar=o.metavar, help=o.help_for(command), show_default=False if no_form else o.show_default,
        rich_help_panel=o.panel if panel else None, **extra)]


# pack's own (no help panels there): the build commands' declaration of them
_PACK = {o.name: declared_option(o, panel=False) for o in SHARED}
OverwriteOpt, ForceOpt, WaitOpt, EngineOpt, RayAddressOpt = (_PACK[n] for n in ("overwrite", "force", "wait", "engine",
                                                                                 "ray_address"))
