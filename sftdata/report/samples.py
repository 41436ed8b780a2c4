"""Episodes (packed: rows) the report shows token by token: the ones asked for, then a
seeded sample. Each is drawn as runs of tokens (``tokens.token_runs``), at most a
budget of tokens in all, so a page of long episodes stays small: an episode past its
share shows its first tokens and says how many follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..chat.loss_rule import LossRule, MarkerRule
from ..errors import UsageError
from ..packing.plan import row_mask
from ..store.format import ROW_KINDS
from ..store.reader import Dataset
from .pairs import SamplePair, sample_pair
from .thumbnails import Thumb, thumbs
from .tokens import Run, token_runs
from .views import Tokenizer, episode_flag, media_label, media_numbers, read_episode, read_row, row_flags, sample_ids, span_end

TOKEN_BUDGET = 48_000  # tokens drawn on one page, all samples together (about 2 MB of HTML)
MIN_SHOWN = 512  # an episode always shows at least this many tokens (when it has them)


@dataclass
class SampleEpisode:
    split: str
    episode: int
    chosen: bool  # asked for (--episode); else drawn by the seeded sample
    record: int | None  # input record number, when stored
    length: int
    trained_tokens: int | None
    shown: int  # tokens drawn: the first ``shown`` of ``length``
    runs: list[Run]
    rule_differs: int  # tokens whose stored mask is not the mask rule's
    media: list[Thumb] = field(default_factory=list)  # its images (videos): label and thumbnail


@dataclass
class SampleSegment:
    index: int  # its seq_id in the row
    offset: int
    length: int
    prefix: int  # injected context tokens at its start (stream packing)
    episode: int  # the source split's episode id
    episode_start: int  # the first episode token it holds
    record: int | None
    trained_tokens: int
    media: list[Thumb] = field(default_factory=list)  # its images (videos): label and thumbnail


@dataclass
class SampleRow:
    split: str
    row: int
    chosen: bool
    row_len: int
    real_tokens: int
    padding: int
    pad_id: int | None
    trained_tokens: int | None
    segments: list[SampleSegment]
    shown: int  # real tokens drawn (padding is summarised)
    runs: list[Run]
    rule_differs: int


def pick(n: int, chosen: list[int] | None, sample: int, seed: int) -> list[tuple[int, bool]]:
    """(id, chosen) pairs: the ``chosen`` ids in the order given, then ``sample`` more
    drawn with ``sample_ids`` (ids already chosen are not repeated)."""
    if sample < 0:
        raise UsageError(f"--sample must be 0 or more, got {sample}")
    out = [(int(i), True) for i in dict.fromkeys(chosen or [])]
    seen = {i for i, _ in out}
    if sample and n:
        out += [(i, False) for i in sample_ids(n, sample, seed) if i not in seen]
    return out


def budget(count: int, total: int = TOKEN_BUDGET) -> int:
    """Tokens each of ``count`` samples may draw out of ``total``."""
    return max(MIN_SHOWN, total // max(1, count))


def sample_episode(ds: Dataset, split: str, episode: int, tok: Tokenizer, *, chosen: bool, limit: int,
                   rule: LossRule | None = None) -> SampleEpisode:
    _, ids, mask, trained, record, _ = read_episode(ds, split, episode)
    rule = rule or MarkerRule(tok.ids)
    flag = episode_flag(ds, split, episode, rule)
    derived = rule.masks(ids, np.array([ids.shape[0]]), last_only=np.array([flag]) if flag else None)
    differs = 0 if mask is None else int((derived != trained).sum())
    shown = min(ids.shape[0], limit)
    spans = ds.media_spans(split, episode)
    labels = _media_runs(spans, ids)
    return SampleEpisode(split=split, episode=int(episode), chosen=chosen, record=record,
                         length=int(ids.shape[0]), trained_tokens=None if mask is None else int(trained.sum()),
                         shown=shown, runs=token_runs(ids[:shown], trained[:shown], tok, media=labels),
                         rule_differs=differs, media=thumbs(list(spans)))


def _media_runs(spans, ids: np.ndarray, base: int = 0) -> list[tuple[int, int, str]]:
    """(start, end, label) of each media span (offsets into ``ids[base:]``), numbered from 1 per
    kind, shifted by ``base``."""
    return [(base + s.offset, base + span_end(ids[base:], s), media_label(s, k))
            for s, k in zip(spans, media_numbers(spans))]


def sample_row(ds: Dataset, split: str, row: int, tok: Tokenizer, *, chosen: bool, limit: int,
               rule: LossRule | None = None) -> SampleRow:
    _, ids, mask, trained, seg = read_row(ds, split, row)
    L = ids.shape[0]
    rule = rule or MarkerRule(tok.ids)
    flags = row_flags(ds, split, row, len(seg), rule)
    differs = 0 if mask is None else int((row_mask(ids, seg, L, rule, last_only=flags) != trained).sum())
    real = int(seg.length.sum())
    segment = np.full(L, -1, np.int64)
    injected = np.zeros(L, bool)
    segments = []
    row_media = ds.media_spans(split, row)
    labels: list[tuple[int, int, str]] = []
    for i in range(len(seg)):
        a, b = int(seg.offset[i]), int(seg.offset[i] + seg.length[i])
        segment[a:b] = i
        injected[a:a + int(seg.prefix[i])] = True
        mine = [replace(s, offset=s.offset - a) for s in row_media if a <= s.offset < b]  # numbered per segment
        labels += _media_runs(mine, ids, a)
        segments.append(SampleSegment(i, a, b - a, int(seg.prefix[i]), int(seg.episode[i]),
                                      int(seg.episode_start[i]), None if seg.source[i] < 0 else int(seg.source[i]),
                                      int(trained[a:b].sum()), thumbs(mine)))
    shown = min(real, limit)
    return SampleRow(split=split, row=int(row), chosen=chosen, row_len=L, real_tokens=real, padding=L - real,
                     pad_id=(ds.packing or {}).get("pad_token_id"),
                     trained_tokens=None if mask is None else int(trained.sum()), segments=segments, shown=shown,
                     runs=token_runs(ids[:shown], trained[:shown], tok, segment=segment[:shown],
                                     injected=injected[:shown], media=labels),
                     rule_differs=differs)


def samples(ds: Dataset, split: str, tok: Tokenizer, *, sample: int, seed: int, episodes: list[int] | None = None,
            rows: list[int] | None = None, token_budget: int = TOKEN_BUDGET, rule: LossRule | None = None
            ) -> list[SampleEpisode] | list[SampleRow] | list[SamplePair]:
    """The episodes (packed: rows; pairs, KTO rows, RL prompts: ``SamplePair``s) the page
    draws token by token, ``token_budget`` tokens in all (at least ``MIN_SHOWN`` each)."""
    if ds.kind in ROW_KINDS:
        if episodes:
            raise UsageError(f"{ds.root} holds {ds.kind}: use --row N to choose the pairs (rows) the report shows")
        sp = ds.split(split)
        chosen = pick(sp.num_items // ds.entries, rows, sample, seed)
        limit = budget(len(chosen), token_budget)
        return [sample_pair(ds, split, r, tok, chosen=c, limit=limit) for r, c in chosen]
    packed = ds.kind == "packed"
    if packed and episodes:
        raise UsageError("a packed dataset holds rows: use --row R to choose the rows the report shows")
    if rows and not packed:
        raise UsageError("--row is for packed datasets; this one holds episodes: use --episode")
    n = ds.split(split).num_items
    chosen = pick(n, rows if packed else episodes, sample, seed)
    limit = budget(len(chosen), token_budget)
    if packed:
        return [sample_row(ds, split, r, tok, chosen=c, limit=limit, rule=rule) for r, c in chosen]
    return [sample_episode(ds, split, e, tok, chosen=c, limit=limit, rule=rule) for e, c in chosen]
