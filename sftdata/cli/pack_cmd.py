"""``sftdata pack``: an episodes dataset -> fixed-length packed rows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..engine import check_engine, ray_engine
from ..errors import UsageError
from ..order.batches import DEFAULT_SEED
from ..pack import PackOptions, PackReport, pack, speedup
from ..packing.block_size import KEEP_PERCENT
from ..packing.plan import DEFAULT_OVERLONG, MIN_BLOCK_SIZE
from ..storage.location import remote_url
from ..store.format import DEFAULT_SHARD_TOKENS
from .app import app, handle_errors, rows_bar
from .build_output import show_built, show_rebuild
from .options import ForceOpt, JsonOpt, OverwriteOpt, QuietOpt, RayAddressOpt, WaitOpt, dataset_dir

EngineOpt = Annotated[str, typer.Option("--engine", metavar="ENGINE", help="local (this process) or ray (the plan "
                                        "is made here; Ray tasks build the rows, each a range of whole output "
                                        "shards written straight into the output (a smaller --shard-tokens gives more "
                                        "tasks); needs the ray extra). The packed dataset is "
                                        "byte-identical either way.")]


def report_table(r: PackReport) -> Table:
    t = Table(title=f"Packed {r.source} -> {r.output_dir} ({r.strategy}, rows of {r.block_size + 1} tokens)",
              header_style="bold")
    t.add_column("")
    for split in r.splits:
        t.add_column(split, justify="right")

    def row(label, fn, style=None):
        t.add_row(label, *(fn(s) for s in r.splits.values()), style=style)

    row("episodes", lambda s: f"{s.episodes:,}")
    row("rows", lambda s: f"{s.rows:,}")
    row("fill (real tokens / capacity)", lambda s: f"{s.fill:.2%}")
    row("padding baseline: rows", lambda s: f"{s.padding_rows:,}")
    row("padding baseline: fill", lambda s: f"{s.padding_fill:.2%}")
    row("rows saved vs padding", lambda s: f"{speedup(s):.2f}x")
    row("lower bound on rows", lambda s: f"{s.lower_bound_rows:,} ({s.bound_ratio:.2%} of rows)")
    lost = any(s.trained_lost or s.tokens_lost for s in r.splits.values())
    row(f"overlong episodes (--overlong {r.overlong})", lambda s: f"{s.overlong_episodes:,}",
        "yellow" if any(s.overlong_episodes for s in r.splits.values()) else None)
    if r.strategy == "stream":
        row("injected tokens", lambda s: f"{s.tokens_injected:,}")
        row("conversations stopped", lambda s: f"{s.stopped_conversations:,}")
    row("tokens lost", lambda s: f"{s.tokens_lost:,}", "yellow" if lost else None)
    row("trained tokens", lambda s: f"{s.trained_packed:,} of {s.trained_in:,}")
    row("trained tokens lost", lambda s: f"{s.trained_lost:,} ({s.trained_lost / s.trained_in:.1%})"
        if s.trained_in else "0", "yellow" if lost else None)
    if any(s.min_block_size_99 is not None for s in r.splits.values()):
        mode = "truncate" if r.strategy == "stream" else r.overlong
        row(f"--block-size keeping {KEEP_PERCENT}% trained (bfd, {mode})",
            lambda s: "" if s.min_block_size_99 is None else f"{s.min_block_size_99:,}", "yellow")
        if r.overlong != "keep_end" or r.strategy == "stream":
            row(f"--block-size keeping {KEEP_PERCENT}% trained (bfd, keep_end)",
                lambda s: "" if s.min_block_size_99_keep_end is None else f"{s.min_block_size_99_keep_end:,}")
    return t


@app.command("pack")
@handle_errors
def pack_command(
    dataset: Annotated[Path, typer.Argument(metavar="DATASET", show_default=False, help="Episodes dataset (the "
                                            "--output-dir of prepare-chat / prepare-tool).")],
    output_dir: Annotated[Path, typer.Option("--output-dir", "-o", metavar="DIR", help="Packed dataset folder to "
                                             "create (built beside it, renamed at the end).")],
    block_size: Annotated[int, typer.Option("--block-size", "-b", metavar="N", help="Tokens per training row "
                                            "(the training config's block_size); rows hold N + 1 tokens "
                                            f"(x = row[:-1], y = row[1:]). At least {MIN_BLOCK_SIZE} (the "
                                            "smallest row that can train a reply); rows that cannot fit in memory "
                                            "are refused before any work.")] = 2048,
    strategy: Annotated[str, typer.Option("--strategy", metavar="NAME", help="bfd or stream. bfd: whole "
                                          "episodes, longest first, each into the fullest row it fits. stream: "
                                          "episodes in order cut into rows; a row starting inside a user turn "
                                          "gets the system span and <|USER|> prepended (loses more trained "
                                          "tokens, see docs/PACKING.md).")] = "bfd",
    overlong: Annotated[str, typer.Option("--overlong", metavar="MODE", help="truncate, keep_end, split or "
                                          "drop. bfd: an episode longer than a row keeps its first N + 1 tokens "
                                          "(truncate), keeps its last N + 1 tokens, the end of the conversation "
                                          "with context cut from the front (keep_end: agent data with long "
                                          "system prompts), is cut into pieces (split), or is left out (drop). "
                                          "The report counts the trained tokens lost; losing more than 1% is a "
                                          "warning naming the block size that keeps 99%.")] = DEFAULT_OVERLONG,
    pad_id: Annotated[int | None, typer.Option("--pad-id", metavar="ID", help="Padding token id (default: "
                                                  "the dataset's EOS; for a model's own tokenizer, its pad "
                                                  "token, else its EOS); its mask is 0 and it is never "
                                                  "attended.")] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="bfd: order among equal lengths and of the "
                                      "rows.")] = DEFAULT_SEED,
    shard_tokens: Annotated[int, typer.Option("--shard-tokens", metavar="N", help="Maximum tokens per shard "
                                              "(whole rows). A shard is a task of verify; 100000000 gives the "
                                              "fewer, larger shards of earlier versions.")] = DEFAULT_SHARD_TOKENS,
    overwrite: OverwriteOpt = False,
    force: ForceOpt = False,
    wait: WaitOpt = False,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Pack episodes into fixed-length rows (several conversations per row) for faster training.

    No conversation sees another (block-diagonal attention from per-row seq_ids), no
    target crosses a boundary, positions restart per conversation (position_ids), and the
    loss mask is recomputed per piece by the one mask rule. The table compares the rows
    with one-episode-per-row padding and counts every token lost (docs/PACKING.md).
    `scripts/train.py` and the loader read the packed folder as they read an episodes one.
    A pack whose train rows would train nothing (0 rows, or 0 trained tokens) is an
    error and writes nothing. With --engine ray the plan is made here and Ray tasks build
    the rows, each a range of whole shards written straight into the output (docs/SCALE.md).

    Examples:

    * `sftdata pack data/chat_sft --output-dir data/chat_sft_packed --block-size 2048`
    * `sftdata pack data/chat_sft -o data/chat_sft_packed -b 1024 --overlong split --json`
    * `sftdata pack data/tool_sft -o data/tool_sft_packed -b 2048 --overlong keep_end` (long system prompts)
    * `sftdata pack /shared/sft -o /shared/sft_packed -b 8192 --engine ray` (tasks on a Ray cluster; docs/SCALE.md)
    """
    executor = ray_engine(ray_address) if check_engine(engine) == "ray" else None
    if ray_address is not None and executor is None:
        raise UsageError("--ray-address needs --engine ray")
    checked = dataset_dir(dataset)  # a URL's copy is fetched here; pack records the URL itself as its source
    dataset = remote_url(dataset) or checked
    opts = PackOptions(block_size=block_size, strategy=strategy, overlong=overlong, pad_id=pad_id, seed=seed,
                       shard_tokens=shard_tokens, overwrite=overwrite, force=force, wait=wait)
    bar, on_progress = rows_bar("pack", quiet or as_json)
    with bar:
        report = pack(dataset, output_dir, opts, progress=on_progress, executor=executor,
                      planned=None if quiet or as_json else show_rebuild)
    show_built(report, report_table, output_dir, as_json, quiet)
