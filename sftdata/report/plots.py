"""The report's plots as Plotly figures (JSON for plotly.js), built from the collected
distributions: one trace per series (a split, or with ``--compare`` a dataset), y in
percent of each series' episodes so that series of any size overlay; the counts are in
the hover text. Plotly is imported lazily: it is the ``report`` extra.

plotly.js draws labels as pseudo-HTML (``<a href>``, ``<b>``, ``<br>``, ``<span style>``)
and fills ``%{...}`` in hover templates: every label that comes from the data (a split or
dataset name, an input file, a reject reason) goes in through ``plot_text`` (its markup
shown as written), and into a hover text only as ``%{meta}`` or ``%{y}``, never inside the
template.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib.resources import files

from ..errors import SftDataError
from .collect import DatasetReport, SplitFigures
from .distributions import Bins

INSTALL_HINT = "pip install 'sftdata[report]'"
PLOTLY_BUNDLE = "plotly-basic.min.js"
SERIES_COLOURS = ("#2563eb", "#ea580c", "#16a34a", "#9333ea")  # blue, orange, green, purple
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"


class ReportExtraMissing(SftDataError):
    """The HTML report needs the optional plotting library."""


def plotly_go():
    """``plotly.graph_objects``, or a one-line error naming the extra to install."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise ReportExtraMissing(f"sftdata report draws its plots with plotly, which is not installed: "
                                 f"{INSTALL_HINT}") from None
    return go


def plotly_js() -> str:
    """plotly.js to inline in the page (so it works offline): its *basic* bundle (bar and
    scatter traces, all the report draws), 1.2 MB against the 4.8 MB of the full bundle
    inside the plotly package, so the page opens about four times sooner. It ships with
    sftdata (``assets/plotly-basic.min.js``: plotly.js-basic-dist-min, MIT licence)."""
    return files("sftdata.report").joinpath("assets", PLOTLY_BUNDLE).read_text(encoding="utf-8")


def plot_text(text) -> str:
    """Text from the data as plotly.js shows it: as written, its pseudo-HTML not read
    (``<a href="http://x">x</a>.jsonl`` stays those characters, no link)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass
class Series:
    label: str  # "train", "val", or "A · train" with --compare
    colour: str
    figures: SplitFigures


@dataclass
class Plot:
    id: str
    title: str
    caption: str  # HTML: how to read the plot
    figure: str  # plotly figure JSON


def series_of(reports: list[DatasetReport], split: str, names: list[str]) -> list[Series]:
    """One series per split of one dataset; with two datasets, ``split`` of each."""
    if len(reports) == 1:
        return [Series(f.name, SERIES_COLOURS[i % 4], f) for i, f in enumerate(reports[0].figures)]
    out = []
    for i, (r, name) in enumerate(zip(reports, names)):
        out += [Series(f"{name} · {f.name}", SERIES_COLOURS[i], f) for f in r.figures if f.name == split]
    return out


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _layout(go, x_title: str, y_title: str, *, log_x: bool = False, pct_y: bool = True, **extra):
    return go.Layout(
        template="none", height=320, margin={"l": 64, "r": 16, "t": 16, "b": 52}, font={"family": FONT, "size": 12},
        xaxis={"title": {"text": x_title}, "type": "log" if log_x else "linear", "gridcolor": "#eceff3",
               "zeroline": False},
        yaxis={"title": {"text": y_title}, "gridcolor": "#eceff3", "zeroline": False, "rangemode": "tozero",
               **({"ticksuffix": "%"} if pct_y else {})},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "left", "x": 0},
        hoverlabel={"font": {"family": FONT}}, **{"barmode": "overlay", "bargap": 0, **extra})


def _pct(counts: list[int], total: int) -> list[float]:
    return [round(100 * c / max(1, total), 4) for c in counts]


def log_ticks(lo: float, hi: float) -> list[int]:
    """Tick values for a log axis over ``[lo, hi]``: 1-2-5 steps (1-2-3-5-7 over a short
    range), so every tick has a plain label (plotly's own log ticks label 20 as "2")."""
    steps = (1, 2, 5) if hi / max(lo, 1) > 30 else (1, 2, 3, 5, 7)
    out, p = [], 1
    while p <= hi:
        out += [p * s for s in steps if lo <= p * s <= hi]
        p *= 10
    return out


def _log_axis(layout, lo: float, hi: float) -> None:
    ticks = log_ticks(lo, hi)
    layout.xaxis.update(tickvals=ticks, ticktext=[f"{t / 1000:g}k" if t >= 10_000 else f"{t:,}" for t in ticks])


def _is_unit(bins: Bins) -> bool:
    """One integer value per bin (turns, segments per row)."""
    return all(b - a == 1 for a, b in zip(bins.edges[:-1], bins.edges[1:]))


def _bars(go, bins: Bins, s: Series, unit: str, what: str, several: bool, *, share: bool = False):
    """A histogram as bars ``[lo, hi)`` with exact widths on a log or linear axis; one
    value per bin: a bar centred on the value."""
    lo, hi = bins.edges[:-1], bins.edges[1:]
    width = None
    if share:  # shares in [0, 1], drawn in percent
        x = [50 * (a + b) for a, b in zip(lo, hi)]
        width = [100 * (b - a) for a, b in zip(lo, hi)]
        custom = [[round(100 * a), round(100 * b), c] for a, b, c in zip(lo, hi, bins.counts)]
        label = "%{customdata[0]}–%{customdata[1]}%"
    elif _is_unit(bins):
        x = [int(a) for a in lo]
        custom = [[int(a), int(a), c] for a, c in zip(lo, bins.counts)]
        label = f"%{{customdata[0]:,}} {what}"
    else:
        x = [(a + b) / 2 for a, b in zip(lo, hi)]
        width = [b - a for a, b in zip(lo, hi)]
        custom = [[int(a), int(b) - 1, c] for a, b, c in zip(lo, hi, bins.counts)]
        label = "%{customdata[0]:,}–%{customdata[1]:,}" + (f" {what}" if what else "")
    return go.Bar(x=x, width=width, y=_pct(bins.counts, bins.total), customdata=custom, name=plot_text(s.label),
                  meta=plot_text(s.label),
                  marker={"color": _rgba(s.colour, 0.45 if several else 0.8), "line": {"color": s.colour, "width": 1}},
                  hovertemplate=f"{label}<br>%{{customdata[2]:,}} {unit}s (%{{y:.1f}}%)<extra>%{{meta}}</extra>")


def _block_line(block_size: int | None, lo: float, hi: float, x: float | None = None) -> dict:
    """A dashed line at one row's length (``x``: elsewhere) on a log x axis spanning
    ``[lo, hi]``: plotly.js places shapes at the value and annotations at its log10; the
    label sits on the side of the line with room for it."""
    if block_size is None:
        return {}
    at = x if x is not None else block_size + 1
    span = math.log10(max(hi, at, lo + 1)) - math.log10(max(lo, 1))
    right = span > 0 and (math.log10(at) - math.log10(max(lo, 1))) / span > 0.6
    return {"shapes": [{"type": "line", "xref": "x", "yref": "paper", "x0": at, "x1": at, "y0": 0, "y1": 1,
                        "line": {"color": "#dc2626", "width": 1.5, "dash": "dash"}}],
            "annotations": [{"x": math.log10(at), "y": 1, "xref": "x", "yref": "paper",
                             "text": f" one row: {block_size + 1:,} tokens ", "showarrow": False,
                             "xanchor": "right" if right else "left", "yanchor": "top", "font": {"color": "#dc2626"},
                             "bgcolor": "rgba(255,255,255,0.8)"}]}


def histogram_plot(series: list[Series], field: str, *, unit: str, what: str, x_title: str, log_x: bool = True,
                   share: bool = False, block_size: int | None = None):
    """Overlaid histograms of ``SplitFigures.<field>``, y in % of each series' units."""
    go = plotly_go()
    drawn = [(s, getattr(s.figures, field)) for s in series]
    drawn = [(s, b) for s, b in drawn if b is not None and b.counts]
    if not drawn:
        return None
    unit_bins = not share and all(_is_unit(b) for _, b in drawn)
    traces = [_bars(go, b, s, unit, what, len(drawn) > 1, share=share) for s, b in drawn]
    log_x = log_x and not unit_bins
    lo, hi = min(b.edges[0] for _, b in drawn), max(b.edges[-1] for _, b in drawn)
    layout = _layout(go, x_title, f"% of {unit}s", log_x=log_x, **_block_line(block_size if log_x else None, lo, hi))
    if share:
        layout.xaxis.update(range=[0, 100], ticksuffix="%")
    elif unit_bins:
        layout.update(barmode="group", bargap=0.2)
        layout.xaxis.update(dtick=1 if max(len(b.counts) for _, b in drawn) <= 24 else None)
    elif log_x:
        _log_axis(layout, lo, max(hi, block_size + 1 if block_size else 0))
    return go.Figure(traces, layout).to_json()


def cdf_plot(series: list[Series], block_size: int | None, unit: str):
    go = plotly_go()
    traces = []
    for s in series:
        b = s.figures.lengths
        if not b.counts:
            continue
        x = [e - 1 for e in b.edges[1:]]
        traces.append(go.Scatter(x=x, y=[round(100 * c, 3) for c in b.cdf], mode="lines+markers",
                                 name=plot_text(s.label), meta=plot_text(s.label),
                                 line={"color": s.colour, "width": 2, "shape": "hv"}, marker={"size": 4},
                                 hovertemplate=f"%{{y:.1f}}% of {unit}s have at most %{{x:,}} tokens"
                                               f"<extra>%{{meta}}</extra>"))
    if not traces:
        return None
    xs = [x for t in traces for x in t.x]
    layout = _layout(go, "length (tokens, log scale)", f"% of {unit}s (cumulative)", log_x=True,
                     **_block_line(block_size, min(xs), max(xs)))
    layout.yaxis.update(range=[0, 101])
    _log_axis(layout, min(xs), max(max(xs), block_size + 1 if block_size else 0))
    return go.Figure(traces, layout).to_json()


def share_length_plot(series: list[Series]):
    go = plotly_go()
    traces = []
    for s in series:
        sl = s.figures.share_by_length
        if sl is None or not sl.episodes:
            continue
        x = [(lo * (hi - 1)) ** 0.5 for lo, hi in zip(sl.lo, sl.hi)]
        custom = [[lo, hi - 1, n, p10, p90] for lo, hi, n, p10, p90 in zip(sl.lo, sl.hi, sl.episodes, sl.p10, sl.p90)]
        pct = lambda v: [round(100 * a, 2) for a in v]
        traces.append(go.Scatter(x=x, y=pct(sl.p10), mode="lines", line={"width": 0}, showlegend=False,
                                 hoverinfo="skip", legendgroup=plot_text(s.label)))
        traces.append(go.Scatter(x=x, y=pct(sl.p90), mode="lines", line={"width": 0}, fill="tonexty",
                                 fillcolor=_rgba(s.colour, 0.15), showlegend=False, hoverinfo="skip",
                                 legendgroup=plot_text(s.label)))
        traces.append(go.Scatter(
            x=x, y=pct(sl.p50), mode="lines+markers", name=plot_text(s.label), meta=plot_text(s.label),
            legendgroup=plot_text(s.label), customdata=custom,
            line={"color": s.colour, "width": 2}, marker={"size": 6},
            hovertemplate="episodes of %{customdata[0]:,}–%{customdata[1]:,} tokens (%{customdata[2]:,}):<br>"
                          "median trained share %{y:.1f}%<br>10% of them below %{customdata[3]:.0%}, 10% above "
                          "%{customdata[4]:.0%}<extra>%{meta}</extra>"))
    if not traces:
        return None
    layout = _layout(go, "episode length (tokens, log scale)", "trained share of the episode", log_x=True)
    layout.yaxis.update(range=[0, 101], ticksuffix="%")
    xs = [x for t in traces for x in t.x]
    _log_axis(layout, min(xs), max(xs))
    return go.Figure(traces, layout).to_json()


TRUNCATION_LINES = (("episodes_longer_share", "episodes cut", "solid"),
                    ("tokens_share", "tokens dropped", "dot"),
                    ("trained_dropped_share", "trained tokens dropped", "dash"))


def truncation_plot(series: list[Series], block_size: int | None):
    go = plotly_go()
    traces, ticks = [], set()
    for s in series:
        curve = s.figures.truncation
        if not curve:
            continue
        total = s.figures.tokens
        x = [c.block_size for c in curve]
        ticks.update(x)
        for key, name, dash in TRUNCATION_LINES:
            if key == "tokens_share":
                if not total:
                    continue
                y = [100 * c.tokens_dropped / total for c in curve]
            else:
                vals = [getattr(c, key) for c in curve]
                if any(v is None for v in vals):
                    continue
                y = [100 * v for v in vals]
            label = name if len(series) == 1 else f"{s.label}: {name}"
            traces.append(go.Scatter(x=x, y=[round(v, 3) for v in y], mode="lines+markers", name=plot_text(label),
                                     meta=plot_text(s.label), line={"color": s.colour, "dash": dash, "width": 2},
                                     marker={"size": 6},
                                     hovertemplate=f"--block-size %{{x:,}}: %{{y:.2f}}% {name}<extra>%{{meta}}</extra>"))
    if not traces:
        return None
    layout = _layout(go, "--block-size (a row holds block size + 1 tokens; log scale)", "% lost to truncation",
                     log_x=True, **_block_line(block_size, min(ticks), max(ticks), block_size))
    layout.xaxis.update(tickvals=sorted(ticks), ticktext=[f"{t:,}" for t in sorted(ticks)])
    layout.update(hovermode="x unified")
    return go.Figure(traces, layout).to_json()


def bar_counts_plot(rows: list[tuple[str, str, int, str]], x_title: str):
    """Horizontal bars: (category, series label, count, colour) in the order given (the
    categories and labels as text: ``plot_text``)."""
    go = plotly_go()
    if not rows:
        return None
    labels = list(dict.fromkeys(r[1] for r in rows))
    traces = []
    for lab in labels:
        mine = [r for r in rows if r[1] == lab]
        traces.append(go.Bar(y=[plot_text(r[0]) for r in mine], x=[r[2] for r in mine], name=plot_text(lab),
                             meta=plot_text(lab), orientation="h", marker={"color": mine[0][3]},
                             hovertemplate="%{y}: %{x:,}<extra>%{meta}</extra>"))
    cats = list(dict.fromkeys(r[0] for r in rows))
    layout = _layout(go, x_title, "", pct_y=False, barmode="group" if len(labels) > 1 else "overlay")
    layout.update(height=max(160, 60 + 28 * len(cats) * len(labels)), bargap=0.25, showlegend=len(labels) > 1)
    layout.yaxis.update(autorange="reversed", automargin=True, type="category")
    layout.margin.update(l=16)
    return go.Figure(traces, layout).to_json()
