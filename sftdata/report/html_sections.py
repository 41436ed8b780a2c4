"""The report's sections below the overview, as HTML: plot cards (each with a line on
how to read it), the input files, the rejected and repaired records."""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from .collect import DatasetReport
from .plots import (
    SERIES_COLOURS,
    Plot,
    Series,
    bar_counts_plot,
    cdf_plot,
    histogram_plot,
    share_length_plot,
    truncation_plot,
)


@dataclass
class Section:
    id: str
    nav: str  # its name in the page's menu
    html: str
    plots: list[Plot] = field(default_factory=list)


def card(plot: Plot) -> str:
    return (f'<div class="card"><h3>{escape(plot.title)}</h3><p class="how">{plot.caption}</p>'
            f'<div class="plot" id="plot-{plot.id}" data-figure="{plot.id}"></div></div>')


def section(sid: str, title: str, intro: str, body: str, plots: list[Plot | None] = (), nav: str | None = None
            ) -> Section:
    """A section with its plots drawn in a grid after ``body``."""
    drawn = [p for p in plots if p is not None]
    grid = '<div class="grid">' + "".join(card(p) for p in drawn) + "</div>" if drawn else ""
    return Section(sid, nav or title, f'<section id="{sid}"><h2>{escape(title)}</h2><p class="intro">{intro}</p>'
                                      f'{body}{grid}</section>', drawn)


def _plot(pid: str, title: str, caption: str, figure: str | None) -> Plot | None:
    return None if figure is None else Plot(pid, title, caption, figure)


def _zero_note(series: list[Series], field: str, unit: str) -> str:
    notes = [f"{escape(s.label)}: {getattr(s.figures, field).zeros:,}" for s in series
             if getattr(s.figures, field) is not None and getattr(s.figures, field).zeros]
    return f" {unit}s training nothing are left out of the log axis ({', '.join(notes)})." if notes else ""


def length_plots(series: list[Series], block_size: int | None, unit: str) -> list[Plot | None]:
    what = "segment" if unit == "row" else "episode"
    mark = (f" The red line is one training row at <code>--block-size {block_size:,}</code>: longer {what}s are cut."
            if block_size else "")
    return [
        _plot("lengths", f"{what.capitalize()} length",
              f"How many tokens each {what} has (log scale). Each bar is a range of lengths; hover for the count.{mark}",
              histogram_plot(series, "lengths", unit=what, what="tokens", x_title="tokens (log scale)",
                             block_size=block_size)),
        _plot("cdf", f"{what.capitalize()} length, cumulative",
              f"The share of {what}s at most this long: read off the median (50%) or the 90th percentile.{mark}",
              cdf_plot(series, block_size, what)),
    ]


def training_plots(series: list[Series], unit: str) -> list[Plot | None]:
    per = "row" if unit == "row" else "episode"
    plots = [
        _plot("trained", f"Trained tokens per {per}",
              f"How many tokens of each {per} the model learns to write (loss mask 1), log scale."
              + _zero_note(series, "trained", per),
              histogram_plot(series, "trained", unit=per, what="trained tokens", x_title="trained tokens (log scale)")),
        _plot("shares", f"Trained share per {per}",
              f"Trained tokens / all tokens of the {per}" + (" (padding left out)" if unit == "row" else "")
              + ". Near 0%: long prompts, short answers; near 100%: little context.",
              histogram_plot(series, "shares", unit=per, what="", x_title="trained share", log_x=False, share=True)),
    ]
    if unit != "row":
        plots += [
            _plot("share-length", "Trained share vs length",
                  "The median trained share of episodes of each length; the band holds the middle 80% of them. "
                  "A falling line: longer conversations are mostly context.", share_length_plot(series)),
            _plot("turns", "Turns per episode",
                  "Messages per episode, system prompts left out (user, assistant and tool turns).",
                  histogram_plot(series, "turns", unit="episode", what="turns", x_title="turns")),
        ]
    return plots


def media_plots(series: list[Series]) -> list[Plot | None]:
    """Tokens per media item (a dataset with media; None for a text dataset)."""
    return [_plot("media-tokens", "Tokens per image",
                  "How many placeholder tokens each image (or video) expands to under the pinned processor settings "
                  "(log scale); they are never trained. A long tail: raise the bound on pixels, or cap it.",
                  histogram_plot(series, "media_tokens", unit="image", what="tokens", x_title="tokens (log scale)"))]


def truncation_section(reports: list[DatasetReport], series: list[Series], names: list[str]) -> Section:
    """The cost at ``--block-size`` per split in words, and the curve over block sizes of
    the sampled split (of each dataset with ``--compare``)."""
    block = reports[0].block_size
    mine = [s for s in series if s.figures.name == reports[0].sample_split] or series
    lines = []
    if block is None:
        lines.append("Pass <code>--block-size N</code> (the training config's block size) to mark one on the plot "
                     "and get its exact cost here.")
    else:
        for r, name in zip(reports, names):
            for s in r.overview.splits:
                b = s.block
                if b is None:
                    continue
                who = f"{escape(name)} · {escape(s.name)}" if len(reports) > 1 else escape(s.name)
                trained = ("" if b.trained_tokens_dropped is None else
                           f", <b>{b.trained_tokens_dropped:,} of them trained</b> ({b.trained_dropped_share:.1%} of "
                           f"all trained tokens)")
                lines.append(f"<b>{who}</b>: {b.episodes_longer:,} episodes ({b.episodes_longer_share:.1%}) are longer "
                             f"than one row of {b.block_size + 1:,} tokens; cutting them drops {b.tokens_dropped:,} "
                             f"tokens{trained}.")
    plot = _plot("truncation", f"What truncation would cost, by block size ({reports[0].sample_split} split)",
                 "If every episode were cut to one row of block size + 1 tokens (the loader's truncation): the share of "
                 "episodes cut, of tokens dropped and of trained tokens dropped. Pick a block size where the dashed "
                 "line is near 0.", truncation_plot(mine, block))
    return section("truncation", "Truncation", "Training rows have a fixed length; what does not fit is lost.",
                   "".join(f'<p class="summary">{x}</p>' for x in lines), [plot])


def files_section(reports: list[DatasetReport], names: list[str]) -> Section | None:
    rows, bars = [], []
    for i, (r, name) in enumerate(zip(reports, names)):
        for f in r.files:
            label = f.path if len(reports) == 1 else f"{name}: {f.path}"
            share = "" if f.trained_tokens is None else f"{f.trained_tokens / max(1, f.tokens):.1%}"
            rows.append(f'<tr><td class="l"><code>{escape(label)}</code></td><td>{f.records:,}</td><td>{f.episodes:,}'
                        f'</td><td>{f.rejected:,}</td><td>{f.tokens:,}</td><td>'
                        f'{"?" if f.trained_tokens is None else f"{f.trained_tokens:,}"}</td><td>{share}</td><td>'
                        f'{"" if f.length_p50 is None else f"{f.length_p50:,.0f}"}</td></tr>')
            bars.append((label, f"{name} · episodes kept" if len(reports) > 1 else "episodes kept", f.episodes,
                         SERIES_COLOURS[i]))
            bars.append((label, f"{name} · records rejected" if len(reports) > 1 else "records rejected", f.rejected,
                         "#dc2626" if i == 0 else "#f87171"))
    if not rows:
        return None
    table = ('<div class="scroll"><table><tr><th class="l">input file</th><th>records</th><th>episodes kept</th>'
             '<th>rejected</th><th>tokens</th><th>trained tokens</th><th>trained share</th><th>median length</th></tr>'
             + "".join(rows) + "</table></div>")
    plot = None
    if len({b[0] for b in bars}) > 1:
        plot = _plot("files", "Episodes and rejects per input file", "Which file gave what.",
                     bar_counts_plot(bars, "records"))
    return section("files", "Input files", "Where the episodes came from (all splits together).", table, [plot])


def rejects_section(reports: list[DatasetReport], names: list[str]) -> Section:
    parts, bars = [], []
    for i, (r, name) in enumerate(zip(reports, names)):
        who = f"{escape(name)}: " if len(reports) > 1 else ""
        ov = r.overview
        if r.rejects.groups:
            rows = []
            for g in r.rejects.groups:  # the metadata counts every reject; the file may list the first only
                count = ov.rejected.get(g.reason, g.count)
                ex = "".join(f'<div><code>{escape(x.where)}</code> {escape(x.message)}</div>' for x in g.examples)
                rows.append(f'<tr><td class="l"><b>{escape(g.reason)}</b></td><td>{count:,}</td>'
                            f'<td class="msg">{ex}</td></tr>')
                bars.append((g.reason, name, count, SERIES_COLOURS[i]))
            total = ov.rejected_total or r.rejects.total
            parts.append(f'<h3>{who}{total:,} rejected records, by reason</h3><div class="scroll"><table>'
                         f'<tr><th class="l">reason</th><th>records</th><th class="l">examples (file:line, why)</th>'
                         f'</tr>{"".join(rows)}</table></div>')
            if r.rejects.cut:
                parts.append(f'<p class="how">{escape(r.rejects.cut)}</p>')
            if ov.rejects_file:
                listed = "The first of them" if r.rejects.cut else "All of them"
                parts.append(f'<p class="how">{listed}: <code>{escape(ov.rejects_file)}</code>; '
                             f'<code>sftdata inspect {escape(ov.path)} --record N</code> says why record N is missing.</p>')
        elif ov.rejected_total:
            parts.append(f'<h3>{who}{ov.rejected_total:,} rejected records</h3><table>'
                         + "".join(f'<tr><td class="l">{escape(k)}</td><td>{v:,}</td></tr>' for k, v in ov.rejected.items())
                         + "</table>")
        else:
            parts.append(f"<h3>{who}no record was rejected</h3>")
        if r.repairs:
            parts.append(f'<h3>{who}Records repaired, by repair</h3><table><tr><th class="l">repair</th><th>records</th>'
                         f'</tr>' + "".join(f'<tr><td class="l">{escape(k)}</td><td>{v:,}</td></tr>'
                                           for k, v in r.repairs.items())
                         + '</table><p class="how">Repaired records were kept, fixed as named (prepare counts them; it '
                           'does not list them one by one).</p>')
    plot = None
    if len(reports) > 1 or len({b[2] for b in bars}) > 1:  # a chart says more than the table: counts differ
        plot = _plot("rejects", "Rejected records by reason", "Why input records did not become episodes.",
                     bar_counts_plot(bars, "records"))
    return section("rejects", "Rejected and repaired records",
                   "Records prepare could not use (not in the dataset) or fixed on the way in.", "".join(parts), [plot],
                   nav="Rejects")


def packed_rows_plots(series: list[Series]) -> list[Plot | None]:
    return [
        _plot("fill", "Fill per row", "Real tokens / row length: 100% is a full row, the rest is padding.",
              histogram_plot(series, "fill", unit="row", what="", x_title="fill", log_x=False, share=True)),
        _plot("segments", "Segments per row", "How many conversation pieces share a row.",
              histogram_plot(series, "segments_per_row", unit="row", what="segments", x_title="segments in the row")),
    ]
