"""``sftdata export``: a dataset's splits as Parquet or JSONL files for other tools."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..interop.export import ExportOptions, ExportReport, export
from .app import app, handle_errors, rows_bar
from .build_output import show_built, show_rebuild
from .options import DatasetArg, ForceOpt, JsonOpt, QuietOpt, dataset_dir


def report_table(r: ExportReport) -> Table:
    t = Table(title=f"Exported {r.dataset} -> {r.output_dir} ({r.format}, {r.kind})", header_style="bold")
    for name in ("split", "file", "rows", "tokens", "trained tokens", "size"):
        t.add_column(name, justify="left" if name in ("split", "file") else "right")
    for split, s in r.splits.items():
        size = f"{s.bytes / 1e6:,.1f} MB" if s.bytes >= 100_000 else f"{s.bytes / 1e3:,.1f} kB"
        t.add_row(split, s.file, f"{s.rows:,}", f"{s.tokens:,}", f"{s.trained_tokens:,}", size)
    t.caption = f"columns: {', '.join(r.columns)}; {r.seconds:.2f} s"
    return t


@app.command("export")
@handle_errors
def export_command(
    dataset: DatasetArg,
    output_dir: Annotated[Path, typer.Option("--output-dir", "-o", metavar="DIR", help="Folder to create with one "
                                             "file per split (train.parquet, val.parquet ...), built beside it and "
                                             "renamed at the end.")],
    fmt: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="parquet (needs pyarrow: pip install "
                                     "'sftdata[parquet]') or jsonl.")] = "parquet",
    splits: Annotated[list[str] | None, typer.Option("--split", metavar="NAME", help="Export only this split "
                                                     "(repeat for several; default: every split).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", metavar="", help="Replace an earlier export at "
                                            "--output-dir once the new one is complete (never a dataset or other "
                                            "files).")] = False,
    force: ForceOpt = False,
    media_bytes: Annotated[bool, typer.Option("--media-bytes", metavar="", help="A dataset with images: each "
                                              "image's bytes in the images column (Hugging Face's Image layout, "
                                              "{bytes, path}; read again and checked against its sha256), not only "
                                              "its uri.")] = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Export a dataset as Parquet or JSONL for Hugging Face `datasets`, pyarrow and other trainers.

    One row per episode with the columns transformers models take: input_ids, labels
    (-100 where the loss mask is 0, aligned with input_ids: the model shifts them
    itself), attention_mask, and its episode and input record number; a dataset with
    images adds images (each image's uri, or with --media-bytes its bytes). A packed dataset:
    one row per sequence of each packed row (and its row), so that no collator (TRL's
    SFTTrainer, padding-free or not, DataCollatorWithFlattening) lets two conversations
    attend to each other. Streamed in chunks of whole rows, so memory stays flat;
    written atomically; an unchanged dataset exported again with the same options is up
    to date (docs/INTEROP.md).

    Pairs (`sftdata prepare-pref`): one row per pair with TRL's tokenized columns,
    prompt_ids, chosen_ids, rejected_ids, and each completion's mask (chosen_mask,
    rejected_mask); KTO rows: completion_ids, completion_mask and label; RL prompts:
    prompt (its ids) and columns. Each row also carries row and record.

    Examples:

    * `sftdata export data/chat_sft -o exports/chat_sft`
    * `sftdata export data/chat_sft_packed -o exports/packed_jsonl --format jsonl --split train`
    """
    dataset = dataset_dir(dataset)
    opts = ExportOptions(format=fmt, splits=tuple(splits) if splits else None, overwrite=overwrite, force=force,
                         media_bytes=media_bytes)
    bar, on_progress = rows_bar("export", quiet or as_json)
    with bar:
        report = export(dataset, output_dir, opts, progress=on_progress,
                        planned=None if quiet or as_json else show_rebuild)
    show_built(report, report_table, output_dir, as_json, quiet)
