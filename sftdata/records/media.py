"""Where a record's images and videos stand: media parts, media lists and their placeholders
(pure, I/O-free). Each item becomes a ``MediaRef`` and one ``MEDIA_MARK`` in its turn's
text, where it stands (``turns.Turn.media``); reading the bytes is ``sftdata.media``'s job.

A record names its media in one of three ways (docs/FORMAT.md, "Images and videos"):

==============================================  ==========================================
content parts (OpenAI, TRL, transformers)       ``{"type": "image_url", "image_url":
                                                {"url": R}}`` (or ``"image_url": R``),
                                                ``{"type": "image", "image"|"url"|"path":
                                                R}`` (``"base64": B`` read as the URL
                                                ``data:;base64,B``), ``{"type": "video",
                                                "video"|"url"|"path": R}``, ``{"type":
                                                "video_url", "video_url": {"url": R}}``
top-level ``images`` / ``videos`` and           each ``<image>`` / ``<video>`` of a user
placeholders in the text (LLaMA-Factory)        or system text, in the order of the
                                                messages, takes the list's next item
top-level ``images`` / ``videos`` and bare      each ``{"type": "image"}`` part (no
parts (TRL's vision datasets)                   reference) takes the list's next item
==============================================  ==========================================

The list of a kind fills its bare parts when the record has any, else its placeholders;
counts must match (``media_placeholder_mismatch``), as LLaMA-Factory and TRL both refuse
otherwise: a record with ``images`` and no ``<image>`` is refused, not guessed (TRL would
put every image before the first user message's text, LLaMA-Factory refuses it). Without a
list, ``<image>`` is ordinary text, as before. A null list is no list (a Parquet column
holds null where a row has none).

Rejected, by reason: ``invalid_media`` (a reference that is not a non-empty string: a
list of frames, bytes, an object; a part giving two; a bare part with no list),
``media_in_reply`` (media in an assistant or tool message), ``media_placeholder_mismatch``,
``reserved_character`` (a literal ``MEDIA_MARK`` in text), ``non_text_content``
(``audios``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..errors import RecordError
from .turns import MEDIA_MARK, MediaRef, Turn
from .values import json_kind

MEDIA_PARTS = {"image": "image", "image_url": "image", "video": "video", "video_url": "video"}  # part type -> kind
REF_KEYS = {"image": ("image", "url", "path", "base64"), "video": ("video", "url", "path")}  # as transformers reads
LISTS = {"image": "images", "video": "videos"}  # kind -> the record's list (LLaMA-Factory, TRL)
LIST_KEYS = (*LISTS.values(), "audios")  # a record holding one is read by the general parser (plain.has_media_lists)
PLACEHOLDERS = {"image": "<image>", "video": "<video>"}  # LLaMA-Factory's defaults
MEDIA_ROLES = ("user", "system")
BARE = ""  # the ref of a part that names no item: the record's list gives it (``place_listed``)
EXAMPLE = {"image": "photos/cat.jpg", "video": "clips/intro.mp4"}


def check_text(text: str, what: str, where: str) -> None:
    """Refuse text holding ``MEDIA_MARK`` itself (it would read as a media item's place)."""
    if MEDIA_MARK in text:
        raise RecordError("reserved_character", f"{what} holds the character U+FFFC, which sftdata uses to mark "
                          f"where an image or video stands; remove it", where)


def _a(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _what(value: Any, kind: str) -> str:
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    if isinstance(value, list) and kind == "video":
        return "a list (frames?)"
    return json_kind(value)


def _fix(kind: str) -> str:
    return (f"give the {kind} as its file's path or URL, a string (a data: URL for inline bytes), "
            f"e.g. {EXAMPLE[kind]!r}")


def part_ref(part: dict, ptype: str, role: str, where: str, index: int, k: int) -> MediaRef:
    """The media item of content part ``k`` of message ``index`` (``ptype`` a key of
    ``MEDIA_PARTS``); ``BARE`` as its ref when it names none (a list gives it)."""
    kind = MEDIA_PARTS[ptype]
    at = f"message {index} content part {k}"
    if role not in MEDIA_ROLES:
        raise RecordError("media_in_reply", f"{at} is {_a(ptype)} {ptype!r} part in {_a(role)} {role} message; "
                          f"images and videos are read in user and system messages only (a reply or "
                          f"tool result holds text): move it into the user message before it, or drop it", where)
    if ptype.endswith("_url"):
        value = part.get(ptype)
        key = ptype
        if isinstance(value, dict):
            value, key = value.get("url"), f"{ptype}.url"
        given = [(key, value)]
    else:
        given = [(key, part[key]) for key in REF_KEYS[kind] if part.get(key) is not None]
        if not given:
            return MediaRef(kind, BARE)
        if len({repr(v) for _, v in given}) > 1:
            keys = " and ".join(repr(key) for key, _ in given)
            raise RecordError("invalid_media", f"{at} is {_a(ptype)} {ptype!r} part giving {keys}, different "
                              f"{kind}s; keep one", where)
    key, value = given[0]
    if not isinstance(value, str) or not value:
        said = "an empty string" if value == "" else _what(value, kind)
        raise RecordError("invalid_media", f"{at} is {_a(ptype)} {ptype!r} part whose {key!r} is {said}, not a "
                          f"reference: {_fix(kind)}", where)
    if key == "base64" and not value.startswith("data:"):
        value = "data:;base64," + value
    return MediaRef(kind, value)


def media_lists(obj: dict, where: str, media: bool = True) -> dict[str, list[str]]:
    """The record's top-level media lists by kind (``LISTS``; a lone string is a list of
    one, as LLaMA-Factory reads it); empty when it has none. Without ``media`` (a caller
    that reads no media) a list holding anything refuses the record, never drops it."""
    if "images" not in obj and "videos" not in obj and "audios" not in obj:  # LIST_KEYS; most records: three lookups
        return {}
    audios = obj.get("audios")
    if audios:
        raise RecordError("non_text_content", "the record holds 'audios'; sftdata reads images and videos only "
                          "(drop the audio, or the record)", where)
    if not media:
        key = next((key for key in LISTS.values() if obj.get(key)), None)
        if key is not None:
            raise RecordError("non_text_content", f"the record holds '{key}', which this command does not read: "
                              f"images and videos are read by prepare-chat and prepare-tool, with a vision "
                              f"model's processor", where)
        return {}
    out: dict[str, list[str]] = {}
    for kind, key in LISTS.items():
        items = obj.get(key)
        if items is None:
            continue
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, list):
            raise RecordError("invalid_media", f"'{key}' is {json_kind(items)}; give a list of {kind} paths or URLs "
                              f"(strings), one per {PLACEHOLDERS[kind]} in the messages", where)
        for j, item in enumerate(items):
            if not isinstance(item, str) or not item:
                said = "an empty string" if item == "" else _what(item, kind)
                raise RecordError("invalid_media", f"'{key}' item {j} is {said}, not a reference: {_fix(kind)}",
                                  where)
        out[kind] = items
    return out


def place_listed(indexed: list[tuple[int, Turn]], lists: dict[str, list[str]], where: str) -> list[Turn]:
    """The turns (each with its message index, -1 for a top-level system) with the
    record's ``lists`` in place: each kind's list fills its bare parts if the record has
    any, else the kind's placeholders in user and system text, in order. The turns as
    they are when the record has no list and no bare part."""
    bare = {m.kind: i for i, t in reversed(indexed) for m in t.media if m.ref == BARE}
    for kind, i in bare.items():
        if kind not in lists:
            raise RecordError("invalid_media", f"message {i} has {_a(kind)} {kind!r} part "
                              f"naming no {kind} and the record "
                              f"has no '{LISTS[kind]}' list: give the part its {kind} "
                              f"({{\"type\": \"{kind}\", \"{kind}\": {EXAMPLE[kind]!r}}}), or list the record's "
                              f"{kind}s in '{LISTS[kind]}', in order", where)
    if not lists:
        return [t for _, t in indexed]
    in_text = [k for k in lists if k not in bare]
    for kind, items in lists.items():
        _check_count(indexed, kind, items, kind in bare, where)
    pattern = re.compile("|".join(re.escape(s) for s in [MEDIA_MARK, *(PLACEHOLDERS[k] for k in in_text)]))
    kinds = {PLACEHOLDERS[k]: k for k in in_text}
    queues = {k: iter(items) for k, items in lists.items()}
    out = []
    for _, t in indexed:
        if t.role not in MEDIA_ROLES or not (t.media or any(PLACEHOLDERS[k] in t.text for k in in_text)):
            out.append(t)
            continue
        media: list[MediaRef] = []
        held = iter(t.media)

        def put(match: re.Match) -> str:
            if match.group() == MEDIA_MARK:
                ref = next(held)
                media.append(ref if ref.ref != BARE else MediaRef(ref.kind, next(queues[ref.kind])))
            else:
                kind = kinds[match.group()]
                media.append(MediaRef(kind, next(queues[kind])))
            return MEDIA_MARK

        out.append(replace(t, text=pattern.sub(put, t.text), media=tuple(media)))
    return out


def _check_count(indexed: list[tuple[int, Turn]], kind: str, items: list[str], bare: bool, where: str) -> None:
    """The slots of ``kind`` (bare parts, or placeholders in user and system text) are
    exactly as many as its list's items; a placeholder in a reply is refused by name."""
    mark = PLACEHOLDERS[kind]
    if bare:
        slots = sum(m.ref == BARE and m.kind == kind for _, t in indexed for m in t.media)
        held = f"{_plural(slots, kind + ' part')} naming no {kind} ({{\"type\": \"{kind}\"}})"
        fix = f"give one such part per listed {kind}, in the order of the list"
    else:
        for i, t in indexed:
            if t.role not in MEDIA_ROLES and mark in t.text:
                raise RecordError("media_in_reply", f"message {i} is {_a(t.role)} "
                                  f"{t.role} message holding {mark}, a placeholder of the record's '{LISTS[kind]}'; "
                                  f"images and videos are read in user and system messages only: move it into the "
                                  f"user message before it, or remove it", where)
        slots = sum(t.text.count(mark) for _, t in indexed if t.role in MEDIA_ROLES)
        held = f"{_plural(slots, mark + ' placeholder')}"
        fix = (f"put one {mark} where each {kind} stands (in a user or system message, in the order of the list), "
               f"or list exactly one {kind} per {mark}")
    if slots != len(items):
        raise RecordError("media_placeholder_mismatch", f"'{LISTS[kind]}' lists {_plural(len(items), kind)} but the "
                          f"messages hold {held}: {fix}", where)
