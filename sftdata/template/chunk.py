"""The episodes of a chunk of planned conversations in one pass: the same episodes and
errors as ``episodes_of`` record by record, with the per-record numpy work done once over
the chunk's concatenated tokens.

    >>> chunk_episodes(plans, encoded, profile, tok, wheres)   # [TemplateRender | RecordError, ...]

Every episode's located replies become token ranges in one pass
(``HFTokenizer.token_ranges_many``), the masks are one ``spans_mask`` over the
concatenation, and the stored rule is applied once to the concatenation with a stop
between episodes (``segment_rule_mask``), so the rule's proof is one comparison::

    episodes:  <h> a E | <h> b E <h> c E
    located:    0  1 1 |  0  1 1  0  1 1
    rule:       0  1 1 |  0  1 1  0  1 1     (equal: both episodes proven)

An episode whose masks differ carries the first differing token (``rule_mismatch``), as
``episodes_of`` reports it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..chat.template_rule import segment_rule_mask, spans_mask, without_media
from ..errors import RecordError
from ..tokenize.hf import Encoded, HFTokenizer
from .episodes import Episode, Planned, TemplateRender, episodes_of
from .profile import TemplateProfile
from .vision import media_spans


def _first_per_group(groups: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """For each group ``0..size-1``, the first of ``values`` in it (``groups`` sorted), else -1."""
    out = np.full(size, -1, dtype=np.int64)
    if groups.size:
        uniq, at = np.unique(groups, return_index=True)
        out[uniq] = values[at]
    return out


def chunk_episodes(plans: Sequence[Planned], encoded: Sequence[Encoded], profile: TemplateProfile,
                   tok: HFTokenizer, wheres: Sequence[str]) -> list[TemplateRender | RecordError]:
    """``episodes_of(plan, its texts' encodings, profile, where)`` of every plan, or the
    ``RecordError`` it raises; ``encoded``: every plan's texts encoded, in order."""
    texts = [t for p in plans for t in p.texts]
    spans = [sp for p in plans for sp in p.spans]
    if not texts or any(not sp for sp in spans):  # an episode without replies: the record-by-record path
        return [_one(p, list(encoded[a:a + len(p.texts)]), profile, w)
                for p, w, a in zip(plans, wheres, np.cumsum([0] + [len(p.texts) for p in plans]).tolist())]
    n_ep = len(texts)
    lo, hi = tok.token_ranges_many(texts, encoded, [[(a, b) for _, a, b in sp] for sp in spans])
    n_tok = np.fromiter((e.ids.shape[0] for e in encoded), dtype=np.int64, count=n_ep)
    n_span = np.fromiter((len(sp) for sp in spans), dtype=np.int64, count=n_ep)
    tok_start = np.cumsum(n_tok) - n_tok
    span_first = np.cumsum(n_span) - n_span
    owner = np.repeat(np.arange(n_ep), n_span)
    total = int(n_tok.sum())
    ids = np.concatenate([e.ids for e in encoded])
    mask = without_media(ids, spans_mask(total, lo + tok_start[owner], hi + tok_start[owner]), profile.rule)
    # the checks of ``episodes_of``, per episode: a reply on no token, every token trained
    empty = np.flatnonzero(hi <= lo)
    first_empty = _first_per_group(owner[empty], empty - span_first[owner[empty]], n_ep)
    trained = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
    all_trained = (np.maximum.reduceat(hi, span_first) - np.minimum.reduceat(lo, span_first) >= n_tok) & \
        (trained[tok_start + n_tok] - trained[tok_start] == n_tok)
    flags = np.fromiter((p.automatic for p in plans for _ in p.texts), dtype=bool, count=n_ep)
    diff = np.flatnonzero(segment_rule_mask(ids, n_tok, profile.rule, last_only=flags if flags.any() else None)
                          != mask)
    mismatch = _first_per_group(np.searchsorted(tok_start + n_tok, diff, side="right"), diff, n_ep)
    first_empty, all_trained, mismatch = first_empty.tolist(), all_trained.tolist(), mismatch.tolist()
    starts, ends = tok_start.tolist(), (tok_start + n_tok).tolist()
    name = profile.template.name
    out: list[TemplateRender | RecordError] = []
    e = 0
    for p, where in zip(plans, wheres):
        episodes = []
        for i, (text, sp) in enumerate(zip(p.texts, p.spans)):
            try:
                media = media_spans(encoded[e].ids, p.items(i), profile, where) if profile.processor else ()
            except RecordError as err:
                out.append(err)
                break
            if first_empty[e] >= 0:
                out.append(RecordError("reply_not_located", f"chat template {name}: assistant message "
                                       f"{sp[first_empty[e]][0]} renders to no token", where))
                break
            if all_trained[e]:
                out.append(RecordError("reply_not_located", f"chat template {name}: every token would be trained; "
                                       f"the template's replies cannot be told from the rest", where))
                break
            a, b = starts[e], ends[e]
            episodes.append(Episode(encoded[e].ids, mask[a:b], text, tuple(sp),
                                    None if mismatch[e] < 0 else mismatch[e] - a, p.automatic, media))
            e += 1
        else:
            out.append(TemplateRender(tuple(episodes), per_reply=p.per_reply, automatic=p.automatic))
            continue
        e += len(p.texts) - len(episodes)  # the rest of a refused record's episodes
    return out


def _one(plan: Planned, encoded: list[Encoded], profile: TemplateProfile, where: str) -> TemplateRender | RecordError:
    try:
        return episodes_of(plan, encoded, profile, where)
    except RecordError as e:
        return e
