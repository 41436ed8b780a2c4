"""The script interface shared by prepare_chat_sft.py and prepare_tool_sft.py.

A thin wrapper over the library's ``sftdata.prepare.prepare``: the same result as
``sftdata prepare-chat`` / ``sftdata prepare-tool`` with the same options, read from their
one declaration (``sftdata.options``; underscored names: ``--output_dir``, ``--val_split``),
a progress bar on stderr and a two-line summary.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from sftdata.errors import SftDataError  # noqa: E402
from sftdata.options.declared import taken_by  # noqa: E402
from sftdata.options.values import SIZE, size_bytes  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare, usable_workers  # noqa: E402
from sftdata.util.progress import LazyProgress  # noqa: E402


def _size(text: str) -> int:
    try:
        return size_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _underscored(text: str) -> str:
    """``text`` naming the scripts' flags: ``--val-split`` -> ``--val_split``."""
    return re.sub(r"--[a-z][a-z0-9-]+", lambda m: "--" + m.group()[2:].replace("-", "_"), text)


def _arguments(p: argparse.ArgumentParser, command: str) -> list:
    """The declared options of ``command`` (sftdata.options) as underscored arguments."""
    options = [o for o in taken_by(command) if o.flags and o.field]
    for o in options:
        kw = {"help": _underscored(o.help).replace("%", "%%"), "dest": o.name, "metavar": o.metavar or None}
        if o.type is bool:
            kw = {"help": kw["help"], "dest": o.name, "action": "store_true"}
        elif o.type in (list, dict):
            kw["action"] = "append"
        else:
            kw.update(type={SIZE: _size}.get(o.type, o.type), default=o.cli_value)
        p.add_argument(_underscored(o.flags[0]), **kw)
    return options


def main(argv: list[str] | None, mode: str) -> int:
    kind = "tool-calling" if mode == "tool" else "chat"
    p = argparse.ArgumentParser(description=f"Prepare a {kind} SFT dataset (same pipeline as "
                                            f"`sftdata prepare-{mode}`).")
    p.add_argument("--input", required=True, nargs="+", help="JSONL / JSON array / Parquet file(s), optionally "
                   "compressed; folders, globs, - (stdin) and URLs too (see `sftdata prepare-chat --help`)")
    p.add_argument("--output_dir", required=True, help="dataset folder to create")
    options = _arguments(p, f"prepare-{mode}")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (and no progress bar)")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    a = p.parse_args(argv)
    workers = usable_workers(a.workers, lambda message: print(f"warning: {message}", file=sys.stderr))
    try:
        values = {o.name: o.from_given(getattr(a, o.name)) for o in options}
        opts = PrepareOptions(mode=mode, **{**values, "workers": workers})
        bar = LazyProgress(Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                                    TimeElapsedColumn(), console=Console(stderr=True), disable=a.quiet or a.json))
        with bar:  # drawn from the first report on: an error raised before any work is printed alone
            s = prepare(a.input, a.output_dir, opts, progress=lambda p: bar.update(
                f"prepare-{mode}", completed=p.bytes_done, total=p.bytes_total))
    except SftDataError as e:
        print(f"error: {_underscored(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written to the output", file=sys.stderr)
        return 130
    except OSError as e:  # a path blocked by a file, no permission, a full disk
        print(f"error: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(s.as_dict(), indent=2))
        return 0
    if s.up_to_date:
        print(f"{a.output_dir}: up to date (build key {s.build_key[:12]}...); nothing to do (--force rebuilds it)")
        return 0
    print(f"wrote {a.output_dir}: " + ", ".join(f"{k} {v} episodes / {s.tokens[k]} tokens"
                                                 for k, v in s.episodes.items())
          + f"; trained-token share {s.trained_share:.1%}")
    rejected = sum(s.rejected.values())
    print(f"{s.records_read} records read, {rejected} rejected"
          + (": " + ", ".join(f"{r} {n}" for r, n in s.rejected.items()) if rejected else "")
          + (f" (see {a.output_dir}/rejects.jsonl)" if rejected else ""))
    return 0
