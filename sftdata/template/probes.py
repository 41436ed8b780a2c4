"""The probe conversations a template is learned from, and the layout and mask rule that
fit them (``fit_probes``): each probe's episodes located as records' will be
(``probe_episodes``), each checked to hold every part of its conversation, and the rule
checked to give exactly each probe's mask. ``leaves_leading_untrained``: whether that rule
leaves a reply that opens a conversation untrained, as the render places it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..chat.template_rule import MaskRule, mask_disagreement
from ..errors import TemplateError, TemplateLimitError
from ..records.turns import Conversation, ToolCall, Turn
from ..tokenize.hf import HFTokenizer
from .headers import Found, appended_stop, asked_ids, generation_layout, header_ids, learn_layout, marker_ids
from .parts import missing_part
from .profile import TemplateProfile
from .spans import (
    Layout,
    NotLocated,
    closed_blocks,
    locate_last_reply,
    locate_replies,
    reply_windows,
    token_mask,
)

# a schema as real tool data writes one: every parameter described (Command R's tool template
# prints each parameter's description and fails on a parameter without one)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}


def _conv(*turns: Turn, tools: tuple[dict, ...] = ()) -> Conversation:
    return Conversation(tuple(turns), tool_specs=tools)


# every template must render these
PROBES: tuple[Conversation, ...] = (
    _conv(Turn("user", "Hi there"), Turn("assistant", "Hello! How can I help?")),
    _conv(Turn("user", "What is 2+2?"), Turn("assistant", "4."), Turn("user", "And 3+3?"), Turn("assistant", "6.")),
)


# each capability's probe, tried on its own
CAPABILITY_PROBES: dict[str, Conversation] = {
    "system": _conv(Turn("system", "Be brief."), Turn("user", "What is 2+2?"), Turn("assistant", "4.")),
    "tools": _conv(Turn("user", "Weather in Paris?"),
                   Turn("assistant", "", (ToolCall("get_weather", {"city": "Paris"}, "call12345", '{"city": "Paris"}'),)),
                   Turn("tool", "18C and sunny", tool_call_id="call12345"),
                   Turn("assistant", "It is 18C and sunny in Paris."), tools=(WEATHER,)),
    "reasoning": _conv(Turn("user", "What is 2+2?"),
                       Turn("assistant", "4.", reasoning="Two and two make four.")),
}


@dataclass(frozen=True)
class Fit:
    layout: Layout
    rule: MaskRule
    appended_stop: str | None
    replies_alone: bool


def fit_probes(draft: TemplateProfile, probes: list[tuple[list[dict], list[dict] | None]], tok: HFTokenizer,
         render_full, added: list[str], replies_alone: bool, learn_alone: bool = True, ends: tuple[str, ...] = ()) -> Fit:
    """The layout and rule that fit every probe, checked: each probe's parts are in its
    render and the rule gives exactly its mask. Raises ``TemplateError`` (``NotLocated``
    when a probe's replies are found one at a time only and ``learn_alone`` is False:
    a capability's probe may not turn every record into one episode per reply). ``ends``:
    end-of-turn texts to use besides those learned."""
    name = draft.template.name

    def render(messages, tools=None):
        return render_full(messages, tools).text

    if draft.generation:
        layout, inclusive = generation_layout(render_full, probes, draft.generation_prompt, added, name)
        stop = None
    else:
        found = Found([draft.generation_prompt] if draft.generation_prompt else [], list(ends))
        learn_layout(render, probes, draft.generation_prompt, added, name, found)
        stop = appended_stop(tok, found.ends) if found.unclosed else None
        ends = found.ends + ([stop] if stop is not None and stop not in found.ends else [])
        layout, inclusive = Layout(tuple(found.headers), tuple(ends)), True
    end_ids = []
    markers = [t for t in layout.end_texts if t not in added and not draft.generation]  # text ends (_text_marker)
    for t in layout.end_texts:
        if t in markers:
            continue
        tid = tok.token_id(t)
        if tid is None or t not in tok.added_tokens:
            raise TemplateError(f"chat template {name}: the end-of-turn text {t!r} is not one token of this "
                                f"tokenizer; use the tokenizer the template was written for")
        end_ids.append(tid)
    profile = replace(draft, layout=layout, appended_stop=stop, rule=MaskRule((), ()), renders={})
    def replies(messages, alone: bool) -> list[int]:  # the replies each probe episode trains
        n = sum(m["role"] == "assistant" for m in messages)
        return [1] * n if alone else [n]

    try:
        episodes = [ep for messages, tools in probes
                    for ep in probe_episodes(profile, messages, tools, render_full, per_reply=replies_alone)]
        counts = [c for messages, _ in probes for c in replies(messages, replies_alone)]
    except NotLocated:  # some probe's replies are found only one at a time: so is every record's
        if not learn_alone:
            raise
        replies_alone = True
        episodes = [ep for messages, tools in probes
                    for ep in probe_episodes(profile, messages, tools, render_full, per_reply=True)]
        counts = [c for messages, _ in probes for c in replies(messages, True)]
    encoded = [(text, spans, tok.encode_rendered(text)) for text, spans in episodes]
    headers: list[tuple[int, ...]] = []
    for text, spans, enc in encoded:
        for start, _ in spans:
            ids = header_ids(text, start, enc, layout.header_texts, name)
            headers += [ids] if ids not in headers else []
    # a reply located as several spans (gpt-oss's analysis message before its answer): the
    # rule keeps them together as one reply where it trains an episode's last reply only
    joined = any(len(spans) > n for (_, spans), n in zip(episodes, counts))
    seqs = marker_ids(encoded, markers, name)
    rule = MaskRule(tuple(headers), tuple(end_ids) + tuple(e[0] for e in seqs if len(e) == 1), inclusive,
                    replies_alone, asked=asked_ids(render, probes, encoded, layout.end_texts, added,
                                                   tok.token_strings.get("bos_token"), bool(markers)),
                    joined_spans=joined, end_seqs=tuple(e for e in seqs if len(e) > 1))
    for _, spans, enc in encoded:
        at = mask_disagreement(enc.ids, token_mask(enc.offsets, spans), rule)
        if at is not None:
            raise TemplateError(f"chat template {name}: the mask rule learned from it does not reproduce its own "
                                f"mask on a probe conversation (token {at}: {tok.token_text(int(enc.ids[at]))!r}); "
                                f"its assistant header or end-of-turn token may be tokenized differently in context")
    return Fit(layout, rule, stop, replies_alone)


def probe_episodes(profile: TemplateProfile, messages, tools, render_full,
                    per_reply: bool = False) -> list[tuple[str, list]]:
    """A probe's episodes as ``(text, [(start, end), ...])``, located as records will be,
    each checked to hold every part of its conversation (``parts``). Raises ``NotLocated``
    when the whole render fails and ``per_reply`` is not set, ``TemplateError`` when a
    part is missing."""
    name = profile.template.name
    if profile.generation and per_reply:  # each reply the last block of the conversation up to it
        out = [render_full(messages[:k + 1], tools) for k, m in enumerate(messages) if m["role"] == "assistant"]
        layout = profile.layout
        return [(o.text, closed_blocks(o.text, o.generation, layout.end_texts, layout.header_texts)[-1:]) for o in out]
    if profile.generation:
        out = render_full(messages, tools)
        _check_parts(out.text, messages, {-1: (0, 0)}, tools, name)
        return [(out.text, closed_blocks(out.text, out.generation, profile.layout.end_texts, profile.layout.header_texts))]
    fn = profile.render_fn(list(tools) if tools else None)
    if not per_reply:
        text, spans = locate_replies(fn, messages, profile.layout)
        _check_parts(text, messages, reply_windows(spans), tools, name)
        return [(text, [(a, b) for _, a, b in spans])]
    episodes = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        try:
            text, spans = locate_last_reply(fn, messages, profile.layout, k)
        except NotLocated as e:
            raise TemplateError(f"chat template {name}: assistant message {k} of a probe conversation "
                                f"cannot be located ({e.why})") from None
        _check_parts(text, messages[:k + 1], reply_windows(spans), tools, name)
        episodes.append((text, [(a, b) for _, a, b in spans]))
    return episodes


def _check_parts(text: str, messages, spans, tools, name: str) -> None:
    # tool schemas are checked record by record (template_drops_tools): a template that
    # renders calls and results but no schema (DeepSeek V3.1) serves records without schemas
    missing = missing_part(text, messages, spans, None)
    if missing is not None:
        raise TemplateError(f"chat template {name}: its render drops {missing[1]} ({missing[0]})")


# -- replies that answer no one (a conversation opening with the assistant) -------------------
LEADING_PROBE = ({"role": "assistant", "content": "Welcome! Ask me anything."},
                 {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."})


def leaves_leading_untrained(profile: TemplateProfile, render_full, tok: HFTokenizer) -> bool:
    """Whether the profile's rule leaves a reply that opens the conversation untrained and
    trains the one after the user's turn, exactly as the render places them
    (``LEADING_PROBE``); False where the template refuses such a conversation."""
    messages = [dict(m) for m in LEADING_PROBE]
    try:
        if profile.generation:
            out = render_full(messages)
            if len(out.generation) != 2:
                return False
            text, spans = out.text, [out.generation[1]]
        else:
            text, located = locate_replies(profile.render_fn(None), messages, profile.layout)
            spans = [(a, b) for k, a, b in located if k == 2]
    except TemplateLimitError:
        raise
    except (TemplateError, NotLocated):
        return False
    enc = tok.encode_rendered(text)
    return len(spans) == 1 and mask_disagreement(enc.ids, token_mask(enc.offsets, spans), profile.rule) is None
