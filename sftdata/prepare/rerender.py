"""Input records rendered again as the build rendered them, by the libraries installed now:
what ``verify --retokenize`` holds the stored tokens to, to find library drift (a tokenizer or a
template engine that now encodes or renders the same record otherwise), for every kind of
dataset.

The records are read from the inputs the metadata records (``sources``: path, sha256,
``first_record``), with the options it records. An episodes dataset's go through the same
``process_chunk`` a prepare worker runs (mode, ``--max-tokens``, ``--reasoning``,
``--train-on``, the record size limit; the tokenizer rebuilt from ``tokenizer_state.json``,
a chat template learned again from its recorded text); a row dataset's (pairs, KTO rows,
RL prompts) through the same ``pref.run.start_chunk`` / ``finish_chunk`` a prepare-pref run
renders with (tokenizer, template, format, truncation, reasoning), a batch at a time (each
batch tokenized while the next renders). A record whose input is standard input, is gone or
has changed since is not rendered: its reason is returned instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from ..chat.tokenizer import HFTokenizer, tokenizer_from_state
from ..curate import CurateSettings
from ..errors import SftDataError
from ..pref.options import PrefOptions
from ..pref.render import one_process_run
from ..pref.run import finish_chunk, open_context, start_chunk
from ..records.turns import TurnPolicy
from ..sources import DEFAULT_MAX_RECORD_BYTES, STDIN, Input, inspect_source, iter_records
from ..sources.remote import url_protocol
from ..store.format import KIND_PROMPTS, ROW_KINDS
from ..tasks import overlapped
from ..template import ChatTemplate, TemplateProfile, learn_profile
from ..template.vision import with_processor
from ..tokenize import is_hf_state
from .chunk import process_chunk

ROW_BATCH = 512  # a row dataset's records rendered again at once


@dataclass
class Rerendered:
    """One input record rendered now: what it renders to (an episodes dataset: each
    episode's ids, one or one per reply; a row dataset: its row's entries, (ids, mask)
    each), or why it is rejected now (``rejected``: reason and message)."""

    where: str
    renders: list = field(default_factory=list)
    rejected: str | None = None


def _profile(tok: HFTokenizer, state: dict, train_on: str) -> TemplateProfile:
    """The recorded template's profile, learned again from its recorded text (and any
    variables the state records)."""
    ct = state.get("chat_template") or {}
    template = ChatTemplate(str(ct.get("name", "model")), str(ct.get("source", "file")), str(ct.get("text", "")))
    profile = learn_profile(template, tok, ct.get("variables") if isinstance(ct.get("variables"), dict) else None)
    if train_on == "last" and not profile.rule.last_reply_only:
        profile = replace(profile, rule=replace(profile.rule, last_reply_only=True))
    if isinstance(state.get("processor"), dict):  # a vision model's: the pinned settings count the media again
        profile = with_processor(profile, state["processor"], tok)
    return profile


def _raw_records(meta: dict, wanted: set[int], max_bytes: int) -> tuple[list, dict[int, str]]:
    """The raw records ``wanted`` from the recorded inputs, and why others cannot be read."""
    raws, unread = [], {}
    for s in meta.get("sources") or []:
        first, n, path = s.get("first_record"), s.get("records"), s.get("path")
        if not isinstance(first, int) or not isinstance(n, int) or not isinstance(path, str):
            continue
        mine = {r for r in wanted if first <= r < first + n}
        if not mine:
            continue
        if path == STDIN:
            unread.update(dict.fromkeys(mine, "its input was standard input, which cannot be read again"))
            continue
        try:
            info = inspect_source(Input(path, "url" if url_protocol(path) else "file"))
            info.first_record = first
            got = [rec for rec, _ in iter_records(info, max_bytes) if rec.record in mine]
        except SftDataError as e:
            unread.update(dict.fromkeys(mine, f"its input {path} cannot be read now ({e})"))
            continue
        if s.get("sha256") and info.sha256 and info.sha256 != s["sha256"]:
            unread.update(dict.fromkeys(mine, f"its input {path} changed since prepare read it (sha256 "
                                              f"{info.sha256[:12]}..., recorded {s['sha256'][:12]}...)"))
            continue
        raws += got
    return raws, unread


def _episodes(raws: list, tok, profile: TemplateProfile | None, opts: dict) -> tuple[list, list]:
    """The rejects of ``raws`` and (record, an episode's ids) of each episode they render to."""
    res = process_chunk(raws, tok, opts.get("mode", "chat"), opts.get("max_tokens"),
                        TurnPolicy(opts.get("reasoning", "keep"), opts.get("train_on", "all")), profile,
                        media_root=opts.get("media_root"))
    bounds = np.concatenate([[0], np.cumsum(res.lengths)])
    return res.rejects, [(record, np.asarray(res.ids[bounds[k]:bounds[k + 1]], dtype=np.int64))
                         for k, record in enumerate(res.sources.tolist())]


def _rows(raws: list, ctx) -> tuple[list, list]:
    """The rejects of ``raws`` and (record, its row's entries) of each row they render to."""
    rejects, rows = [], []
    batches = ((raws[i:i + ROW_BATCH], None) for i in range(0, len(raws), ROW_BATCH))
    with one_process_run() as pool:  # a batch tokenized as the next renders
        for started, _ in overlapped(batches, lambda batch: start_chunk(batch, ctx, pool)):
            res = finish_chunk(started, ctx, CurateSettings())
            rejects += res.rejects
            rows += [(record, list(row.parts)) for record, _, row in res.rows]
    return rejects, rows


def rerender_records(meta: dict, state: dict, records: Sequence[int]) -> tuple[dict[int, Rerendered], dict[int, str]]:
    """Each input record of ``records`` (global record numbers) rendered now, and why the
    others could not be (their input cannot be read again as it was). Raises
    ``SftDataError`` when the recorded tokenizer or template cannot be rebuilt."""
    opts = meta.get("options") or {}
    if meta.get("kind") in ROW_KINDS:
        ctx, _ = open_context(PrefOptions.from_recorded(opts), meta.get("kind") == KIND_PROMPTS)
        max_bytes, render = ctx.opts.max_record_bytes, partial(_rows, ctx=ctx)
    else:
        tok = tokenizer_from_state(state)
        profile = _profile(tok, state, opts.get("train_on", "all")) if is_hf_state(state) else None
        max_bytes = int(opts.get("max_record_bytes") or DEFAULT_MAX_RECORD_BYTES)
        render = partial(_episodes, tok=tok, profile=profile, opts=opts)
    raws, unread = _raw_records(meta, set(int(r) for r in records), max_bytes)
    rejects, renders = render(raws)
    out = {rec.record: Rerendered(rec.where) for rec in raws}
    for record, _where, reason, message in rejects:
        out[record].rejected = f"{reason}: {message}"
    for record, got in renders:
        out[record].renders.append(got)
    return out, unread
