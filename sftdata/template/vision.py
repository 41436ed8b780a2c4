"""Media under a model's chat template: the processor a profile renders for, the placeholder
expansion of each rendered text, and where each item's tokens land in the ids.

A template renders one placeholder per media item (Qwen's ``<|image_pad|>`` inside
``<|vision_start|>...<|vision_end|>``); the model's processor replaces each, in order, by as
many placeholders as the item has tokens, then tokenizes. ``expanded`` does the same to a
planned render (its texts and the character spans of its replies, shifted), so the ids are
``processor.apply_chat_template(..., tokenize=True)``'s. ``media_spans`` then finds each
item's run in the ids::

    text:   <|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|> ...
    after:  <|im_start|>user\\n<|vision_start|><|image_pad|> x 391 <|vision_end|>Hi<|im_end|> ...
    span:   MediaSpan(offset=<the first <|image_pad|>'s position>, item)   (391 tokens)

Every media id is masked 0 by the profile's rule (``MaskRule.media_ids``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import ConfigError, RecordError
from ..media import read_processor_settings
from ..media.expand import expand_text, placeholders
from ..media.item import MediaItem, MediaSpan
from ..media.settings import IMAGE_FILES
from ..tokenize.hf import HFTokenizer
from .profile import TemplateProfile

MEDIA_MISMATCH = "media_placeholder_mismatch"


def folder_processor(tok: HFTokenizer) -> dict | None:
    """The processor settings of the model folder ``tok`` was loaded from (its
    ``preprocessor_config.json``: ``media.read_processor_settings``), or None where it has
    none. A processor of a family sftdata cannot count refuses the run (``ConfigError``)."""
    folder = Path(tok.path).parent if getattr(tok, "path", None) else None
    if folder is None or not any((folder / name).is_file() for name in IMAGE_FILES):
        return None
    return read_processor_settings(folder)


def with_processor(profile: TemplateProfile, settings: dict, tok: HFTokenizer) -> TemplateProfile:
    """``profile`` rendering for the processor ``settings``: its placeholder of each kind
    (which must be one token of ``tok``) recorded, and never trained by its rule. Raises
    ``ConfigError`` for a family whose expansion sftdata does not know, or a placeholder
    the tokenizer lacks."""
    ids = {}
    for kind, text in placeholders(settings).items():
        tid = tok.token_id(text)
        if tid is None or tid not in tok.special_tokens.values():
            raise ConfigError(f"the tokenizer {tok.name} has no special token {text!r}, the {kind} placeholder of its "
                              f"processor ({settings.get('family')}); give the model's own tokenizer folder")
        ids[kind] = tid
    rule = replace(profile.rule, media_ids=tuple(sorted(set(ids.values()))))
    return replace(profile, rule=rule, processor=dict(settings), media_ids=ids)


def expanded(profile: TemplateProfile, texts: Sequence[str], spans: Sequence[tuple], items: Sequence[MediaItem],
             where: str) -> tuple[tuple[str, ...], tuple, tuple[tuple[MediaItem, ...], ...]]:
    """Each rendered text with its placeholders expanded (the first ``n`` of ``items``,
    where it renders ``n``), its replies' character spans shifted by the expansion before
    them, and the items it holds. A text holding more placeholders than the record has
    items, or a render that holds fewer than all of them (a template that drops images
    would train the model on replies to pictures it never sees), is
    ``media_placeholder_mismatch``."""
    marks = placeholders(profile.processor)
    if not items and not any(m in text for text in texts for m in marks.values()):  # a text record
        return tuple(texts), tuple(spans), ((),) * len(texts)
    out_texts, out_spans, held = [], [], []
    most = max((sum(text.count(m) for m in set(marks.values())) for text in texts), default=0)
    if items and most < len(items):
        kinds = " or ".join(dict.fromkeys(marks[it.kind] for it in items))
        raise RecordError(MEDIA_MISMATCH, f"chat template {profile.template.name} renders {most} of the record's "
                          f"{len(items)} media items (it writes no {kinds} for the others), so the model would "
                          f"learn replies to pictures it never sees; use the vision model's own chat template", where)
    for text, sp in zip(texts, spans):
        at = sorted((i, m) for m in set(marks.values()) for i in _find_all(text, m))
        if len(at) > len(items):
            raise RecordError(MEDIA_MISMATCH, f"the render holds {len(at)} media placeholders where the record has "
                              f"{len(items)} media items", where)
        mine = tuple(items[:len(at)])
        if [m for _, m in at] != [marks[it.kind] for it in mine]:
            raise RecordError(MEDIA_MISMATCH, "the render's media placeholders are not the record's items in order",
                              where)
        new = expand_text(profile.processor, text, [(it.kind, it.count) for it in mine])
        starts = np.asarray([i for i, _ in at], dtype=np.int64)
        grow = np.cumsum([0] + [len(expand_text(profile.processor, marks[it.kind], [(it.kind, it.count)]))
                                - len(marks[it.kind]) for it in mine])

        def moved(c: int) -> int:
            return c + int(grow[int(np.searchsorted(starts, c, side="left"))])

        out_texts.append(new)
        out_spans.append(tuple((k, moved(a), moved(b)) for k, a, b in sp))
        held.append(mine)
    return tuple(out_texts), tuple(out_spans), tuple(held)


def _find_all(text: str, mark: str) -> list[int]:
    out, pos = [], text.find(mark)
    while pos >= 0:
        out.append(pos)
        pos = text.find(mark, pos + len(mark))
    return out


def media_spans(ids: np.ndarray, items: Sequence[MediaItem], profile: TemplateProfile,
                where: str) -> tuple[MediaSpan, ...]:
    """Each item's span in the episode ``ids``: the k-th item's tokens are the k-th run of
    media tokens, exactly its count of its kind's placeholder. Any other layout (a media
    token the record's items do not account for) is ``media_placeholder_mismatch``."""
    if not items:
        if profile.media_ids and np.isin(ids, list(profile.media_ids.values())).any():
            raise RecordError(MEDIA_MISMATCH, "the episode holds media placeholder tokens, but the record has no "
                              "media item", where)
        return ()
    pos = np.flatnonzero(np.isin(ids, list(profile.media_ids.values())))
    counts = np.fromiter((it.count.tokens for it in items), dtype=np.int64, count=len(items))
    if pos.size != int(counts.sum()):
        raise RecordError(MEDIA_MISMATCH, f"the episode holds {pos.size} media tokens where its {len(items)} media "
                          f"items expand to {int(counts.sum())}", where)
    first = np.cumsum(counts) - counts
    out = []
    for it, a, n in zip(items, first.tolist(), counts.tolist()):
        run = pos[a:a + n]
        if int(run[-1] - run[0]) != n - 1 or not np.all(ids[run] == profile.media_ids[it.kind]):
            raise RecordError(MEDIA_MISMATCH, f"the tokens of {it.kind} {len(out) + 1} ({it.uri}) are not one run of "
                              f"{n} placeholders", where)
        out.append(MediaSpan(int(run[0]), it))
    return tuple(out)


MEDIA_NEEDS_PROCESSOR = "media_needs_processor"


def needs_processor(where: str) -> RecordError:
    """The reject of a record with media prepared for a tokenizer without a processor."""
    return RecordError(MEDIA_NEEDS_PROCESSOR, "the record holds images or videos, but the tokenizer has no image "
                       "processor (no preprocessor_config.json in its folder), so their tokens cannot be counted; "
                       "prepare it with --tokenizer naming the vision model's own folder (its tokenizer.json, chat "
                       "template and preprocessor_config.json)", where)
