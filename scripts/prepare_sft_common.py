"""The script interface shared by prepare_chat_sft.py and prepare_tool_sft.py.

A thin wrapper over the library's ``sftdata.prepare.prepare``: the same result as
``sftdata prepare-chat`` / ``sftdata prepare-tool`` with the same options (underscored
names: ``--output_dir``, ``--val_split``), a progress bar on stderr and a two-line summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from sftdata.errors import SftDataError  # noqa: E402
from sftdata.order.batches import DEFAULT_SEED  # noqa: E402
from sftdata.prepare import PrepareOptions, default_workers, prepare  # noqa: E402
from sftdata.prepare import Progress as PrepareProgress  # noqa: E402
from sftdata.sources import DEFAULT_MAX_RECORD_BYTES  # noqa: E402


def parse_size(text: str) -> int:
    """Bytes from ``67108864``, ``64M`` or ``1G`` (powers of 1024), for argparse."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        return int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give bytes or a number with K, M or G") from None


class _Bar:
    """A progress bar on stderr, drawn from the first report on (so an error raised before
    any work is printed alone)."""

    def __init__(self, label: str, quiet: bool):
        self.label = label
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), disable=quiet)
        self.task = None

    def update(self, p: PrepareProgress) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=None)
        self.progress.update(self.task, completed=p.bytes_done, total=p.bytes_total)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc) -> None:
        if self.task is not None:
            self.progress.stop()


def main(argv: list[str] | None, mode: str) -> int:
    kind = "tool-calling" if mode == "tool" else "chat"
    p = argparse.ArgumentParser(description=f"Prepare a {kind} SFT dataset (same pipeline as "
                                            f"`sftdata prepare-{mode}`).")
    p.add_argument("--input", required=True, nargs="+", help="JSONL / JSON array / Parquet file(s), optionally "
                   "compressed; folders, globs, - (stdin) and URLs too (see `sftdata prepare-chat --help`)")
    p.add_argument("--output_dir", required=True, help="dataset folder to create")
    p.add_argument("--val_split", type=float, default=0.0, help="fraction of episodes for val (default 0)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"seed of the train/val split (default {DEFAULT_SEED})")
    p.add_argument("--max_tokens", type=int, default=None, help="length filter (see docs/FORMAT.md)")
    p.add_argument("--tokenizer", default=None, help="tiktoken name or .tiktoken path (default: bundled cl100k_base)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad record")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output_dir that is not up to date")
    p.add_argument("--force", action="store_true", help="rebuild even when --output_dir is up to date")
    p.add_argument("--max_record_bytes", type=parse_size, default=DEFAULT_MAX_RECORD_BYTES,
                   help="longest record read (bytes, or 64M / 1G); longer ones are rejected as record_too_large")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (and no progress bar)")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    a = p.parse_args(argv)
    workers = a.workers or default_workers()
    if workers > default_workers():  # more processes than cores only cost memory and start-up
        print(f"warning: --workers {workers}: this machine gives it {default_workers()} core(s); using "
              f"{default_workers()}", file=sys.stderr)
        workers = default_workers()
    opts = PrepareOptions(mode=mode, val_split=a.val_split, seed=a.seed, max_tokens=a.max_tokens,
                          tokenizer=a.tokenizer, workers=workers, strict=a.strict, overwrite=a.overwrite,
                          force=a.force, max_record_bytes=a.max_record_bytes)
    try:
        with _Bar(f"prepare-{mode}", quiet=a.quiet or a.json) as bar:
            s = prepare(a.input, a.output_dir, opts, progress=bar.update)
    except SftDataError as e:
        msg = (str(e).replace("--output-dir", "--output_dir").replace("--val-split", "--val_split")
           .replace("--max-record-bytes", "--max_record_bytes"))
        print(f"error: {msg}", file=sys.stderr)
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
