"""The processor's placeholder expansion, as text: a template renders one placeholder per
media item (Qwen's ``<|image_pad|>``); the model's processor replaces each, in order, by the
text of that item's tokens before it tokenizes. ``expand_text`` does the same, so the ids a
tokenizer makes of its result are the ids ``processor.apply_chat_template(..., tokenize=True)``
returns. Pure functions of (settings, counts)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError
from .counts import MediaCount
from .item import IMAGE, VIDEO
from .settings import FAMILY_NAMES, QWEN

# what a family's template renders for one item, and the token its expansion repeats
QWEN_TOKENS = {IMAGE: "<|image_pad|>", VIDEO: "<|video_pad|>"}


def placeholders(settings: dict) -> dict[str, str]:
    """The placeholder text a family's template writes for one item of each kind."""
    family = settings.get("family")
    if family in QWEN:
        return dict(QWEN_TOKENS)
    raise ConfigError(f"sftdata does not yet expand the media placeholders of {FAMILY_NAMES.get(family, family)}")


def media_tokens(settings: dict) -> tuple[str, ...]:
    """The special tokens an expansion writes that stand for media (never trained)."""
    return tuple(placeholders(settings).values())


def _qwen(kind: str, count: MediaCount) -> str:
    return QWEN_TOKENS[kind] * count.tokens


def expand_text(settings: dict, text: str, items: Sequence[tuple[str, MediaCount]]) -> str:
    """``text`` with the placeholder of each ``(kind, count)`` in ``items`` replaced, in order
    of appearance, by that item's expansion. Raises ``ValueError`` when the text holds
    another number of placeholders than ``items`` (the caller names the record)."""
    marks = placeholders(settings)
    out: list[str] = []
    pos = 0
    for k, (kind, count) in enumerate(items):
        mark = marks[kind]
        at = text.find(mark, pos)
        if at < 0:
            raise ValueError(f"the render holds {k} {kind} placeholder(s) {mark!r} where the record has {len(items)} "
                             f"media items")
        out.append(text[pos:at])
        out.append(_qwen(kind, count))
        pos = at + len(mark)
    rest = text[pos:]
    for mark in set(marks.values()):
        if mark in rest:
            raise ValueError(f"the render holds more placeholders {mark!r} than the record's {len(items)} media items")
    out.append(rest)
    return "".join(out)
