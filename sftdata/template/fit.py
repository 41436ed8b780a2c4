"""The length filter (``--max-tokens``) for a model's chat template.

The same rule as for sftdata's markers, counted in the template's own tokens: the turns
before the first user turn (a system message) plus the first *pair* (a user turn and
everything up to the next user turn) must fit in ``max_tokens``; each later pair must
fit alone; the first later pair that does not fit is dropped with everything after it;
a record whose first pair does not fit is rejected as ``too_long``.

A template renders a conversation as a whole (a prefix may render differently from the
start of the whole), so a pair's length is measured on what would be stored: with
``n_k`` the tokens of the render of the conversation up to the end of pair ``k``, the
head and first pair take ``n_1`` tokens and pair ``k`` takes ``n_k - n_(k-1)``. The kept
turns are rendered again as a conversation of their own. A record whose render fits
whole is kept as it is, without measuring its pairs.

Media items are never cut: a pair holding an image goes or stays whole, with its
expanded placeholders counted in its length, and a record whose first pair cannot fit
with its media is rejected as ``media_truncated``.
"""

from __future__ import annotations

from ..errors import RecordError, TemplateError
from ..records.conversation import Conversation
from ..tokenize.hf import HFTokenizer
from .episodes import TemplateRender, render_conversation, trained_replies, turn_media
from .messages import tool_schemas
from .profile import TemplateProfile
from .vision import expanded

MEDIA_TRUNCATED = "media_truncated"


def _pair_ends(turns) -> list[int]:
    """The end (exclusive turn index) of each pair: a pair runs to the next user turn."""
    users = [i for i, t in enumerate(turns) if t.role == "user"]
    return users[1:] + [len(turns)]


def render_within(conv: Conversation, profile: TemplateProfile, tok: HFTokenizer, max_tokens: int | None,
                  where: str = "", turns: tuple | None = None, media: dict | None = None) -> tuple[TemplateRender, int]:
    """Render ``conv`` (``turns``: these instead of its turns as given; ``media``: its
    references read and counted) under the length filter: the render and how many trailing
    pairs were dropped. Raises ``RecordError`` (``too_long``, ``media_truncated``, or what
    ``render_conversation`` raises)."""
    turns = conv.given_turns if turns is None else turns
    out = render_conversation(conv, profile, tok, where, turns, media)
    if max_tokens is None or max(len(e.ids) for e in out.episodes) <= max_tokens:
        return out, 0
    ends = _pair_ends(turns)
    messages = profile.messages(conv, turns)
    render = profile.render_fn(tool_schemas(conv), conv.template_kwargs)
    prev = 0
    for k, end in enumerate(ends):
        try:
            text = render(messages[:end])
        except TemplateError as e:  # the template refuses this prefix (e.g. it must end with a reply)
            raise RecordError(e.reason, f"{e} (while measuring the first {end} turns for --max-tokens)",
                              where) from None
        held = turn_media(turns[:end], media, profile, where)  # a message a turn: the items of these turns
        if profile.processor is not None:  # the placeholders counted as the stored episode holds them
            text = expanded(profile, (text,), ((),), held, where)[0][0]
        n = len(tok.encode_rendered(text).ids)
        if k == 0 and n > max_tokens:
            if held:
                raise RecordError(MEDIA_TRUNCATED, f"the first user/assistant pair with the turns before it and its "
                                  f"{len(held)} media item(s) ({sum(i.count.tokens for i in held)} media tokens, never "
                                  f"cut) renders to {n} tokens with chat template {profile.template.name} > "
                                  f"--max-tokens {max_tokens}; raise --max-tokens, or lower the processor's "
                                  f"max_pixels", where)
            raise RecordError("too_long", f"the first user/assistant pair with the turns before it renders to {n} "
                              f"tokens with chat template {profile.template.name} > --max-tokens {max_tokens}", where)
        if k > 0 and n - prev > max_tokens:
            kept = turns[:ends[k - 1]]
            if not trained_replies(kept):  # --train-on last: the reply it trains is in a dropped pair
                raise RecordError("too_long", f"the pair holding the trained reply does not fit in --max-tokens "
                                  f"{max_tokens} (it renders to {n - prev} tokens with chat template "
                                  f"{profile.template.name})", where)
            return render_conversation(conv, profile, tok, where, kept, media), len(ends) - k
        prev = n
    return out, 0
