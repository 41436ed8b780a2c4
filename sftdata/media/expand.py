"""The processor's placeholder expansion, as text: a template renders one placeholder per
media item; the model's processor replaces each, in order, by the text of that item's tokens
before it tokenizes (``ProcessorMixin.get_text_with_replacements``). ``expand_text`` does the
same, so the ids a tokenizer makes of its result are the ids
``processor.apply_chat_template(..., tokenize=True)`` returns. Pure functions of (settings, counts).

=============  ==================  =================================================================
family         placeholder         one item's expansion (``n`` = ``count.tokens``)
=============  ==================  =================================================================
Qwen2/2.5-VL   ``<|image_pad|>``   ``<|image_pad|>`` * n (a video: ``<|video_pad|>`` * n)
Qwen3-VL       ``<|image_pad|>``   as Qwen2-VL; a video, for each temporal patch ``i``:
                                   ``<{t_i:.1f} seconds><|vision_start|>`` + ``<|video_pad|>`` *
                                   (n / t) + ``<|vision_end|>``, in place of the template's whole
                                   ``<|vision_start|><|video_pad|><|vision_end|>`` where it wrote
                                   one (``Qwen3VLProcessor.get_text_with_replacements`` drops
                                   that wrapper, so the patches' own marks are the only ones)
Gemma 3        ``<start_of_image>``  ``\\n\\n<start_of_image>`` + ``<image_soft_token>`` * n +
                                   ``<end_of_image>\\n\\n``
LLaVA-1.5,     ``<image>``         ``<image>`` * n
LLaVA-NeXT
Idefics3,      ``<image>``         for each tile row: (``<fake_token_around_image><row_r_col_c>`` +
SmolVLM                            ``<image>`` * s) per column, then ``\\n``; then ``\\n`` +
                                   ``<fake_token_around_image><global-img>`` + ``<image>`` * s +
                                   ``<fake_token_around_image>`` (s = ``image_seq_len``; an image
                                   of one tile: the global part alone, without the ``\\n``)
=============  ==================  =================================================================

The token strings are the processor's defaults unless the pinned settings name others
(``settings["tokens"]``, from the tokenizer's attributes: ``settings.family_tokens``).

An expansion holds exactly ``count.tokens`` copies of its item's token (``item_token``), and
no text outside the expansions holds any (a stray placeholder is an error here), so the k-th
item's first token is found among the ids as the ``j``-th occurrence of its token, ``j`` the
tokens the earlier items of that token hold. The copies are contiguous for every family
except Idefics3 / SmolVLM with tiles (``<fake_token_around_image><row_r_col_c>`` and ``\\n``
between the tiles' runs) and Qwen3-VL video (the timestamp and the vision marks between the
temporal patches' runs).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..errors import ConfigError
from .counts import MediaCount
from .item import IMAGE, VIDEO
from .settings import FAMILY_NAMES, FAMILY_TOKENS, QWEN, family_tokens, known_family


def _family(settings: dict) -> str:
    return known_family(settings, FAMILY_TOKENS, "sftdata does not expand the media placeholders of {name}: it "
                                                 "expands those of {supported}")


def placeholders(settings: dict) -> dict[str, str]:
    """The placeholder text a family's template writes for one item of each kind it takes
    (video: the Qwen family only)."""
    family, tokens = _family(settings), family_tokens(settings)
    out = {IMAGE: tokens["boi_token"] if family == "gemma3" else tokens["image_token"]}
    if family in QWEN:
        out[VIDEO] = tokens["video_token"]
    return out


def item_token(settings: dict, kind: str) -> str:
    """The token an item's expansion writes ``count.tokens`` times: the positions the model fills
    with the item's vision features."""
    _family(settings)
    tokens = family_tokens(settings)
    return tokens["video_token"] if kind == VIDEO else tokens["image_token"]


def media_tokens(settings: dict) -> tuple[str, ...]:
    """The tokens that stand for media, masked 0 always: each kind's ``item_token``, the
    positions the model fills with vision features (Gemma 3's ``<image_soft_token>``,
    Idefics3's ``<image>``).

    The tokens that frame them (Gemma 3's ``<start_of_image>`` / ``<end_of_image>``, Idefics3's
    ``<fake_token_around_image>``, ``<global-img>`` and ``<row_r_col_c>``, Qwen's vision marks)
    are not media: the model embeds them as text, like the ``\\n`` and the timestamps an
    expansion also writes. They are never trained all the same, since an expansion only
    stands in a user (or system) turn; and a placeholder anywhere else (a literal
    ``<start_of_image>`` or ``<image>`` in a reply) is an error in ``expand_text``. So a media
    span is one token repeated ``count.tokens`` times, whose count verify re-derives."""
    return tuple(item_token(settings, kind) for kind in placeholders(settings))


def _repeat(settings: dict, kind: str, count: MediaCount) -> str:
    return item_token(settings, kind) * count.tokens


def _gemma3(settings: dict, kind: str, count: MediaCount) -> str:
    t = family_tokens(settings)
    return f"\n\n{t['boi_token']}{t['image_token'] * count.tokens}{t['eoi_token']}\n\n"


def _tiles(settings: dict, kind: str, count: MediaCount) -> str:
    """``Idefics3Processor.replace_image_token`` / SmolVLM's ``get_image_prompt_string``."""
    t, seq = family_tokens(settings), settings["image_seq_len"]
    rows, cols = count.grid
    if count.tokens != seq * (rows * cols + 1):
        raise ValueError(f"an image of {rows}x{cols} tiles holds {seq * (rows * cols + 1)} tokens of {seq} a tile, "
                         f"not {count.tokens}: the count is not one these settings make")
    fake, image = t["fake_image_token"], t["image_token"] * seq
    glob = f"{fake}{t['global_image_token']}{image}{fake}"
    if rows == 0 and cols == 0:
        return glob
    grid = "".join("".join(f"{fake}<row_{r + 1}_col_{c + 1}>{image}" for c in range(cols)) + "\n" for r in range(rows))
    return f"{grid}\n{glob}"


def _qwen3(settings: dict, kind: str, count: MediaCount) -> str:
    """``Qwen3VLProcessor.replace_video_token``: each temporal patch after its time."""
    if kind == IMAGE:
        return _repeat(settings, kind, count)
    t, merge = family_tokens(settings), settings["video"]["merge_size"]
    frames, h, w = count.grid
    if len(count.timestamps) != frames:
        raise ValueError(f"a video of {frames} temporal patches has {len(count.timestamps)} timestamps: the count is "
                         f"not one Qwen3-VL's video_count makes")
    patch = t["vision_start_token"] + t["video_token"] * (h * w // merge ** 2) + t["vision_end_token"]
    return "".join(f"<{s:.1f} seconds>{patch}" for s in count.timestamps)


ARTICLES = {IMAGE: "an image", VIDEO: "a video"}
EXPANSIONS: dict[str, Callable[[dict, str, MediaCount], str]] = {
    "qwen2_vl": _repeat, "qwen2_5_vl": _repeat, "qwen3_vl": _qwen3, "gemma3": _gemma3, "llava": _repeat,
    "llava_next": _repeat, "idefics3": _tiles, "smolvlm": _tiles}


def expansion(settings: dict, kind: str, count: MediaCount) -> str:
    """The text one item's placeholder becomes (its processor's ``replace_image_token`` /
    ``replace_video_token``)."""
    family = _family(settings)
    if kind not in placeholders(settings):
        raise ConfigError(f"{FAMILY_NAMES[family]} takes no {kind} in sftdata: video is expanded for the Qwen "
                          f"family only")
    return EXPANSIONS[family](settings, kind, count)


def _marks(settings: dict) -> dict[str, str]:
    """What the processor's scan replaces, in the order it tries them -> the kind of item: a
    Qwen3-VL video's placeholder with the vision marks the template wraps it in, as a whole
    (the processor collapses that wrapper first), then each kind's placeholder."""
    marks = {mark: kind for kind, mark in placeholders(settings).items()}
    if settings["family"] == "qwen3_vl":
        t = family_tokens(settings)
        marks = {t["vision_start_token"] + t["video_token"] + t["vision_end_token"]: VIDEO, **marks}
    return marks


def expand_text(settings: dict, text: str, items: Sequence[tuple[str, MediaCount]]) -> str:
    """``text`` with each placeholder replaced, in order of appearance, by the expansion of
    the next ``(kind, count)`` of ``items``, as the processor does: one scan for the
    placeholders of every kind, so a placeholder inside an expansion is never read again.
    Raises ``ValueError`` when the text holds another number of placeholders than ``items``,
    one of another kind than the item it meets, or a media token no placeholder wrote (the
    caller names the record)."""
    kinds = _marks(settings)
    for token in set(media_tokens(settings)) - set(kinds):  # Gemma's soft token: the model would take it for an image's
        if token in text:
            raise ValueError(f"the render holds {text.count(token)} media token(s) {token!r} that no placeholder "
                             f"wrote: the model would read them as image positions")
    found = list(re.finditer("|".join(re.escape(m) for m in kinds), text))
    if len(found) != len(items):
        raise ValueError(f"the render holds {len(found)} media placeholder(s) "
                         f"({', '.join(map(repr, placeholders(settings).values()))}) where "
                         f"the record has {len(items)} media item(s)")
    out: list[str] = []
    pos = 0
    for k, (m, (kind, count)) in enumerate(zip(found, items)):
        if kinds[m.group()] != kind:
            raise ValueError(f"the render's placeholder {k + 1} is {m.group()!r} ({ARTICLES[kinds[m.group()]]}'s) "
                             f"where the record's media item {k + 1} is {ARTICLES[kind]}")
        out.append(text[pos:m.start()])
        out.append(expansion(settings, kind, count))
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)
