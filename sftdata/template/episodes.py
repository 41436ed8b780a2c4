"""Render one conversation with a model's chat template: token ids and the loss mask.

    >>> profile = learn_profile(load_chat_template("llama3"), tok)     # once
    >>> out = render_conversation(conv, profile, tok)                  # per record
    >>> out.episodes[0].ids, out.episodes[0].mask

The text is rendered once for the whole conversation and tokenized once, added tokens
recognised and nothing added (no doubled BOS). Trained = each assistant reply from after
its role header through its end-of-turn token, located in the whole render
(``spans.locate_replies``) or read off ``{% generation %}`` blocks. Where a template
rewrites replies so that they cannot be located in the whole render, the conversation
becomes one episode per reply (the render up to that reply, only it trained) and
``per_reply`` says why; under a rule that trains every reply of an episode, each such
episode is flagged ``last_only`` (stored per episode: ``store.format.LAST_REPLY_FILE``),
so that verify and pack re-derive its mask from its ids and the flag. A reply that cannot be located even so is a ``RecordError``
naming the template and the message: never an all-zero or all-one mask.

Message text holding one of the tokenizer's special-token strings (``<|eot_id|>`` typed
by a user) is refused: tokenized in the render it would become the control token.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..chat.template_rule import mask_disagreement, rule_spans, without_media
from ..errors import RecordError, TemplateError
from ..media.item import MediaItem, MediaSpan
from ..records.conversation import Conversation
from ..records.turns import MediaRef
from ..tokenize.hf import Encoded, HFTokenizer
from .environment import RESERVED_CHARS
from .messages import tool_schemas
from .parts import missing_part
from .profile import TemplateProfile
from .spans import NotLocated, closed_blocks, locate_last_reply, locate_replies, reply_windows
from .vision import expanded, media_spans, needs_processor


@dataclass(frozen=True)
class Episode:
    """One rendered episode. ``spans``: each trained reply as ``(message index, start, end)``
    characters of ``text``; ``rule_mismatch``: the first token where the stored rule's mask
    differs from this one (None when they agree); ``last_only``: the episode is one reply's
    prefix and trains that reply only, whatever the rule says of the others; ``media``:
    where each media item's tokens are (``vision.media_spans``)."""

    ids: np.ndarray
    mask: np.ndarray
    text: str
    spans: tuple[tuple[int, int, int], ...]
    rule_mismatch: int | None
    last_only: bool = False
    media: tuple[MediaSpan, ...] = ()


@dataclass(frozen=True)
class TemplateRender:
    episodes: tuple[Episode, ...]
    per_reply: str | None = None  # why the conversation was served one episode per reply
    automatic: bool = False  # served per reply because its whole render is not exact (each episode last_only)

    @property
    def rule_agrees(self) -> bool:
        return all(e.rule_mismatch is None for e in self.episodes)


@lru_cache(maxsize=8)
def _special_re(specials: tuple[str, ...]) -> re.Pattern | None:
    if not specials:
        return None
    return re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))


def _strings(value, path: str):
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


_PATTERNS: dict[int, tuple] = {}


def _patterns(tok: HFTokenizer) -> tuple[re.Pattern | None, re.Pattern | None]:
    """The tokenizer's special-token pattern and the one-scan suspect pattern, once per
    tokenizer (Llama 3 has 256 special tokens: hashing them per record cost more than the scan)."""
    held = _PATTERNS.get(id(tok))
    if held is None or held[0] is not tok:
        if len(_PATTERNS) >= 8:
            _PATTERNS.clear()
        specials = tuple(tok.special_tokens)
        held = _PATTERNS[id(tok)] = (tok, _special_re(specials), _suspect_re(specials))
    return held[1], held[2]


def _trie(words: list[str]) -> str:
    """A regex matching exactly ``words`` (sorted), as a prefix tree: Python's ``re`` tries
    the alternatives of a flat alternation one by one at every position, and the tree
    starts with the specials' common prefix (``<|``), which it finds with a fast scan."""
    groups: dict[str, list[str]] = {}
    for w in words:
        if w:
            groups.setdefault(w[0], []).append(w[1:])
    alts = [re.escape(c) + _trie(rest) for c, rest in groups.items()]
    optional = "" in words
    if not alts:
        return ""
    body = alts[0] if len(alts) == 1 and not optional else "(?:" + "|".join(alts) + ")"
    return body + ("?" if optional else "")


def _suspect_re(specials: tuple[str, ...]) -> re.Pattern | None:
    """A special-token string anywhere: one scan finds whether a record holds any."""
    return re.compile(_trie(sorted(specials))) if specials else None


def check_texts(messages: list[dict], tools, tok: HFTokenizer, where: str = "") -> None:
    """Refuse message text holding a special-token string or a character sftdata reserves."""
    pattern, suspect = _patterns(tok)
    if all(len(m) == 2 and "role" in m and type(m.get("content")) is str for m in messages):  # plain chat
        joined = "\x00".join([m["content"] for m in messages])
    else:
        joined = "\x00".join(t for i, m in enumerate(messages)
                             for _, t in _strings({k: v for k, v in m.items() if k != "role"}, ""))
    # one scan of the record; each string by its path only when the scan finds something
    clean = not any(c in joined for c in RESERVED_CHARS) and (suspect is None or suspect.search(joined) is None)
    texts = [] if clean else \
        [(path, text) for i, m in enumerate(messages)
         for path, text in _strings({k: v for k, v in m.items() if k != "role"}, f"message {i}")]
    for path, text in texts:
        bad = next((c for c in RESERVED_CHARS if c in text), None)
        if bad is not None:
            raise RecordError("reserved_character", f"{path} holds the noncharacter U+{ord(bad):04X}, which "
                              f"sftdata uses to mark spans; remove it", where)
        hit = pattern.search(text) if pattern is not None else None
        if hit is not None:
            raise RecordError("special_token_in_text", f"{path} holds the special token {hit.group()!r} as "
                              f"text; the rendered conversation would contain that control token. Remove or "
                              f"escape it", where)
    if tools and pattern is not None:
        hit = pattern.search(json.dumps(tools, ensure_ascii=False))
        if hit is not None:
            raise RecordError("special_token_in_text", f"a tool schema holds the special token {hit.group()!r}", where)


def _episode(enc: Encoded, profile: TemplateProfile, text: str, spans, name: str, where: str,
             last_only: bool = False, items: tuple[MediaItem, ...] = ()) -> Episode:
    """The episode of a rendered ``text`` (tokens ``enc``): trained = the tokens of ``spans``."""
    lo, hi = enc.token_ranges([(a, b) for _, a, b in spans])
    empty = np.flatnonzero(hi <= lo)
    if empty.size:
        raise RecordError("reply_not_located", f"chat template {name}: assistant message {spans[empty[0]][0]} "
                          f"renders to no token", where)
    n = int(enc.ids.shape[0])
    mask = np.zeros(n, dtype=np.uint8)
    for a, b in zip(lo.tolist(), hi.tolist()):  # one slice per reply
        mask[a:b] = 1
    media = media_spans(enc.ids, items, profile, where) if profile.processor is not None else ()
    without_media(enc.ids, mask, profile.rule)
    if int(hi.max() - lo.min()) >= n and mask.all():
        raise RecordError("reply_not_located", f"chat template {name}: every token would be trained; the "
                          f"template's replies cannot be told from the rest", where)
    flag = np.array([True]) if last_only else None
    starts, ends = rule_spans(enc.ids, profile.rule, last_only=flag)  # the stored rule finds the same spans
    agrees = np.array_equal(starts, lo) and np.array_equal(ends, hi)
    return Episode(enc.ids, mask, text, tuple(spans),
                   None if agrees else mask_disagreement(enc.ids, mask, profile.rule, last_only), last_only, media)


@dataclass(frozen=True)
class Planned:
    """A conversation rendered and its replies located, not yet tokenized: one text per
    episode, and each episode's trained replies as ``(message index, start, end)``; with a
    processor, each text's placeholders expanded and ``media`` the items each text holds."""

    texts: tuple[str, ...]
    spans: tuple[tuple[tuple[int, int, int], ...], ...]
    per_reply: str | None = None
    automatic: bool = False  # per reply without --per-reply: each episode trains its last reply only (flagged)
    media: tuple[tuple[MediaItem, ...], ...] = ()

    def items(self, i: int) -> tuple[MediaItem, ...]:
        return self.media[i] if self.media else ()


class MissingPart(Exception):
    """A render lacks a part of the record (``parts.missing_part``): ``reason``, what."""

    def __init__(self, reason: str, what: str):
        super().__init__(what)
        self.reason, self.what = reason, what


def _checked(text: str, messages: list[dict], spans, tools, last: int | None = None) -> None:
    """Raise ``MissingPart`` when ``text`` lacks a part of ``messages`` (up to ``last``)."""
    found = missing_part(text, messages if last is None else messages[:last + 1], reply_windows(spans), tools)
    if found is not None:
        raise MissingPart(*found)


def dropped(name: str, e: MissingPart, where: str) -> RecordError:
    """The rejection of a record whose render lacks a part, saying what to do."""
    fix = {"template_drops_reasoning": "; prepare with --reasoning drop (no reasoning trained) or --reasoning inline "
                                      "(the reasoning written into the reply as text), or use a template that "
                                      "renders reasoning_content",
           "template_drops_tool_calls": "; use a chat template that renders tool calls (--chat-template model:NAME "
                                       "or FILE.jinja)",
           "template_drops_tools": "; use a chat template that renders the tools it is given (or write the tool "
                                  "schemas into the record's system message)",
           "template_drops_tool_results": "; use a chat template that renders tool results"}
    other = "; the template rewrites the text (look in it for text the template splits on, such as </think>)"
    return RecordError(e.reason, f"chat template {name} drops {e.what} from its render, so it would be lost (never "
                       f"kept altered){fix.get(e.reason, other)}", where)


def plan_messages(messages: list[dict], tools: list[dict] | None, profile: TemplateProfile, tok: HFTokenizer,
                  where: str = "", trained: list[int] | None = None, kwargs: dict | None = None,
                  media: tuple[MediaItem, ...] = ()) -> Planned:
    """Render already-built message dicts and locate the replies to train (``trained``:
    indices of the assistant messages; default all; ``kwargs``: the record's template
    variables). Each render must hold every part of the messages (``parts``): where the
    whole render lacks one, each reply is rendered as the last of the conversation up to
    it. Under a processor (``TemplateProfile.processor``), each text's media placeholders
    are expanded here, the one place, for ``media`` (the messages' items in order:
    ``vision.expanded``). Raises ``RecordError`` (``template_error``, ``reply_not_located``,
    ``template_drops_*``, ``special_token_in_text``, ``reserved_character``,
    ``media_placeholder_mismatch``)."""
    planned = _plan(messages, tools, profile, tok, where, trained, kwargs)
    if profile.processor is None:
        return planned
    texts, spans, held = expanded(profile, planned.texts, planned.spans, media, where)
    return Planned(texts, spans, planned.per_reply, planned.automatic, held)


def _plan(messages: list[dict], tools: list[dict] | None, profile: TemplateProfile, tok: HFTokenizer,
          where: str, trained: list[int] | None, kwargs: dict | None) -> Planned:
    """``plan_messages`` before any media placeholder is expanded."""
    name = profile.template.name
    check_texts(messages, tools, tok, where)
    replies = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
    wanted = set(trained) if trained is not None else None
    chosen = replies if wanted is None else [k for k in replies if k in wanted]
    try:
        if profile.generation:
            def whole():
                return _blocks(profile, messages, tools, kwargs, replies, chosen, where)

            def alone_k(k):
                return _block_alone(profile, messages, tools, kwargs, k, where)
        else:
            fn, sent_fn = profile.render_fn(tools, kwargs), profile.sentinel_fn(tools, kwargs)

            def whole():
                text, spans = locate_replies(fn, messages, profile.layout, sentinel_fn=sent_fn)
                picked = set(chosen)
                spans = [sp for sp in spans if sp[0] in picked]
                _checked(text, messages, spans, tools)
                return text, spans

            def alone_k(k):
                return _alone(profile, fn, sent_fn, messages, k, name, where)
        if profile.replies_alone:
            why = "the template's replies are served one at a time (learned from its probe conversations, or " \
                  "--per-reply)"
        elif profile.rule.last_reply_only:  # --train-on last: the conversation up to its trained reply
            text, span = alone_k(chosen[-1])
            _checked(text, messages, span, tools, chosen[-1])
            return Planned((text,), (span,))
        else:
            try:
                text, spans = whole()
                return Planned((text,), (tuple(spans),))
            except NotLocated as e:
                why = (f"message {e.index}: " if e.index is not None else "") + e.why
            except MissingPart as e:
                why = f"the whole render drops {e.what}"
        # a reply its own prefix renders inexactly too is refused by what is wrong with it
        # (reply_not_located, template_drops_*): no render of the record keeps it whole
        alone = [alone_k(k) for k in chosen]
        for k, (text, span) in zip(chosen, alone):
            _checked(text, messages, span, tools, k)
        # under a rule that trains every reply, each episode is flagged to train its last reply only
        automatic = len(alone) > 1 and not profile.rule.last_reply_only
        return Planned(tuple(t for t, _ in alone), tuple(sp for _, sp in alone), per_reply=why, automatic=automatic)
    except MissingPart as e:
        raise dropped(name, e, where) from None
    except TemplateError as e:
        raise RecordError(e.reason, str(e), where) from None


def _blocks(profile: TemplateProfile, messages: list[dict], tools, kwargs, replies: list[int], chosen: list[int],
            where: str) -> tuple[str, list[tuple[int, int, int]]]:
    """The whole render of a template with ``{% generation %}`` blocks and its blocks (of
    the ``chosen`` replies: one block per reply, in order, or the untrained ones cannot be
    told). Raises ``RecordError``, ``MissingPart``."""
    name = profile.template.name
    variables = {**profile.variables, **kwargs} if kwargs else profile.variables
    out = profile.template.render(messages, tools=tools, variables=variables)
    if not out.generation:
        raise RecordError("reply_not_located", f"chat template {name} marks no generation block in this "
                          f"conversation; nothing would be trained", where)
    spans = [(-1, a, b) for a, b in closed_blocks(out.text, out.generation, profile.layout.end_texts, profile.layout.header_texts)]
    _checked(out.text, messages, [(-1, 0, 0)], tools)
    if chosen != replies:
        if len(spans) != len(replies):
            raise RecordError("reply_not_located", f"chat template {name} marks {len(spans)} generation "
                              f"block(s) for {len(replies)} assistant messages, so the untrained ones cannot "
                              f"be left out", where)
        picked = set(chosen)
        spans = [(k, a, b) for k, (_, a, b) in zip(replies, spans) if k in picked]
    return out.text, spans


def _block_alone(profile: TemplateProfile, messages: list[dict], tools, kwargs, k: int,
                 where: str) -> tuple[str, tuple[tuple[int, int, int], ...]]:
    """Reply ``k`` alone under a template with ``{% generation %}`` blocks: the render of
    the conversation up to it, and its last block."""
    name = profile.template.name
    variables = {**profile.variables, **kwargs} if kwargs else profile.variables
    out = profile.template.render(messages[:k + 1], tools=tools, variables=variables)
    if not out.generation:
        raise RecordError("reply_not_located", f"chat template {name} marks no generation block for assistant "
                          f"message {k}; nothing would be trained", where)
    a, b = closed_blocks(out.text, out.generation, profile.layout.end_texts, profile.layout.header_texts)[-1]
    return out.text, ((k, a, b),)


def _alone(profile: TemplateProfile, fn, sent_fn, messages: list[dict], k: int, name: str,
           where: str) -> tuple[str, tuple[tuple[int, int, int], ...]]:
    """Reply ``k`` alone: the render of the conversation up to it, and its spans."""
    try:
        return locate_last_reply(fn, messages, profile.layout, k, sentinel_fn=sent_fn)
    except NotLocated as e:
        raise RecordError("reply_not_located", f"chat template {name}: assistant message {k} cannot be "
                          f"located ({e.why}), so its trained tokens cannot be told from the token ids and the record "
                          f"is left out; the template writes this reply without a header or end-of-turn token of its "
                          f"own (a reply right after another assistant message often is: join the two in the record)",
                          where) from None


def episodes_of(planned: Planned, encoded: list[Encoded], profile: TemplateProfile, where: str = "") -> TemplateRender:
    """The episodes of a ``Planned`` conversation, given its texts' tokens (``encode_rendered``
    of each, in order). Raises ``RecordError`` (``reply_not_located``)."""
    name = profile.template.name
    return TemplateRender(tuple(_episode(enc, profile, text, spans, name, where, planned.automatic, planned.items(i))
                                for i, (enc, text, spans) in enumerate(zip(encoded, planned.texts, planned.spans))),
                          per_reply=planned.per_reply, automatic=planned.automatic)


def render_messages(messages: list[dict], tools: list[dict] | None, profile: TemplateProfile, tok: HFTokenizer,
                    where: str = "", trained: list[int] | None = None) -> TemplateRender:
    """Render already-built message dicts, tokenize once, and mask (``plan_messages``, then
    ``episodes_of``). Raises ``RecordError`` (see ``plan_messages``)."""
    planned = plan_messages(messages, tools, profile, tok, where, trained)
    return episodes_of(planned, [tok.encode_rendered(t) for t in planned.texts], profile, where)


def trained_replies(turns) -> list[int]:
    """Indices of the assistant turns to train (not context: weight 0, ``--train-on last``)
    of ``turns`` (or of a Conversation's turns)."""
    turns = turns.turns if isinstance(turns, Conversation) else turns
    return [i for i, t in enumerate(turns) if t.role == "assistant" and not t.untrained]


def turn_media(turns, media: dict[MediaRef, MediaItem] | None, profile: TemplateProfile,
               where: str) -> tuple[MediaItem, ...]:
    """The media items of ``turns`` in order (``media``: each reference read and counted,
    the record's). Raises ``RecordError``: ``media_needs_processor`` under a profile without
    a processor, ``media_unsupported`` where no item was read (a command that takes no media)."""
    refs = [r for t in turns for r in t.media]
    if not refs:
        return ()
    if profile.processor is None:
        raise needs_processor(where)
    if media is None:
        raise RecordError("media_unsupported", "this command does not prepare records with images or videos yet; "
                          "prepare them with sftdata prepare-chat", where)
    return tuple(media[r] for r in refs)


def plan_conversation(conv: Conversation, profile: TemplateProfile, tok: HFTokenizer, where: str = "",
                      turns: tuple | None = None, media: dict[MediaRef, MediaItem] | None = None) -> Planned:
    """``plan_messages`` of a validated ``Conversation`` (``turns``: these instead of its
    turns as given), as the template reads it (``TemplateProfile.messages``), training the
    assistant turns that are not context; ``media``: its references read and counted."""
    turns = conv.given_turns if turns is None else turns
    return plan_messages(profile.messages(conv, turns), tool_schemas(conv), profile, tok, where,
                         trained_replies(turns), conv.template_kwargs, turn_media(turns, media, profile, where))


def render_conversation(conv: Conversation, profile: TemplateProfile, tok: HFTokenizer,
                        where: str = "", turns: tuple | None = None,
                        media: dict[MediaRef, MediaItem] | None = None) -> TemplateRender:
    """Render a validated ``Conversation`` (``turns``: these instead of its turns as given)
    with the profile's template, tokenize and mask."""
    planned = plan_conversation(conv, profile, tok, where, turns, media)
    return episodes_of(planned, [tok.encode_rendered(t) for t in planned.texts], profile, where)


def tokenizer_state(tok: HFTokenizer, profile: TemplateProfile) -> dict:
    """``tokenizer_state.json`` for a dataset made with this tokenizer and template."""
    return {**tok.state(), **profile.state()}
