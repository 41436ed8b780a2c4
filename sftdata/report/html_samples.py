"""The sampled episodes (packed: rows) as HTML: every token a ``span.k`` holding its id
(``data-i``) and its text; tokens in runs (``span.run``) marked ``t`` when trained, ``m``
for a marker, ``i`` for context a packer injected. A row draws each segment in its own
colour, with the attention boundary between segments marked.
"""

from __future__ import annotations

from html import escape

from .pairs import SamplePair
from .samples import SampleEpisode, SampleRow
from .tokens import Run

OPEN_UP_TO = 600  # tokens: longer samples start collapsed
SEGMENT_COLOURS = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#c026d3", "#ca8a04", "#dc2626")
LINE_AFTER = ("<|END|>", "<|EOS|>")  # a line break after these markers, for reading (not part of any text)


def runs_html(runs: list[Run]) -> str:
    out = []
    for r in runs:
        cls = "run" + (" t" if r.trained else "") + (" m" if r.marker else "") + (" i" if r.injected else "")
        toks = "".join(f'<span class="k" data-i="{" ".join(map(str, g.ids))}">{escape(g.text, quote=False)}</span>'
                       for g in r.groups)
        out.append(f'<span class="{cls}">{toks}</span>')
        if r.marker and r.groups and r.groups[0].text in LINE_AFTER:
            out.append("<br>")
    return "".join(out)


def media_html(items) -> str:
    """A sampled episode's (segment's) images: each thumbnail with its label (the label alone
    where the image could not be read again)."""
    if not items:
        return ""
    figs = "".join(f'<figure title="{escape(t.uri)}">' + (f'<img src="{t.src}" alt="{escape(t.label)}">' if t.src else "")
                   + f'<figcaption>{escape(t.label)}</figcaption></figure>' for t in items)
    return f'<div class="media">{figs}</div>'


def _share(part: int | None, whole: int) -> str:
    return "" if part is None else f", {part:,} trained ({part / max(1, whole):.0%})"


def _why(chosen: bool, flag: str, seed: int) -> str:
    return f"asked for with {flag}" if chosen else f"random sample (seed {seed})"


def episode_html(s: SampleEpisode, seed: int, dataset: str) -> str:
    rec = "" if s.record is None else f" · input record {s.record:,}"
    head = (f'<b>{escape(s.split)} episode {s.episode:,}</b>{rec} · {s.length:,} tokens{_share(s.trained_tokens, s.length)}'
            f' <span class="why">· {_why(s.chosen, "--episode", seed)}</span>')
    more = ""
    if s.shown < s.length:
        more = (f'<p class="more">… {s.length - s.shown:,} more tokens not shown here; '
                f'<code>sftdata inspect {escape(dataset)} --split {escape(s.split)} --episode {s.episode} --tokens</code> '
                f'shows them all.</p>')
    warn = ""
    if s.rule_differs:
        warn = (f'<p class="bad">The stored mask differs from the mask rule at {s.rule_differs:,} token(s): run '
                f'<code>sftdata verify {escape(dataset)}</code>.</p>')
    is_open = " open" if s.length <= OPEN_UP_TO else ""
    return (f'<details class="sample" data-kind="episode" data-split="{escape(s.split)}" data-episode="{s.episode}"'
            f'{is_open}><summary>{head}</summary><div class="body">{warn}{media_html(s.media)}'
            f'<div class="tokens">{runs_html(s.runs)}</div>{more}</div></details>')


def row_html(s: SampleRow, seed: int, dataset: str) -> str:
    trained = "" if s.trained_tokens is None else f", {s.trained_tokens:,} trained"
    head = (f'<b>{escape(s.split)} row {s.row:,}</b> · {len(s.segments)} segment(s), {s.real_tokens:,} of '
            f'{s.row_len:,} tokens filled ({s.real_tokens / max(1, s.row_len):.0%}){trained}'
            f' <span class="why">· {_why(s.chosen, "--row", seed)}</span>')
    by_segment: dict[int, list[Run]] = {}
    for r in s.runs:
        by_segment.setdefault(r.segment, []).append(r)
    parts = []
    for g in s.segments:
        if g.index not in by_segment:
            break  # past the tokens shown
        if g.index:
            parts.append('<div class="boundary">attention boundary: the tokens below cannot see the ones above</div>')
        colour = SEGMENT_COLOURS[g.index % len(SEGMENT_COLOURS)]
        rec = "" if g.record is None else f", input record {g.record:,}"
        inj = f" · {g.prefix} injected context token(s) first" if g.prefix else ""
        cut = f" · its tokens from {g.episode_start:,}" if g.episode_start else ""
        parts.append(
            f'<div class="segment" style="--seg:{colour};--segbg:{colour}14" data-segment="{g.index}">'
            f'<div class="head">segment {g.index} (seq_id {g.index}) · episode {g.episode:,}{rec}{cut} · row offsets '
            f'{g.offset:,}–{g.offset + g.length - 1:,}, positions 0–{g.length - 1:,} · {g.trained_tokens:,} trained{inj}'
            f'</div>{media_html(g.media)}<div class="tokens">{runs_html(by_segment[g.index])}</div></div>')
    if s.shown < s.real_tokens:
        parts.append(f'<p class="more">… {s.real_tokens - s.shown:,} more tokens not shown here; '
                     f'<code>sftdata inspect {escape(dataset)} --split {escape(s.split)} --row {s.row} --tokens</code> '
                     f'shows them all.</p>')
    if s.padding:
        parts.append(f'<div class="padding">padding: {s.padding:,} × id {s.pad_id} at offsets {s.real_tokens:,}–'
                     f'{s.row_len - 1:,} (seq_id -1: not trained, attends to nothing)</div>')
    if s.rule_differs:
        parts.append(f'<p class="bad">The stored mask differs from the mask rule per segment at {s.rule_differs:,} '
                     f'token(s): run <code>sftdata verify {escape(dataset)}</code>.</p>')
    is_open = " open" if s.shown <= OPEN_UP_TO else ""
    return (f'<details class="sample" data-kind="row" data-split="{escape(s.split)}" data-row="{s.row}"{is_open}>'
            f'<summary>{head}</summary><div class="body">{"".join(parts)}</div></details>')


def pair_html(s: SamplePair, seed: int, dataset: str) -> str:
    """The prompt once, then chosen and rejected (KTO: the completion) side by side."""
    what = "pair" if s.kind == "pairs" else f"{s.kind} row"
    rec = "" if s.record is None else f" · input record {s.record:,}"
    label = "" if s.label is None else f" · label {'desirable' if s.label else 'undesirable'}"
    head = (f'<b>{escape(s.split)} {what} {s.row:,}</b>{rec}{label} · prompt {s.prompt_length:,} tokens'
            f' <span class="why">· {_why(s.chosen, "--row", seed)}</span>')
    cut = sum(x.shown < x.length for x in s.sides) + (s.prompt_shown < s.prompt_length)
    more = (f'<p class="more">… some tokens are not shown here; <code>sftdata inspect {escape(dataset)} --split '
            f'{escape(s.split)} --row {s.row} --tokens</code> shows them all.</p>') if cut else ""
    cols = "".join(f'<div class="side" data-side="{escape(x.name)}"><div class="head">{escape(x.name)} · '
                   f'{x.length:,} tokens{_share(x.trained_tokens, x.length)}</div>'
                   f'<div class="tokens">{runs_html(x.runs)}</div></div>' for x in s.sides)
    grid = (f'<div class="sides" style="display:grid;grid-template-columns:repeat({len(s.sides)},1fr);gap:12px">'
            f'{cols}</div>') if s.sides else ""
    columns = (f'<div class="head">columns</div><div class="tokens">{escape(s.columns, quote=False)}</div>'
               if s.columns is not None else "")
    body = (f'<div class="head">prompt (never trained)</div><div class="tokens">{runs_html(s.prompt)}</div>'
            f'{grid}{columns}{more}')
    is_open = " open" if s.prompt_shown + sum(x.shown for x in s.sides) <= OPEN_UP_TO else ""
    return (f'<details class="sample" data-kind="{escape(s.kind)}" data-split="{escape(s.split)}" data-row="{s.row}"'
            f'{is_open}><summary>{head}</summary><div class="body">{body}</div></details>')


LEGEND = ('<div class="legend"><span><span class="run t sw">green text</span> is trained (loss mask 1): the model '
          'learns to write it</span><span><span class="sw" style="color:#6b7280">grey text</span> is context only '
          '(mask 0)</span><span class="run m"><span class="k">&lt;|USER|&gt;</span></span> chat markers'
          '<span>hover a token for its id and text</span>'
          '<label><input type="checkbox" id="bounds"> show token boundaries</label></div>')


def samples_html(samples: list, seed: int, dataset: str) -> str:
    if not samples:
        return '<p class="intro">No episodes drawn (<code>--sample 0</code>).</p>'
    draw = row_html if isinstance(samples[0], SampleRow) else pair_html if isinstance(samples[0], SamplePair) \
        else episode_html
    return "".join(draw(s, seed, dataset) for s in samples)
