"""The report as one self-contained HTML page: styles, scripts (plotly.js included) and
data inline, nothing fetched, so it opens offline and can be sent as one file.

``render_page`` lays out the sections (overview, lengths, training, truncation, input
files, rejects, samples) from one ``DatasetReport``, or two side by side (``--compare``),
into ``assets/page.html``.
"""

from __future__ import annotations

import string
from html import escape
from importlib.resources import files

import orjson

from .. import __version__
from ..store.format import ROW_KINDS
from .collect import DatasetReport
from .html_samples import LEGEND, samples_html
from .html_sections import (
    Section,
    files_section,
    length_plots,
    media_plots,
    packed_rows_plots,
    rejects_section,
    section,
    training_plots,
    truncation_section,
)
from .plots import plotly_js, series_of

GENERATOR = '<meta name="generator" content="sftdata report">'  # how a page sftdata wrote is recognised


def asset(name: str) -> str:
    return files("sftdata.report").joinpath("assets", name).read_text(encoding="utf-8")


def _stat(value: str, label: str, warn: bool = False) -> str:
    return f'<div class="stat{" warn" if warn else ""}"><div class="v">{value}</div><div class="l">{label}</div></div>'


def _p(d: dict, key: str) -> str:
    return f"{d[key]:,.0f}" if key in d else "?"


def _episode_stats(r: DatasetReport) -> tuple[str, str]:
    ov = r.overview
    n = sum(s.episodes for s in ov.splits)
    toks = sum(s.tokens for s in ov.splits)
    trained = None if any(s.trained_tokens is None for s in ov.splits) else sum(s.trained_tokens for s in ov.splits)
    train = next((s for s in ov.splits if s.name == "train"), ov.splits[0])
    nothing = sum(s.episodes_training_nothing or 0 for s in ov.splits)
    read = ov.counts.get("records_read")
    per_split = " · ".join(f"{s.episodes:,} {escape(s.name)}" for s in ov.splits)
    cards = [_stat(f"{n:,}", f"episodes ({per_split})"), _stat(f"{toks:,}", "tokens"),
             _stat("?" if trained is None else f"{trained:,} ({trained / max(1, toks):.1%})",
                   "trained tokens: the model learns to write these"),
             _stat(_p(train.length_percentiles, "p50"), f"median {escape(train.name)} episode length (tokens); p90 "
                   f"{_p(train.length_percentiles, 'p90')}, longest {_p(train.length_percentiles, 'p100')}"),
             _stat(f"{ov.rejected_total:,}", "input records rejected" + (f" of {read:,} read" if read else ""),
                   warn=ov.rejected_total > 0),
             _stat(f"{nothing:,}", "episodes that train nothing", warn=nothing > 0)]
    lines = [f"{escape(s.name)}: {s.episodes:,} episodes, {s.tokens:,} tokens"
             + ("" if s.trained_share is None else f", {s.trained_share:.1%} of them trained") for s in ov.splits]
    summary = ("This dataset holds " + "; ".join(lines) + ". Trained tokens are the assistant's replies, markers "
               "included (loss mask 1); everything else is context the model reads but is not trained to write.")
    return "".join(cards), summary


def _packed_stats(r: DatasetReport) -> tuple[str, str]:
    ov = r.overview
    pk = ov.packing or {}
    rows = sum(s.packed.rows for s in ov.splits)
    segs = sum(s.packed.segments for s in ov.splits)
    real = sum(s.packed.real_tokens for s in ov.splits)
    pad = sum(s.packed.padding_tokens for s in ov.splits)
    trained = None if any(s.trained_tokens is None for s in ov.splits) else sum(s.trained_tokens for s in ov.splits)
    cards = [_stat(f"{rows:,}", f"rows of {pk.get('row_len', 0):,} tokens"), _stat(f"{segs:,}", "segments (episode pieces)"),
             _stat(f"{real / max(1, real + pad):.1%}", "fill: real tokens / all row tokens", warn=pad > real),
             _stat(f"{pad:,}", "padding tokens"),
             _stat("?" if trained is None else f"{trained:,} ({trained / max(1, real):.1%})",
                   "trained tokens (share of real tokens)")]
    src = (ov.packed_from or {}).get("path")
    summary = (f"A packed dataset: several conversations share each row of {pk.get('row_len', 0):,} tokens "
               f"(<code>--block-size {pk.get('block_size')}</code>, {escape(str(pk.get('strategy')))} packing, "
               f"<code>--overlong {escape(str(pk.get('overlong')))}</code>)"
               + (f", made from <code>{escape(str(src))}</code>" if src else "")
               + ". Each piece of a conversation in a row is a segment; a segment attends only to itself.")
    return "".join(cards), summary


def _made_with(r: DatasetReport) -> str:
    ov = r.overview
    kv = [("format", "older flat layout" if ov.format_version is None else f"sftdata format v{ov.format_version}"),
          ("kind, layout", f"{ov.kind}, {ov.layout}"), ("token dtype", ov.token_dtype),
          ("bytes on disk", f"{ov.bytes_on_disk:,}")]
    if ov.created_by:
        kv.append(("made by", ov.created_by))
    if ov.tokenizer:
        tk = ov.tokenizer
        kv.append(("tokenizer", f"{tk.get('name')} ({tk.get('source')}), vocabulary {tk.get('vocab_size', 0):,}, "
                                f"EOS id {tk.get('eos_id')}, ranks sha256 {tk.get('ranks_sha256')}"))
    else:
        kv.append(("tokenizer", f"not recorded; decoded with {r.tokenizer}"))
    if ov.packing:
        kv += [(f"packing {k}", str(v)) for k, v in ov.packing.items() if k != "segment_fields"]
    kv += [(f"option {k}", str(v)) for k, v in ov.options.items()]
    kv += [(f"source {s.get('path')}", f"{s.get('records', 0):,} records, {s.get('bytes', 0):,} bytes, sha256 "
                                       f"{s.get('sha256')}") for s in ov.sources]
    kv += [(k, f"{v:,}") for k, v in ov.counts.items() if isinstance(v, int)]
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in kv)
    return (f'<details class="meta"><summary>How it was made: tokenizer, options, input files</summary>'
            f'<dl class="kv">{rows}</dl></details>')


def _split_table(r: DatasetReport) -> str:
    ov = r.overview
    if ov.packing:
        head = ["split", "rows", "segments", "real tokens", "padding", "fill", "trained tokens", "trained share",
                "shards"]
        body = [[s.name, f"{s.packed.rows:,}", f"{s.packed.segments:,}", f"{s.packed.real_tokens:,}",
                 f"{s.packed.padding_tokens:,}", f"{s.packed.fill:.1%}",
                 "?" if s.trained_tokens is None else f"{s.trained_tokens:,}",
                 "?" if s.trained_share is None else f"{s.trained_share:.1%}", f"{s.shards:,}"] for s in ov.splits]
    else:
        head = ["split", "episodes", "tokens", "trained tokens", "trained share", "median length", "p90 length",
                "longest", "episodes training nothing", "shards"]
        body = [[s.name, f"{s.episodes:,}", f"{s.tokens:,}", "?" if s.trained_tokens is None else f"{s.trained_tokens:,}",
                 "?" if s.trained_share is None else f"{s.trained_share:.1%}", _p(s.length_percentiles, "p50"),
                 _p(s.length_percentiles, "p90"), _p(s.length_percentiles, "p100"),
                 "?" if s.episodes_training_nothing is None else f"{s.episodes_training_nothing:,}", f"{s.shards:,}"]
                for s in ov.splits]
    return _table(head, body)


def _table(head: list[str], body: list[list[str]]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in body)
    return f'<div class="scroll"><table><tr>{th}</tr>{rows}</table></div>'


def overview_section(reports: list[DatasetReport], names: list[str]) -> Section:
    parts = []
    for r, name in zip(reports, names):
        cards, summary = _packed_stats(r) if r.packed else _episode_stats(r)
        notes = "".join(f'<p class="note">note: {escape(n)}</p>' for n in r.overview.notes + r.notes)
        title = f"<h3>{escape(name)} <code>{escape(r.overview.path)}</code></h3>" if len(reports) > 1 else ""
        parts.append(f'<div>{title}<div class="stats">{cards}</div><p class="summary">{summary}</p>'
                     f'{_split_table(r)}{notes}{_made_with(r)}</div>')
    body = parts[0] if len(parts) == 1 else f'<div class="side">{"".join(parts)}</div>'
    return section("overview", "Overview", "What the dataset holds, at a glance (the figures of "
                   "<code>sftdata inspect</code>).", body)


def dataset_names(reports: list[DatasetReport]) -> list[str]:
    """Short names for the legend: folder names, or A and B when those are the same."""
    names = [r.overview.path.rstrip("/").rsplit("/", 1)[-1] or r.overview.path for r in reports]
    return names if len(set(names)) == len(names) else ["A", "B"][:len(reports)]


def sections_of(reports: list[DatasetReport], names: list[str]) -> list[Section]:
    first = reports[0]
    unit = "row" if first.packed else "episode"
    series = series_of(reports, first.sample_split, names)
    out = [overview_section(reports, names)]
    if first.packed:
        out.append(section("rows", "Rows", "How full the rows are, and how many segments share one.", "",
                           packed_rows_plots(series)))
    out.append(section("lengths", "Lengths", f"How long the {'segments' if first.packed else 'episodes'} are.", "",
                       length_plots(series, first.block_size, unit)))
    out.append(section("training", "What is trained", "The tokens the loss is computed on.", "",
                       training_plots(series, unit)))
    media = [p for p in media_plots(series) if p is not None]
    if media:
        out.append(section("media", "Media", "Images and videos, each expanded to its placeholder tokens.", "",
                           media))
    if not first.packed:
        out.append(truncation_section(reports, series, names))
        files = files_section(reports, names)
        if files is not None:
            out.append(files)
    out.append(rejects_section(reports, names))
    what = "rows" if first.packed else "pairs" if first.overview.kind in ROW_KINDS else "episodes"
    legend = LEGEND if not first.packed else LEGEND.replace(
        "</div>", '<span><span class="run i sw">purple italics</span>: context the packer injected</span></div>', 1)
    samples = "".join((f"<h3>{escape(name)}</h3>" if len(reports) > 1 else "")
                      + samples_html(r.samples, r.seed, r.overview.path) for r, name in zip(reports, names))
    out.append(section("samples", f"Sample {what}", f"{what.capitalize()} of the {escape(first.sample_split)} split as "
                       f"the model sees them, token by token.", legend + samples))
    return out


def _script_json(figures: dict[str, str]) -> str:
    """``{id: figure}`` as JSON safe inside <script>: no ``<`` at all (``</script>``
    cannot end it early)."""
    text = "{" + ",".join(f"{orjson.dumps(k).decode()}:{v}" for k, v in figures.items()) + "}"
    return text.replace("<", "\\u003c")


def render_page(reports: list[DatasetReport], command: str) -> tuple[str, int]:
    """The HTML page of one dataset (or two, compared), and the number of plots on it."""
    names = dataset_names(reports)
    sections = sections_of(reports, names)
    plots = [p for s in sections for p in s.plots]
    figures = {p.id: p.figure for p in plots}
    paths = " vs ".join(escape(r.overview.path) for r in reports)
    title = "sftdata report: " + " vs ".join(names)
    nav = "".join(f'<a href="#{s.id}">{escape(s.nav)}</a>' for s in sections)
    body = (f'<header class="top"><h1>sftdata report: <code>{paths}</code></h1><p class="lead">What a model '
            f'trained on this dataset sees. In the samples at the end, <b>green text is trained</b> (the model learns '
            f'to write it); the rest is context it reads. Every plot answers to hover, zoom (drag) and a double '
            f'click (reset).</p><nav>{nav}</nav></header><main>{"".join(s.html for s in sections)}'
            f'<footer>Made by sftdata {escape(__version__)} with <code>{escape(command)}</code>. One self-contained '
            f'file: the plots are drawn by plotly.js, included in the page; nothing is fetched.</footer></main>')
    page = string.Template(asset("page.html")).substitute(
        title=escape(title), css=asset("report.css"), body=body, figures=_script_json(figures),
        plotly=plotly_js(), js=asset("report.js"))
    return page, len(plots)
