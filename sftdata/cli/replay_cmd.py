"""``sftdata replay-order``: the episodes of a training step or an epoch, and audit checks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..errors import UsageError
from ..order.batches import DEFAULT_SEED
from ..order.config import LoaderConfig
from ..replay.dataset import Replay, check_audit_log, replay_order
from ..replay.mixture import check_mixture_audit, replay_mixture
from ..store.format import is_mixture_file
from .app import app, err_console, fail, handle_errors, out_console, print_json
from .options import JsonOpt, QuietOpt, dataset_dir

TABLE_ROWS = 20  # rows drawn as a table when --head is not given
MISMATCHES_SHOWN = 10  # --check-audit lines printed (a wrong file would print one per line)


def _config(config: Path | None, seed, batch_size, min_tokens, shuffle, drop_last, batch_tokens=None,
            block_size=None) -> LoaderConfig:
    # the run's own file may hold the training script's settings too (tags this command does not use)
    cfg = LoaderConfig.from_file(config, other_tags="keep") if config is not None else LoaderConfig()
    changes = {k: v for k, v in (("epoch_seed", seed), ("batch_size", batch_size),
                                 ("episode_min_tokens", min_tokens), ("epoch_shuffle", shuffle),
                                 ("epoch_drop_last", drop_last), ("batch_tokens", batch_tokens),
                                 ("block_size", block_size)) if v is not None}
    return cfg.replace(**changes) if changes else cfg


def _write_csv(r: Replay) -> None:
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
    for chunk in r.csv_chunks():
        if out is not None:
            out.write(chunk)
        else:  # a text-only stream (tests)
            sys.stdout.write(chunk.decode())
    (out or sys.stdout).flush()


def _table(r: Replay) -> Group:
    """Title, table, then the settings line: as lines of their own, so the settings are
    not wrapped to the table's width."""
    if r.step is not None:
        title = f"step {r.step} of split {r.split} (epoch {r.epoch})" if r.sampling == "epoch" \
            else f"step {r.step} of split {r.split} (random sampling)"
    else:
        title = f"epoch {r.epoch} of split {r.split}"
    seed = f"seed {r.seed} + epoch {r.epoch} = {r.seed + r.epoch}" if r.sampling == "epoch" and r.shuffle \
        else f"seed {r.seed}" if r.sampling == "random" else "no shuffle"
    batch = f"batch {r.batch_size}" if r.batch_tokens is None else f"batches of up to {r.batch_tokens:,} tokens"
    held = (f"mixture of {', '.join(r.dataset_names)}: {r.num_eligible:,} items in epoch {r.epoch} (min "
            f"{r.episode_min_tokens} tokens)" if r.dataset_names else
            f"{r.num_eligible:,} eligible of {r.num_episodes:,} {r.items} (min {r.episode_min_tokens} tokens)")
    caption = f"{held}; {seed}; {batch} x {r.world_size} rank(s); drop_last={str(r.drop_last).lower()}"
    if r.resume_from is not None:
        caption += (f"; resumed at step {r.resume_from:,} after batch {r.from_batch_size} x {r.from_world_size} "
                    f"rank(s)")
    shown = r.shown
    if shown < r.total_rows:
        caption += f"; showing {shown:,} of {r.total_rows:,} rows (--head K, --csv for all)"
    t = Table(header_style="bold", show_edge=False, pad_edge=False)  # no edges: 9 columns fit 80 characters
    for name in r.columns:
        t.add_column(name, justify="left" if name in ("shard", "dataset") else "right", no_wrap=True)
    for row in r.rows():
        t.add_row(*("-" if v is None else str(v) for v in row.values()))
    return Group(Text(title, style="bold"), t, Text(caption, style="dim"))


def _report_audit(res, check_audit: Path, split: str, *, as_json: bool, quiet: bool) -> None:
    """``--check-audit``'s result: JSON, one line when ``--quiet`` and it differs, else OK or
    the first mismatches; exit 1 where the log differs from the replay."""
    if as_json:
        print_json(res.as_dict())
    elif quiet:
        if not res.ok:
            first = f": the first: {res.mismatches[0].message}" if res.mismatches else ""
            raise fail(f"{check_audit}: {len(res.mismatches):,} mismatch(es) with the replay of split {split} "
                       f"({res.checked} epoch_start line(s) checked){first}; without --quiet the first "
                       f"{MISMATCHES_SHOWN} are listed, --json lists them all")
    elif res.ok:
        eps = sorted(set(res.epochs))
        err_console.print(Text("OK", style="green") + Text(f": {res.checked} epoch_start line(s) of split {split} "
                                                          f"in {check_audit} (epochs {', '.join(map(str, eps))}) "
                                                          f"match the replay"))
    else:
        if res.checked == 0 and not res.mismatches:
            err_console.print(f"no epoch_start line of split {split} in {check_audit}; nothing matches",
                              style="red")
        for m in res.mismatches[:MISMATCHES_SHOWN]:
            err_console.print(Text("mismatch ", style="red") + Text(m.message), soft_wrap=True)
        if len(res.mismatches) > MISMATCHES_SHOWN:
            err_console.print(f"... and {len(res.mismatches) - MISMATCHES_SHOWN:,} more mismatches (--json lists "
                              f"them all)", style="red", markup=False)
    if not res.ok:
        raise typer.Exit(1)


# the command's options, one alias each (``replay_order_cmd`` lists them in --help's order)
DatasetArg = Annotated[Path, typer.Argument(metavar="DATASET", show_default=False, help="Dataset folder the run "
                       "trained on (episodes, or packed rows), or its mixture file (`sftdata mix`).")]
TrainingConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", metavar="FILE", help="The training config "
                              "(JSON or XML) the run used: seed, batch size, shuffle, drop_last, min tokens.")]
SeedOpt = Annotated[int | None, typer.Option("--seed", metavar="N", help="epoch_seed (overrides --config; "
                                             f"default {DEFAULT_SEED}).")]
EpochOpt = Annotated[int | None, typer.Option("--epoch", metavar="E", help="List this epoch's order (default "
                     "0). With --step, checks the step is in this epoch.")]
StepOpt = Annotated[int | None, typer.Option("--step", metavar="N", help="Global training step: 0-based count "
                    "of train batches since the start of training (the step train.py prints).")]
SplitOpt = Annotated[str, typer.Option("--split", metavar="NAME", help="train or val.")]
BatchSizeOpt = Annotated[int | None, typer.Option("--batch-size", metavar="B", help="Per-rank batch size "
                         "(overrides --config; default 8).")]
BatchTokensOpt = Annotated[int | None, typer.Option("--batch-tokens", metavar="T", help="Token-budget batches: "
                           "each rank's batch holds up to T tokens (rows x longest row) instead of --batch-size "
                           "rows (overrides --config's batch_tokens).")]
BlockSizeOpt = Annotated[int | None, typer.Option("--block-size", metavar="N", help="block_size (overrides "
                         "--config; only --batch-tokens depends on it: rows are cut at N + 1 tokens).")]
WorldSizeOpt = Annotated[int, typer.Option("--world-size", metavar="W", help="Number of ranks the run "
                                           "used (after --resume-from: the ranks it resumed on).")]
ResumeFromOpt = Annotated[int | None, typer.Option("--resume-from", metavar="STEP", help="The run was resumed at "
                          "this step on another layout (load_state_dict): steps from it on use --world-size and "
                          "--batch-size, earlier ones --from-world-size and --from-batch-size.")]
FromWorldSizeOpt = Annotated[int | None, typer.Option("--from-world-size", metavar="W", help="Ranks before "
                             "--resume-from.")]
FromBatchSizeOpt = Annotated[int | None, typer.Option("--from-batch-size", metavar="B", help="Per-rank batch "
                             "size before --resume-from (default: the batch size).")]
RankOpt = Annotated[int | None, typer.Option("--rank", metavar="R", help="Only this rank's rows (default: all "
                                             "ranks).")]
HeadOpt = Annotated[int | None, typer.Option("--head", metavar="K", help=f"Only the first K rows (default: "
                    f"all for --json/--csv, {TABLE_ROWS} for the table).")]
MinTokensOpt = Annotated[int | None, typer.Option("--min-tokens", metavar="M", help="episode_min_tokens "
                         "(overrides --config; default 2).")]
ShuffleOpt = Annotated[bool | None, typer.Option("--shuffle/--no-shuffle", metavar="", help="epoch_shuffle "
                       "(overrides --config; default shuffle).", show_default=False)]
DropLastOpt = Annotated[bool | None, typer.Option("--drop-last/--no-drop-last", metavar="", help="epoch_drop_last "
                        "(overrides --config; default drop-last).", show_default=False)]
CheckAuditOpt = Annotated[Path | None, typer.Option("--check-audit", metavar="LOG", help="Check an audit "
                          "log's epoch_start lines against the replay; exit 1 where they differ.")]
CsvOpt = Annotated[bool, typer.Option("--csv", metavar="", help="Print CSV on stdout (all rows unless "
                                      "--head).")]


@app.command("replay-order")
@handle_errors
def replay_order_cmd(
    dataset: DatasetArg,
    config: TrainingConfigOpt = None,
    seed: SeedOpt = None,
    epoch: EpochOpt = None,
    step: StepOpt = None,
    split: SplitOpt = "train",
    batch_size: BatchSizeOpt = None,
    batch_tokens: BatchTokensOpt = None,
    block_size: BlockSizeOpt = None,
    world_size: WorldSizeOpt = 1,
    resume_from: ResumeFromOpt = None,
    from_world_size: FromWorldSizeOpt = None,
    from_batch_size: FromBatchSizeOpt = None,
    rank: RankOpt = None,
    head: HeadOpt = None,
    min_tokens: MinTokensOpt = None,
    shuffle: ShuffleOpt = None,
    drop_last: DropLastOpt = None,
    check_audit: CheckAuditOpt = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Print the episodes a training step (or a whole epoch) trained on, with their shard,
    length and input record number, exactly as the loader ordered them.

    Give the config the run used (or the flags it set): the order is a function of the
    dataset, the seed, batch size, world size, shuffle, drop_last and min tokens only. A
    packed dataset lists the segments of each row. See docs/LOADER.md.

    Examples:

    * `sftdata replay-order data/chat_sft --config configs/sft/tiny.json --step 39`
    * `sftdata replay-order data/chat_sft --seed 42 --epoch 3 --head 10`
    * `sftdata replay-order data/chat_sft --config configs/sft/tiny.json --csv > epoch0.csv`
    * `sftdata replay-order data/chat_sft --config cfg.json --check-audit out/train/logs/audit/audit_x.log`
    * `sftdata replay-order data/chat_sft --config cfg.json --resume-from 1200 --world-size 16 --from-world-size 32 --step 1300`
    * `sftdata replay-order data/chat_sft --batch-tokens 16384 --block-size 2048 --step 100`
    * `sftdata replay-order data/mix.json --config cfg.json --csv` (a mixture: a dataset column names the member)
    """
    if as_json and as_csv:
        raise UsageError("give --json or --csv, not both")
    mixture = is_mixture_file(dataset)
    if mixture and seed is not None:
        raise UsageError(f"{dataset} is a mixture: its own seed orders it, so --seed does not apply (make the "
                         f"mixture with `sftdata mix --seed N` to train with another)")
    if mixture and resume_from is not None:
        raise UsageError(f"{dataset} is a mixture: --resume-from (a run resized mid-way) is not supported for a "
                         f"mixture; replay with the layout of the steps asked for")
    if not mixture:
        dataset = dataset_dir(dataset)
    cfg = _config(config, seed, batch_size, min_tokens, shuffle, drop_last, batch_tokens, block_size)
    if check_audit is not None:
        check = check_mixture_audit if mixture else check_audit_log
        _report_audit(check(dataset, cfg, check_audit, split=split, world_size=world_size), check_audit, split,
                      as_json=as_json, quiet=quiet)
        return
    if mixture:
        r = replay_mixture(dataset, cfg, split=split, epoch=epoch, step=step, rank=rank, world_size=world_size,
                           head=head if (head is not None or as_json or as_csv) else TABLE_ROWS)
    else:
        r = replay_order(dataset, cfg, split=split, epoch=epoch, step=step, rank=rank, world_size=world_size,
                         head=head if (head is not None or as_json or as_csv) else TABLE_ROWS, resume_from=resume_from,
                         from_world_size=from_world_size, from_batch_size=from_batch_size)
    if as_json:
        print_json(r.as_dict())
    elif as_csv:
        _write_csv(r)
    elif not quiet:
        out_console.print(_table(r))
