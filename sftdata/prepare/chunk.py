"""One chunk of records parsed, validated, rendered and masked (pure but for the tokenizer and
the worker's memo), and chunk results merged and renumbered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..chat.render import render_chunk
from ..chat.tokenizer import ChatTokenizer, HFTokenizer
from ..curate import CurateSettings, concat_keys, conversation_keys
from ..errors import RecordError
from ..records.conversation import parse_record
from ..records.turns import TurnPolicy
from ..sources import RawRecord
from ..store.format import KIND_EPISODES
from ..store.rows import Rows
from ..template import TemplateProfile, records_episodes
from ..template.vision import needs_processor
from ..tokenize.memo import MemoStats, SegmentMemo
from .media import MediaStep, record_refs
from .results import ChunkResult


def process_chunk(items: Sequence[RawRecord], tok: ChatTokenizer | HFTokenizer, mode: str,
                  max_tokens: int | None, policy: TurnPolicy = TurnPolicy(),
                  profile: TemplateProfile | None = None, memo: SegmentMemo | None = None,
                  curate: CurateSettings = CurateSettings(), media_root: str | None = None) -> ChunkResult:
    """Parse, validate and render one chunk of records (pure but for the tokenizer and
    the worker's ``memo`` of encoded texts, which changes no id), and compute the keys of
    its accepted records (``curate``: the exact-duplicate key always) from the same parse.
    With a ``profile`` (a model's chat template), ``template_chunk`` renders them (and reads
    their media, ``media_root``: ``--media-root``); sftdata's markers take no media (a record
    holding any is ``non_text_content``, as it always was)."""
    if profile is not None:
        return template_chunk(items, tok, profile, mode, max_tokens, policy, curate, media_root)
    convs, kept, rejects = _parsed(items, mode, policy)
    repairs: Counter = Counter(name for conv in convs for name in set(conv.repairs))
    turns: Counter = Counter()
    chunk = render_chunk(convs, tok, wheres=[r.where for r in kept], max_tokens=max_tokens, memo=memo)
    sources = []
    accepted = {}  # record -> (where, conversation), for the keys
    truncated = dropped = 0
    for rec, conv, r in zip(kept, convs, chunk.results):
        if isinstance(r, RecordError):
            rejects.append((rec.record, rec.where, r.reason, r.detail))
            continue
        if conv.turn_counts:
            turns.update(conv.turn_counts)
        sources.append(rec.record)
        accepted[rec.record] = (rec.where, conv)
        if r:
            truncated += 1
            dropped += r
    rejects.sort()
    sources = np.asarray(sources, dtype=np.int64)
    return ChunkResult(
        ids=chunk.ids, mask=chunk.mask, lengths=chunk.lengths, sources=sources,
        rejects=rejects, repairs=repairs, turns=turns, truncated=truncated, pairs_dropped=dropped, records=len(items),
        keys=conversation_keys(accepted, sources, chunk.ids, chunk.lengths, curate),
        memo=memo.take_stats() if memo is not None else None)


def _parsed(items: Sequence[RawRecord], mode: str, policy: TurnPolicy,
            media: bool = False) -> tuple[list, list, list]:
    """The conversations of ``items`` and their records, and the rejects of those that
    cannot be read or parsed (record, where, reason, message); ``media``: their images and
    videos read (a model's template renders them, or says it cannot: ``media_needs_processor``);
    without, a record holding any is ``non_text_content``, as before."""
    convs, kept, rejects = [], [], []
    for rec in items:
        if rec.reject is not None:  # decided while reading (too large to read)
            rejects.append((rec.record, rec.where, *rec.reject))
            continue
        try:
            convs.append(parse_record(rec.raw, rec.where, mode, policy, media=media))
            kept.append(rec)
        except RecordError as e:
            rejects.append((rec.record, rec.where, e.reason, e.detail))
    return convs, kept, rejects


def _with_media(convs: list, kept: list, rejects: list, profile: TemplateProfile,
                media_root: str | None) -> tuple[list, list, list]:
    """The conversations whose media are read and counted (the media step, each reference
    once per chunk: ``media.MediaStep``), their records and media (None: a record without);
    a record with media but no processor to count it (``media_needs_processor``), or with a
    bad item (its reason), goes to ``rejects``."""
    step = MediaStep(profile.processor, media_root) if profile.processor is not None else None
    out_convs, out_kept, media = [], [], []
    for conv, rec in zip(convs, kept):
        held = None
        try:
            if step is not None:
                held = step.record_media(conv, rec.where)
            elif record_refs(conv):
                raise needs_processor(rec.where)
        except RecordError as e:
            rejects.append((rec.record, rec.where, e.reason, e.detail))
            continue
        out_convs.append(conv)
        out_kept.append(rec)
        media.append(held)
    return out_convs, out_kept, media


def template_chunk(items: Sequence[RawRecord], tok: HFTokenizer, profile: TemplateProfile, mode: str,
                   max_tokens: int | None, policy: TurnPolicy = TurnPolicy(),
                   curate: CurateSettings = CurateSettings(), media_root: str | None = None) -> ChunkResult:
    """``process_chunk`` with a model's chat template: each record becomes the episodes the
    template renders (one per reply where it must), each episode's mask the rendered one,
    which its stored rule re-derives (a record where it does not is rejected by name), and
    its media spans (``ChunkResult.media``)."""
    ids, masks, lengths, sources, mismatches, flags, spans = [], [], [], [], [], [], []
    repairs: Counter = Counter()
    turns: Counter = Counter()
    truncated = dropped = per_reply = per_reply_eps = automatic = 0
    convs, kept, rejects = _parsed(items, mode, policy, media=True)
    convs, kept, media = _with_media(convs, kept, rejects, profile, media_root)
    accepted = {}
    results = records_episodes([(c, r.where) for c, r in zip(convs, kept)], profile, tok, max_tokens, media)
    for rec, conv, out in zip(kept, convs, results):
        if isinstance(out, RecordError):
            rejects.append((rec.record, rec.where, out.reason, out.detail))
            if out.reason == "rule_mismatch":
                mismatches.append((rec.record, rec.where))
            continue
        for r in set(out.repairs):  # the record's repairs under this template
            repairs[r] += 1
        turns.update(out.counts)
        accepted[rec.record] = (rec.where, conv)
        for ep in out.episodes:
            ids.append(ep.ids)
            masks.append(ep.mask)
            lengths.append(ep.ids.shape[0])
            sources.append(rec.record)
            flags.append(ep.last_only)
            spans.append(ep.media)
        if out.per_reply:
            per_reply += 1
            per_reply_eps += len(out.episodes)
            automatic += out.automatic
        if out.pairs_dropped:
            truncated += 1
            dropped += out.pairs_dropped
    rejects.sort()
    all_ids = np.concatenate(ids) if ids else np.empty(0, np.uint32)
    lengths, sources = np.asarray(lengths, dtype=np.int64), np.asarray(sources, dtype=np.int64)
    return ChunkResult(
        ids=all_ids, mask=np.concatenate(masks) if masks else np.empty(0, np.uint8), lengths=lengths, sources=sources,
        rejects=rejects, repairs=repairs, turns=turns, truncated=truncated, pairs_dropped=dropped,
        records=len(items), per_reply_records=per_reply, per_reply_episodes=per_reply_eps, mismatches=mismatches,
        keys=conversation_keys(accepted, sources, all_ids, lengths, curate), per_reply_automatic=automatic,
        last_only=np.asarray(flags, dtype=np.uint8) if any(flags) else None,
        media=spans if any(spans) else None)


@dataclass
class EpisodeWork:
    """What a worker or partition task makes of a chunk of records: episodes
    (``process_chunk``), with the duplicate keys (the exact ones always: prepare's summary
    counts them) and the contamination, from the same parse as the tokens. Another kind of
    row gives its own work (``merged``; ``outcome``: a chunk's result; ``chunk``: that
    result, and its rows per kind, for a partition task to stage)."""

    tok: object
    profile: TemplateProfile | None
    mode: str
    max_tokens: int | None
    policy: TurnPolicy
    media_root: str | None = None

    @staticmethod
    def merged(acc: ChunkResult | None, res: ChunkResult | None) -> ChunkResult:
        """``res``'s counts (``COUNTS``, repairs, turns, the memo's), rejects and keys added
        to ``acc`` (tokens are not kept); None: an empty result."""
        acc, res = acc or empty_result(), res or empty_result()
        acc.keys = concat_keys(acc.keys, res.keys)
        acc.rejects += res.rejects
        acc.mismatches += res.mismatches
        acc.repairs.update(res.repairs)
        acc.turns.update(res.turns)
        for name in COUNTS:
            setattr(acc, name, getattr(acc, name) + getattr(res, name))
        if res.memo is not None:
            acc.memo = acc.memo or MemoStats()
            acc.memo.add(res.memo)
        return acc

    def outcome(self, items: Sequence[RawRecord], memo, curate: CurateSettings) -> ChunkResult:
        return process_chunk(items, self.tok, self.mode, self.max_tokens, self.policy, self.profile, memo, curate,
                             self.media_root)

    def chunk(self, items, memo, curate: CurateSettings) -> tuple[ChunkResult, dict[str, Rows]]:
        res = self.outcome(items, memo, curate)
        return res, {KIND_EPISODES: episode_rows(res)}


def episode_rows(res: ChunkResult) -> Rows:
    """A chunk's episodes as rows: with their "last reply only" flags and media spans."""
    return Rows(res.ids, res.mask, res.lengths, res.sources, flags=res.last_only, media=res.media)


COUNTS = ("truncated", "pairs_dropped", "records", "per_reply_records", "per_reply_episodes", "per_reply_automatic")


def empty_result() -> ChunkResult:
    return ChunkResult(np.empty(0, np.uint32), np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.int64),
                       [], Counter(), Counter(), 0, 0, 0)

