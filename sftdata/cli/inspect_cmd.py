"""``sftdata inspect``: what a dataset holds, or one episode (packed: one row) with its
trained tokens.

Trained text is drawn in green and wrapped in ⟦ ⟧, so it stays visible without colour
(``NO_COLOR``, pipes, logs); markers are drawn apart (bold, dimmed when not trained);
context a packer injected is wrapped in « ». Text from the dataset (its content, names,
paths, options, notes) is drawn with its control characters escaped (``terminal``): a
decoded episode keeps its line breaks, every other field is one line.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Group
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ..errors import UsageError
from ..report import PERCENTILES, EpisodeView, Histogram, Overview, RowView, overview, views
from ..report.mixture import mixture_overview
from ..report.pairs import PairView
from ..store.format import is_mixture_file
from .app import app, handle_errors, out_console, print_json
from .mix_cmd import draw_mixture
from .options import DatasetOrMixtureArg, JsonOpt, QuietOpt, TokenDtypeOpt, dataset_dir, flat_token_dtype
from .terminal import escape_controls, one_line

TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"
INJECTED_OPEN, INJECTED_CLOSE = "«", "»"
BAR_WIDTH = 32

SplitOpt = Annotated[str, typer.Option("--split", metavar="NAME", help="train or val: the split of --episode, "
                                       "--row and --sample.")]
EpisodeOpt = Annotated[list[int] | None, typer.Option(
    "--episode", "-e", metavar="ID", help="Global episode id within --split (as replay-order prints it); "
                                          "repeatable.")]
RowOpt = Annotated[list[int] | None, typer.Option(
    "--row", "-r", metavar="ID", help="Packed datasets: row id within --split (segments, positions, padding); "
                                      "pairs, KTO rows and RL prompts: the pair (row) id, as replay-order prints "
                                      "it; repeatable.")]
RecordOpt = Annotated[int | None, typer.Option(
    "--record", metavar="N", help="Show the episode (packed: the rows) made from input record N (0-based, as "
                                  "in rejects.jsonl); any split.")]
SampleOpt = Annotated[int | None, typer.Option(
    "--sample", metavar="K", help="Show K episodes (packed: rows) of --split drawn at random.")]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="N", help="Seed of --sample.")]
TokensOpt = Annotated[bool, typer.Option(
    "--tokens", metavar="", help="With an episode or row: one line per token (position, id, text, trained, "
                                 "span; packed: seq_id and position_id).")]
BlockOpt = Annotated[int | None, typer.Option(
    "--block-size", metavar="B", help="Overview: what truncating every episode to one training row (B + 1 "
                                      "tokens) would drop.")]
EpochsOpt = Annotated[int, typer.Option(
    "--epochs", metavar="N", help="Mixture files: the epochs whose realized rows and tokens per member are shown.")]
TokenizerOpt = Annotated[str | None, typer.Option(
    "--tokenizer", metavar="NAME|PATH", help="Older flat layout only: tokenizer to decode with (default "
                                             "cl100k_base). A dataset made with a model's tokenizer.json that "
                                             "has moved since: where it is now (its sha256 is checked).")]


def _num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def _histogram(title: str, h: Histogram, share: bool) -> Table:
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
    keys = [f"p{p}" for p in PERCENTILES] + ["mean"]
    heads = {"p0": "min", "p100": "max"}
    t = Table(title=title, title_justify="left", header_style="bold")
    t.add_column("split")
    for k in keys:
        t.add_column(heads.get(k, k), justify="right")
    for name, p in rows.items():
        t.add_row(one_line(name), *(_num(p[k]) if k in p else "" for k in keys))
    return t


def draw_overview(ov: Overview) -> Group:
    parts: list = []
    head = Text()
    head.append(f"{one_line(ov.path)}\n", style="bold")
    fmt = f"sftdata format v{ov.format_version}" if ov.format_version is not None else "older flat layout"
    head.append(one_line(f"{fmt} · kind {ov.kind} · layout {ov.layout} · tokens {ov.token_dtype}"))
    if ov.created_by:
        head.append(f" · made by {one_line(ov.created_by)}")
    if ov.tokenizer:
        tk = ov.tokenizer
        if tk.get("file_sha256"):  # a model's own tokenizer.json and chat template
            tpl = tk.get("template") or {}
            head.append("\n" + one_line(
                f"tokenizer {tk.get('name')} ({tk.get('kind')}) · vocab {tk.get('vocab_size', 0):,} · EOS "
                f"{tk.get('eos_id')} · tokenizer.json sha256 {tk.get('file_sha256')} · chat template "
                f"{tpl.get('name')} ({tpl.get('source')}, sha256 {tpl.get('sha256')})"))
        else:
            head.append("\n" + one_line(
                f"tokenizer {tk.get('name')} ({tk.get('source')}) · vocab {tk.get('vocab_size', 0):,} · EOS "
                f"{tk.get('eos_id')} · ranks sha256 {tk.get('ranks_sha256')}"))
    if ov.packing:
        pk = ov.packing
        head.append("\n" + one_line(
            f"packed ({pk.get('strategy')}): --block-size {pk.get('block_size')}, rows of {pk.get('row_len')} tokens, "
            f"--overlong {pk.get('overlong')}, pad id {pk.get('pad_token_id')}, seed {pk.get('seed')}"))
        if ov.packed_from:
            head.append("\n" + one_line(f"packed from {ov.packed_from.get('path')} (its metadata sha256 "
                                        f"{ov.packed_from.get('metadata_sha256')})"))
    if ov.serving:
        head.append("\n" + one_line(serving_line(ov.serving)))
    if ov.media:
        head.append("\n" + one_line(media_line(ov.media)))
    if ov.rows:
        parts_of = {"pairs": "prompt, chosen, rejected", "kto": "prompt, completion", "prompts": "prompt"}
        counts = ", ".join(f"{n:,} in {one_line(s)}" for s, n in ov.rows["splits"].items())
        head.append("\n" + one_line(f"{ov.kind}: {counts} · each {ov.rows['per_row']} index entries "
                                     f"({parts_of.get(ov.kind, '')}); the tables count entries · "
                                     f"`--row N` shows one"))
    head.append(f"\n{ov.bytes_on_disk:,} bytes on disk")
    parts.append(head)
    if ov.packing:
        parts += _packed_tables(ov)
    else:
        parts += _episode_tables(ov)
    _tail(ov, parts)
    return Group(*parts)


def media_line(media: dict) -> str:
    """A dataset's media in one line: the counts and the processor that decided them."""
    p = media.get("processor") or {}
    pixels = f", pixels {p['min_pixels']:,}..{p['max_pixels']:,}" if "min_pixels" in p and "max_pixels" in p else ""
    videos = f", {media.get('videos', 0):,} videos" if media.get("videos") else ""
    return (f"media: {media.get('images', 0):,} images{videos}, {media.get('tokens', 0):,} placeholder tokens (never "
            f"trained) · processor {p.get('family')}{pixels}")


def serving_line(sv: dict) -> str:
    """serving.json in one line: what an inference config must say."""
    def named(ids, strings) -> str:
        return ", ".join(f"{s} ({i})" for i, s in zip(ids, strings))

    bos = sv.get("bos") or {}
    tpl = sv.get("template")
    fmt = (f"chat template {tpl.get('name')} (sha256 {tpl.get('sha256')})" if tpl else "sftdata's chat markers")
    line = (f"serving: stop {named(sv.get('stop_ids') or [], sv.get('stop_strings') or [])} · pad "
            f"{sv.get('pad_string')} ({sv.get('pad_id')})" + (" = a stop id (accepted)" if sv.get("pad_is_stop") else "")
            + f" · BOS {bos.get('policy')}" + (f" {bos.get('string')} ({bos.get('id')})" if bos.get("id") is not None
                                               else "") + f" · {fmt} · add_special_tokens false")
    return line


def _packed_tables(ov: Overview) -> list:
    t = Table(header_style="bold")
    t.add_column("")
    for s in ov.splits:
        t.add_column(one_line(s.name), justify="right")

    def row(label, fn):
        t.add_row(label, *(fn(s) for s in ov.splits))

    def maybe(x, fmt):
        return "?" if x is None else fmt.format(x)

    row("rows", lambda s: f"{s.packed.rows:,}")
    row("segments", lambda s: f"{s.packed.segments:,}")
    row("real tokens (injected)", lambda s: f"{s.packed.real_tokens:,} ({s.packed.injected_tokens:,})")
    row("padding tokens", lambda s: f"{s.packed.padding_tokens:,}")
    row("fill", lambda s: f"{s.packed.fill:.1%}")
    row("trained tokens", lambda s: maybe(s.trained_tokens, "{:,}"))
    row("trained share of real", lambda s: maybe(s.trained_share, "{:.1%}"))
    row("rows training nothing", lambda s: maybe(s.episodes_training_nothing, "{:,}"))
    row("shards, bytes", lambda s: f"{s.shards:,}, {s.bytes_on_disk:,}")
    parts: list = [t]
    spr = Text("segments per row: ", style="bold")
    spr.append("  ".join(f"{one_line(s.name)} min {_num(s.packed.segments_per_row.get('p0', 0))} median "
                         f"{_num(s.packed.segments_per_row.get('p50', 0))} max "
                         f"{_num(s.packed.segments_per_row.get('p100', 0))}" for s in ov.splits))
    parts.append(spr)
    parts.append(_percentile_table("segment length (tokens)", {s.name: s.length_percentiles for s in ov.splits}))
    for s in ov.splits:
        parts.append(_histogram(f"{one_line(s.name)}: segments by length (tokens)", s.length_histogram, share=False))
    shares = {s.name: s.trained_share_percentiles for s in ov.splits if s.trained_share_percentiles}
    if shares:
        parts.append(_percentile_table("trained share per row (of its real tokens)", shares))
    return parts


def _episode_tables(ov: Overview) -> list:
    parts: list = []
    t = Table(header_style="bold")
    for col in ("split", "episodes", "tokens", "trained tokens", "trained share", "untrained episodes",
                "shards", "bytes"):
        t.add_column(col, justify="left" if col == "split" else "right")
    for s in ov.splits:
        t.add_row(one_line(s.name), f"{s.episodes:,}", f"{s.tokens:,}",
                  "?" if s.trained_tokens is None else f"{s.trained_tokens:,}",
                  "?" if s.trained_share is None else f"{s.trained_share:.1%}",
                  "?" if s.episodes_training_nothing is None else f"{s.episodes_training_nothing:,}",
                  f"{s.shards:,}", f"{s.bytes_on_disk:,}")
    parts.append(t)
    parts.append(_percentile_table("episode length (tokens)", {s.name: s.length_percentiles for s in ov.splits}))
    for s in ov.splits:
        parts.append(_histogram(f"{one_line(s.name)}: episodes by length (tokens)", s.length_histogram, share=False))
    shares = {s.name: s.trained_share_percentiles for s in ov.splits if s.trained_share_percentiles}
    if shares:
        parts.append(_percentile_table("trained share per episode", shares))
        for s in ov.splits:
            if s.trained_share_histogram:
                parts.append(_histogram(f"{one_line(s.name)}: episodes by trained share", s.trained_share_histogram,
                                        share=True))
    return parts


def _tail(ov: Overview, parts: list) -> None:
    """Block-size cost, sources, options, counts, rejects, notes."""
    for s in ov.splits:
        b = s.block
        if b is None:
            continue
        line = Text(f"{one_line(s.name)} at --block-size {b.block_size}: ", style="bold")
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
            first, n = s.get("first_record"), s.get("records", 0)
            numbers = f" (record numbers {first:,}–{first + n - 1:,})" if isinstance(first, int) and n else ""
            src.append("  " + one_line(f"{s.get('path')}  {s.get('container', '?')}  {s.get('bytes', 0):,} bytes  "
                                       f"{n:,} records{numbers}  sha256 {s.get('sha256')}") + "\n")
        parts.append(src)
    if ov.options:
        parts.append(Text("options  ", style="bold") + Text("  ".join(one_line(f"{k}={v}")
                                                                     for k, v in ov.options.items())))
    if ov.counts:
        shown = {k: v for k, v in ov.counts.items() if not isinstance(v, dict)}
        parts.append(Text("counts   ", style="bold") + Text("  ".join(one_line(f"{k}={v:,}")
                                                                     for k, v in shown.items())))
        for k, v in ov.counts.items():
            if isinstance(v, dict) and v:
                parts.append(Text(f"{one_line(k)}  ", style="bold") + Text("  ".join(one_line(f"{r}: {n:,}")
                                                                                     for r, n in v.items())))
    rej = Text(f"rejected records: {ov.rejected_total:,}", style="bold yellow" if ov.rejected_total else "bold")
    for reason, n in ov.rejected.items():
        rej.append(f"\n  {one_line(reason)}: {n:,}", style="yellow")
    if ov.rejects_file:
        rej.append(f"\n  details: {one_line(ov.rejects_file)}")
    parts.append(rej)
    for n in ov.notes:
        parts.append(Text(f"note: {one_line(n)}", style="yellow"))


def pieces_text(pieces: list) -> Text:
    """Decoded pieces: markers bold, trained runs green inside ⟦ ⟧, a line break after
    every <|END|>; injected context (packed rows) inside « »."""
    out = Text()
    open_ = False
    for i, p in enumerate(pieces):
        if p.injected:  # packer's context: never trained
            first = i == 0 or not pieces[i - 1].injected
            last = i == len(pieces) - 1 or not pieces[i + 1].injected
            out.append((INJECTED_OPEN if first else "") + escape_controls(p.text) + (INJECTED_CLOSE if last else ""),
                       style="italic dim")
            continue
        if p.trained and not open_:
            out.append(TRAINED_OPEN, style="bold green")
            open_ = True
        elif not p.trained and open_:
            out.append(TRAINED_CLOSE, style="bold green")
            open_ = False
        style = ("bold magenta" if p.trained else "bold dim") if p.marker else ("green" if p.trained else None)
        style = "bold cyan" if getattr(p, "media", False) and not p.trained else style
        out.append(one_line(p.text) if p.marker else escape_controls(p.text), style=style)
        if p.marker and p.text == "<|END|>":
            if open_:
                out.append(TRAINED_CLOSE, style="bold green")
                open_ = False
            out.append("\n")
    if open_:
        out.append(TRAINED_CLOSE, style="bold green")
    return out


def token_table(v) -> Table:
    packed = isinstance(v, RowView)
    t = Table(header_style="bold", show_edge=False)
    cols = [("pos", "right"), ("id", "right"), ("text", "left"), ("trained", "center"), ("span", "left")]
    if packed:
        cols[3:3] = [("seq", "right"), ("position", "right")]
    for col, just in cols:
        t.add_column(col, justify=just)
    for r in v.tokens or []:
        text = Text(one_line(r.text) if r.marker else repr(r.text))  # repr: spaces, newlines, controls visible
        extra = [str(r.seq_id), str(r.position_id)] if packed else []
        t.add_row(str(r.position), str(r.id), text, *extra, "✓" if r.trained else "", one_line(r.span),
                  style="green" if r.trained else None)
    return t


def draw_row(v: RowView, tokens: bool) -> Group:
    head = Text(f"{one_line(v.split)} row {v.row}", style="bold")
    trained = "" if v.trained_tokens is None else f" · {v.trained_tokens:,} trained"
    head.append(f" · {one_line(v.shard)} · {len(v.segments)} segment(s), {v.real_tokens:,} real tokens, {v.padding:,} "
                f"padding of {v.row_len:,}{trained}")
    parts: list = [Rule(style="dim"), head]
    for sg in v.segments:
        rec = "" if sg.record is None else f", input record {sg.record}"
        inj = f" · {sg.prefix} injected token(s) in « »" if sg.prefix else ""
        parts.append(Text(f"segment {sg.index} · offset {sg.offset:,}, positions 0–{sg.length - 1:,} · episode "
                          f"{sg.episode}{rec}, its tokens from {sg.episode_start:,}{inj} · {sg.trained_tokens:,} "
                          f"trained", style="cyan"))
        parts.append(pieces_text(sg.pieces))
    if v.padding:
        parts.append(Text(f"padding: {v.padding:,} × id {v.pad_id} at offsets {v.real_tokens:,}–{v.row_len - 1:,} "
                          f"(seq_id -1, mask 0)", style="dim"))
    if v.rule_differs_at:
        parts.append(Text(f"warning: the stored mask differs from the mask rule per segment at "
                          f"{len(v.rule_differs_at)} token(s), first at {v.rule_differs_at[0]}: run `sftdata verify`",
                          style="bold red"))
    if tokens:
        parts.append(token_table(v))
    return Group(*parts)


def draw_pair(v: PairView, tokens: bool) -> Group:
    """The prompt once, then chosen and rejected side by side (KTO: the completion and its
    label; an RL prompt: its columns), trained text green inside ⟦ ⟧."""
    head = Text(f"{one_line(v.split)} {'pair' if v.kind == 'pairs' else v.kind + ' row'} {v.row}", style="bold")
    rec = "" if v.record is None else f" · input record {v.record}"
    label = "" if v.label is None else f" · label {'desirable' if v.label else 'undesirable'}"
    head.append(f"{rec}{label} · {one_line(v.shard)} · prompt {v.prompt_length:,} tokens (never trained)")
    parts: list = [Rule(style="dim"), head, Text("prompt", style="cyan"), pieces_text(v.prompt)]
    if v.sides:
        t = Table(header_style="bold cyan", show_lines=False, expand=True)
        for s in v.sides:
            t.add_column(f"{s.name} · {s.length:,} tokens, {s.trained_tokens:,} trained", ratio=1, overflow="fold")
        t.add_row(*(pieces_text(s.pieces) for s in v.sides))
        parts.append(t)
    if v.columns is not None:
        parts.append(Text("columns ", style="cyan") + Text(one_line(v.columns)))
    if tokens:
        for s in v.sides:
            parts += [Text(f"{s.name}: prompt + {s.name}", style="cyan"), token_table(s)]
    return Group(*parts)


def draw_episode(v: EpisodeView, tokens: bool) -> Group:
    head = Text(f"{one_line(v.split)} episode {v.episode}", style="bold")
    rec = "" if v.record is None else f" · input record {v.record}"
    trained = "" if v.trained_tokens is None else f", {v.trained_tokens:,} trained"
    head.append(f"{rec} · {one_line(v.shard)} tokens [{v.start:,}, {v.start + v.length:,}) · {v.length:,} tokens{trained}")
    if v.last_reply_only:
        head.append(" · last reply only (one episode per reply: the conversation up to it)")
    parts: list = [Rule(style="dim"), head, pieces_text(v.pieces)]
    if v.rule_differs_at:
        parts.append(Text(f"warning: the stored mask differs from the mask rule at {len(v.rule_differs_at)} "
                          f"token(s), first at {v.rule_differs_at[0]}: run `sftdata verify`", style="bold red"))
    if tokens:
        parts.append(token_table(v))
    return Group(*parts)


@app.command("inspect")
@handle_errors
def inspect_cmd(
    path: DatasetOrMixtureArg,
    split: SplitOpt = "train",
    episode: EpisodeOpt = None,
    row: RowOpt = None,
    record: RecordOpt = None,
    sample: SampleOpt = None,
    seed: SeedOpt = 0,
    tokens: TokensOpt = False,
    block_size: BlockOpt = None,
    token_dtype: TokenDtypeOpt = None,
    tokenizer: TokenizerOpt = None,
    epochs: EpochsOpt = 3,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Show what a dataset holds, or episodes (packed: rows) with their trained tokens.

    Without --episode/--row/--record/--sample: the overview (counts, trained share, length
    percentiles and histograms, sources, options, rejected records; packed: rows, segments,
    fill). In an episode, trained text is green and wrapped in ⟦ ⟧ (visible without colour
    too); see docs/AUDIT.md.

    Examples:

    * `sftdata inspect data/chat_sft` (the overview)
    * `sftdata inspect data/chat_sft --block-size 1024` (what truncating rows to 1024 would cost)
    * `sftdata inspect data/chat_sft --episode 0 --tokens` (one episode, one line per token)
    * `sftdata inspect data/chat_sft --record 17` (the episode made from input record 17)
    * `sftdata inspect data/chat_sft_packed --row 3`
    * `sftdata inspect data/pref --row 0` (a pair: chosen and rejected side by side)
    * `sftdata inspect data/mix.json --epochs 5` (a mixture: each member's rows and tokens per epoch)
    """
    if is_mixture_file(path):
        if episode or row or record is not None or sample is not None or tokens or block_size is not None:
            raise UsageError(f"{path} is a mixture: inspect one of its member folders for --episode, --row, "
                             f"--record, --sample, --tokens or --block-size")
        ov = mixture_overview(path, split=split, epochs=epochs)
        if as_json:
            print_json(ov.as_dict())
        elif not quiet:
            out_console.print(draw_mixture(ov))
        return
    path = dataset_dir(path)
    token_dtype = flat_token_dtype(token_dtype)
    if episode or row or record is not None or sample is not None:
        if block_size is not None:
            raise UsageError("--block-size applies to the overview, not to --episode/--row/--record/--sample")
        found, notes = views(path, split, episodes=episode, rows=row, record=record, sample=sample, seed=seed,
                             tokens=tokens, token_dtype=token_dtype, tokenizer=tokenizer)
        if as_json:
            key = "rows" if found and isinstance(found[0], RowView) else "pairs" if found and isinstance(
                found[0], PairView) else "episodes"
            print_json({key: [v.as_dict() for v in found], "notes": notes})
            return
        if quiet:
            return
        for v in found:
            out_console.print(draw_row(v, tokens) if isinstance(v, RowView) else draw_pair(v, tokens)
                              if isinstance(v, PairView) else draw_episode(v, tokens))
        for n in notes:
            out_console.print(Text(f"note: {one_line(n)}", style="yellow"))
        return
    if tokens:
        raise UsageError("--tokens needs --episode, --row, --record or --sample")
    ov = overview(path, block_size=block_size, token_dtype=token_dtype)
    if as_json:
        print_json(ov.as_dict())
    elif not quiet:
        out_console.print(draw_overview(ov))
