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
from ..media.expand import expand_text, item_token, placeholders
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
    """``profile`` rendering for the processor ``settings``: the token each kind's expansion
    repeats (``media.expand.item_token``, which must be one special token of ``tok``)
    recorded, and never trained by its rule. Raises ``ConfigError`` for a family whose
    expansion sftdata does not know, or a media token the tokenizer lacks."""
    ids = {}
    for kind in placeholders(settings):
        text = item_token(settings, kind)
        tid = tok.token_id(text)
        if tid is None or tid not in tok.special_tokens.values():
            raise ConfigError(f"the tokenizer {tok.name} has no special token {text!r}, the {kind} token of its "
                              f"processor ({settings.get('family')}); give the model's own tokenizer folder")
        ids[kind] = tid
    rule = replace(profile.rule, media_ids=tuple(sorted(set(ids.values()))))
    return replace(profile, rule=rule, processor=dict(settings), media_ids=ids)


def _count(text: str, marks) -> int:
    return sum(text.count(m) for m in marks)


def expanded(profile: TemplateProfile, texts: Sequence[str], spans: Sequence[tuple], items: Sequence[MediaItem],
             where: str) -> tuple[tuple[str, ...], tuple, tuple[tuple[MediaItem, ...], ...]]:
    """Each rendered text with its placeholders expanded (``media.expand.expand_text``: the
    first ``n`` of ``items``, where it renders ``n``), its replies' character spans moved by
    the expansions before them, and the items it holds. A text holding more placeholders
    than the record has items, or a render that holds fewer than all of them (a template
    that drops images would train the model on replies to pictures it never sees), is
    ``media_placeholder_mismatch``."""
    settings = profile.processor
    marks = set(placeholders(settings).values())
    if not items and not any(m in text for text in texts for m in marks):  # a text record
        return tuple(texts), tuple(spans), ((),) * len(texts)
    most = max((_count(text, marks) for text in texts), default=0)
    if items and most < len(items):
        kinds = " or ".join(dict.fromkeys(placeholders(settings)[it.kind] for it in items))
        raise RecordError(MEDIA_MISMATCH, f"chat template {profile.template.name} renders {most} of the record's "
                          f"{len(items)} media items (it writes no {kinds} for the others), so the model would "
                          f"learn replies to pictures it never sees; use the vision model's own chat template", where)
    out_texts, out_spans, held = [], [], []
    for text, sp in zip(texts, spans):
        mine = tuple(items[:_count(text, marks)])
        pairs = [(it.kind, it.count) for it in mine]
        try:
            new = expand_text(settings, text, pairs)

            def moved(c: int) -> int:  # a reply's end lies outside every placeholder: its prefix expands alone
                return len(expand_text(settings, text[:c], pairs[:_count(text[:c], marks)]))

            out_spans.append(tuple((k, moved(a), moved(b)) for k, a, b in sp))
        except ValueError as e:
            raise RecordError(MEDIA_MISMATCH, f"chat template {profile.template.name}: {e}", where) from None
        out_texts.append(new)
        held.append(mine)
    return tuple(out_texts), tuple(out_spans), tuple(held)


def media_spans(ids: np.ndarray, items: Sequence[MediaItem], profile: TemplateProfile,
                where: str) -> tuple[MediaSpan, ...]:
    """Each item's span in the episode ``ids``: its first token is the ``j``-th occurrence of
    its kind's token, ``j`` the tokens the earlier items of that token hold
    (``media.expand``); each token occurs exactly as often as its items' counts say. Any
    other layout is ``media_placeholder_mismatch``."""
    out: list[MediaSpan | None] = [None] * len(items)
    for kind, tid in profile.media_ids.items():
        pos = np.flatnonzero(ids == tid)
        mine = [k for k, it in enumerate(items) if it.kind == kind]
        counts = [items[k].count.tokens for k in mine]
        if pos.size != sum(counts):
            raise RecordError(MEDIA_MISMATCH, f"the episode holds {pos.size} {kind} tokens where its {len(mine)} "
                              f"{kind} item(s) expand to {sum(counts)}", where)
        first = 0
        for k, n in zip(mine, counts):
            out[k] = MediaSpan(int(pos[first]), items[k])
            first += n
    return tuple(out)

MEDIA_NEEDS_PROCESSOR = "media_needs_processor"


def needs_processor(where: str) -> RecordError:
    """The reject of a record with media prepared for a tokenizer without a processor."""
    return RecordError(MEDIA_NEEDS_PROCESSOR, "the record holds images or videos, but the tokenizer has no image "
                       "processor (no preprocessor_config.json in its folder), so their tokens cannot be counted; "
                       "prepare it with --tokenizer naming the vision model's own folder (its tokenizer.json, chat "
                       "template and preprocessor_config.json)", where)
