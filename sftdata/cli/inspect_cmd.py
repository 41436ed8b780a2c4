"""``sftdata inspect``: what a dataset holds, or one episode with its trained tokens.

Trained text is drawn in green and wrapped in ⟦ ⟧, so it stays visible without colour
(``NO_COLOR``, pipes, logs); markers are drawn apart (bold, dimmed when not trained).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Group
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from .. import inspect as sft_inspect
from ..errors import UsageError
from .app import JsonOpt, app, handle_errors, out_console, print_json

TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"
BAR_WIDTH = 32

PathArg = Annotated[Path, typer.Argument(help="Dataset folder (the --output-dir of prepare).", show_default=False)]
SplitOpt = Annotated[str, typer.Option("--split", help="Split of --episode / --sample.")]
EpisodeOpt = Annotated[Optional[list[int]], typer.Option(
    "--episode", "-e", help="Global episode id within --split (as replay-order prints it); repeatable.")]
RecordOpt = Annotated[Optional[int], typer.Option("--record", help="Show the episode made from input record N "
                                                  "(0-based, as in rejects.jsonl); any split.")]
SampleOpt = Annotated[Optional[int], typer.Option("--sample", help="Show K episodes of --split drawn at random.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of --sample.")]
TokensOpt = Annotated[bool, typer.Option("--tokens", help="With an episode: one row per token (position, id, "
                                         "text, trained, span).")]
BlockOpt = Annotated[Optional[int], typer.Option("--block-size", help="Overview: what truncation to B+1 tokens "
                                                 "(one training row) would drop.")]
DtypeOpt = Annotated[Optional[str], typer.Option("--token-dtype", help="Older flat layout only: dtype of "
                                                 "tokens.bin (default uint32).")]
TokenizerOpt = Annotated[Optional[str], typer.Option("--tokenizer", help="Older flat layout only: tokenizer to "
                                                     "decode with (default cl100k_base).")]


def _num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def _histogram(title: str, h: sft_inspect.Histogram, share: bool) -> Table:
    t = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 1))
    t.add_column(justify="right", style="cyan")
    t.add_column()
    t.add_column(justify="right")
    peak = max(h.counts, default=0) or 1
    for i, c in enumerate(h.counts):
        lo, hi = h.edges[i], h.edges[i + 1]
        label = f"{lo:.1f}–{hi:.1f}" if share else f"{int(lo):,}–{int(hi) - 1:,}"
        bar = "█" * round(BAR_WIDTH * c / peak) or ("▏" if c else "")
        t.add_row(label, Text(bar, style="green" if share else "blue"), f"{c:,}")
    return t


def _percentile_table(title: str, rows: dict[str, dict]) -> Table:
    keys = [f"p{p}" for p in sft_inspect.PERCENTILES] + ["mean"]
    heads = {"p0": "min", "p100": "max"}
    t = Table(title=title, title_justify="left", header_style="bold")
    t.add_column("split")
    for k in keys:
        t.add_column(heads.get(k, k), justify="right")
    for name, p in rows.items():
        t.add_row(name, *(_num(p[k]) if k in p else "" for k in keys))
    return t


def draw_overview(ov: sft_inspect.Overview) -> Group:
    parts: list = []
    head = Text()
    head.append(f"{ov.path}\n", style="bold")
    fmt = f"sftdata format v{ov.format_version}" if ov.format_version is not None else "older flat layout"
    head.append(f"{fmt} · kind {ov.kind} · layout {ov.layout} · tokens {ov.token_dtype}")
    if ov.created_by:
        head.append(f" · made by {ov.created_by}")
    if ov.tokenizer:
        tk = ov.tokenizer
        head.append(f"\ntokenizer {tk.get('name')} ({tk.get('source')}) · vocab {tk.get('vocab_size', 0):,} · "
                    f"EOS {tk.get('eos_id')} · ranks sha256 {tk.get('ranks_sha256')}")
    head.append(f"\n{ov.bytes_on_disk:,} bytes on disk")
    parts.append(head)

    t = Table(header_style="bold")
    for col in ("split", "episodes", "tokens", "trained tokens", "trained share", "untrained episodes",
                "shards", "bytes"):
        t.add_column(col, justify="left" if col == "split" else "right")
    for s in ov.splits:
        t.add_row(s.name, f"{s.episodes:,}", f"{s.tokens:,}",
                  "?" if s.trained_tokens is None else f"{s.trained_tokens:,}",
                  "?" if s.trained_share is None else f"{s.trained_share:.1%}",
                  "?" if s.episodes_training_nothing is None else f"{s.episodes_training_nothing:,}",
                  f"{s.shards:,}", f"{s.bytes_on_disk:,}")
    parts.append(t)
    parts.append(_percentile_table("episode length (tokens)", {s.name: s.length_percentiles for s in ov.splits}))
    for s in ov.splits:
        parts.append(_histogram(f"{s.name}: episodes by length (tokens)", s.length_histogram, share=False))
    shares = {s.name: s.trained_share_percentiles for s in ov.splits if s.trained_share_percentiles}
    if shares:
        parts.append(_percentile_table("trained share per episode", shares))
        for s in ov.splits:
            if s.trained_share_histogram:
                parts.append(_histogram(f"{s.name}: episodes by trained share", s.trained_share_histogram,
                                        share=True))
    for s in ov.splits:
        b = s.block
        if b is None:
            continue
        line = Text(f"{s.name} at --block-size {b.block_size}: ", style="bold")
        line.append(f"{b.episodes_longer:,} episodes ({b.episodes_longer_share:.1%}) are longer than "
                    f"{b.block_size + 1:,} tokens; truncation drops {b.tokens_dropped:,} tokens")
        if b.trained_tokens_dropped is not None:
            line.append(f", {b.trained_tokens_dropped:,} of them trained "
                        f"({b.trained_dropped_share:.1%} of the trained tokens)",
                        style="yellow" if b.trained_tokens_dropped else None)
        parts.append(line)
    if ov.sources:
        src = Text("sources\n", style="bold")
        for s in ov.sources:
            src.append(f"  {s.get('path')}  {s.get('bytes', 0):,} bytes  {s.get('records', 0):,} records  "
                       f"sha256 {s.get('sha256')}\n")
        parts.append(src)
    if ov.options:
        parts.append(Text("options  ", style="bold") + Text("  ".join(f"{k}={v}" for k, v in ov.options.items())))
    if ov.counts:
        shown = {k: v for k, v in ov.counts.items() if not isinstance(v, dict)}
        parts.append(Text("counts   ", style="bold") + Text("  ".join(f"{k}={v:,}" for k, v in shown.items())))
        for k, v in ov.counts.items():
            if isinstance(v, dict) and v:
                parts.append(Text(f"{k}  ", style="bold") + Text("  ".join(f"{r}: {n:,}" for r, n in v.items())))
    rej = Text(f"rejected records: {ov.rejected_total:,}", style="bold yellow" if ov.rejected_total else "bold")
    for reason, n in ov.rejected.items():
        rej.append(f"\n  {reason}: {n:,}", style="yellow")
    if ov.rejects_file:
        rej.append(f"\n  details: {ov.rejects_file}")
    parts.append(rej)
    for n in ov.notes:
        parts.append(Text(f"note: {n}", style="yellow"))
    return Group(*parts)


def episode_text(v: sft_inspect.EpisodeView) -> Text:
    """The decoded episode: markers bold, trained runs green inside ⟦ ⟧, a line break
    after every <|END|>."""
    out = Text()
    open_ = False
    for p in v.pieces:
        if p.trained and not open_:
            out.append(TRAINED_OPEN, style="bold green")
            open_ = True
        elif not p.trained and open_:
            out.append(TRAINED_CLOSE, style="bold green")
            open_ = False
        style = ("bold magenta" if p.trained else "bold dim") if p.marker else ("green" if p.trained else None)
        out.append(p.text, style=style)
        if p.marker and p.text == "<|END|>":
            if open_:
                out.append(TRAINED_CLOSE, style="bold green")
                open_ = False
            out.append("\n")
    if open_:
        out.append(TRAINED_CLOSE, style="bold green")
    return out


def token_table(v: sft_inspect.EpisodeView) -> Table:
    t = Table(header_style="bold", show_edge=False)
    for col, just in (("pos", "right"), ("id", "right"), ("text", "left"), ("trained", "center"), ("span", "left")):
        t.add_column(col, justify=just)
    for r in v.tokens or []:
        text = Text(r.text if r.marker else repr(r.text))  # repr: spaces and newlines visible
        t.add_row(str(r.position), str(r.id), text, "✓" if r.trained else "", r.span,
                  style="green" if r.trained else None)
    return t


def draw_episode(v: sft_inspect.EpisodeView, tokens: bool) -> Group:
    head = Text(f"{v.split} episode {v.episode}", style="bold")
    rec = "" if v.record is None else f" · input record {v.record}"
    trained = "" if v.trained_tokens is None else f", {v.trained_tokens:,} trained"
    head.append(f"{rec} · {v.shard} tokens [{v.start:,}, {v.start + v.length:,}) · {v.length:,} tokens{trained}")
    parts: list = [Rule(style="dim"), head, episode_text(v)]
    if v.rule_differs_at:
        parts.append(Text(f"warning: the stored mask differs from the mask rule at {len(v.rule_differs_at)} "
                          f"token(s), first at {v.rule_differs_at[0]}: run `sftdata verify`", style="bold red"))
    if tokens:
        parts.append(token_table(v))
    return Group(*parts)


@app.command("inspect")
@handle_errors
def inspect_cmd(
    path: PathArg,
    split: SplitOpt = "train",
    episode: EpisodeOpt = None,
    record: RecordOpt = None,
    sample: SampleOpt = None,
    seed: SeedOpt = 0,
    tokens: TokensOpt = False,
    block_size: BlockOpt = None,
    token_dtype: DtypeOpt = None,
    tokenizer: TokenizerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show what a dataset holds, or episodes with their trained tokens.

    Without --episode/--record/--sample: the overview (counts, trained share, length
    percentiles and histograms, sources, options, rejected records). Trained text is
    green and wrapped in ⟦ ⟧ (visible without colour too).

    Examples: sftdata inspect data/chat_sft --block-size 1024;
    sftdata inspect data/chat_sft --episode 42 --tokens
    """
    if episode or record is not None or sample is not None:
        if block_size is not None:
            raise UsageError("--block-size applies to the overview, not to --episode/--record/--sample")
        views, notes = sft_inspect.episode_views(path, split, episodes=episode, record=record, sample=sample,
                                                 seed=seed, tokens=tokens, token_dtype=token_dtype,
                                                 tokenizer=tokenizer)
        if as_json:
            print_json({"episodes": [v.as_dict() for v in views], "notes": notes})
            return
        for v in views:
            out_console.print(draw_episode(v, tokens))
        for n in notes:
            out_console.print(Text(f"note: {n}", style="yellow"))
        return
    if tokens:
        raise UsageError("--tokens needs --episode, --record or --sample")
    ov = sft_inspect.overview(path, block_size=block_size, token_dtype=token_dtype)
    if as_json:
        print_json(ov.as_dict())
    else:
        out_console.print(draw_overview(ov))
