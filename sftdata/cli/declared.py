"""The build commands' Typer functions derived from the declaration (``sftdata.options``):
``declared_command`` gives prepare-chat, prepare-tool, prepare-pref and prepare-rl their
signature (INPUT..., --output-dir, each option the declaration gives the command, in its
help panel), ``--config`` and ``--json`` / ``-q``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from ..errors import UsageError
from ..options.config import read_config
from ..options.declared import taken_by
from ..options.option import IO, Option
from .options import JsonOpt, QuietOpt, declared_option

InputsArg = Annotated[list[str], typer.Argument(
    metavar="INPUT", help="JSONL (one conversation per line), a JSON array or Parquet, each optionally "
                          "compressed (.gz .bz2 .xz .zst); a folder (its .jsonl/.json/.parquet files, recursively, "
                          "sorted), a glob ('data/*.jsonl.gz'), - for stdin, or a URL (s3:// gs:// hf:// https:// "
                          "file://, with the cloud extra). Several make one dataset; record numbers continue "
                          "across them.", show_default=False)]
OutputOpt = Annotated[Path, typer.Option("--output-dir", "-o", metavar="DIR", rich_help_panel=IO,
                                          help="Dataset folder to create (written to a temporary folder beside it, "
                                               "renamed at the end).")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", metavar="FILE", rich_help_panel=IO, show_default=False,
    help="A TOML or YAML file of option values (keys: the option names, val_split or val-split); an option given "
         "on the command line overrides the file's. The options as resolved are what the dataset records.")]


def _values(ctx: typer.Context, command: str, given: dict, config: Path | None) -> tuple[dict, list[Option]]:
    """The command's options as resolved: a config file's values, then the command line's;
    and the options whose value is the file's."""
    from_file = read_config(config, command) if config is not None else {}
    out, filed = {}, []
    for o in taken_by(command):
        if not o.flags:
            continue
        if o.name in from_file and ctx.get_parameter_source(o.name).name != "COMMANDLINE":
            out[o.name] = from_file[o.name]
            filed.append(o)
        else:
            out[o.name] = o.from_given(given[o.name])
    return out, filed


def _from_file(e: UsageError, filed: list[Option], config: Path | None) -> UsageError:
    """``e`` naming the config file and key when the value it refuses is the file's: an option's
    check speaks of its flag, which the user did not type."""
    o = next((o for o in filed if any(str(e).startswith(f"{flag} ") for flag in o.flags)), None)
    return e if o is None else UsageError(f"--config {config}: {o.name}: {e}")


def declared_command(command: str, doc: str, run: Callable[..., None]) -> Callable:
    """A Typer command function for ``command``: INPUT..., --output-dir, the options the
    declaration gives it, --config, --json and -q. ``run(command, values, inputs,
    output_dir, as_json, quiet)`` gets the options as resolved (``_values``)."""
    own = [o for o in taken_by(command) if o.flags]
    required = inspect.Parameter.empty
    fixed = [("ctx", typer.Context, required), ("inputs", InputsArg, required), ("output_dir", OutputOpt, required),
             ("config", ConfigOpt, None)]
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=a, default=d) for n, a, d in fixed]
    params += [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=declared_option(o, command),
                                 default=o.cli_value) for o in own]
    params += [inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=JsonOpt, default=False),
               inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, annotation=QuietOpt, default=False)]

    def command_fn(*, ctx, inputs, output_dir, config, as_json, quiet, **given) -> None:
        values, filed = _values(ctx, command, given, config)
        try:
            run(command, values, inputs, output_dir, as_json, quiet)
        except UsageError as e:
            raise _from_file(e, filed, config) from None

    command_fn.__signature__ = inspect.Signature(params)
    command_fn.__annotations__ = {p.name: p.annotation for p in params}
    command_fn.__name__ = command.replace("-", "_")
    command_fn.__doc__ = doc
    return command_fn
