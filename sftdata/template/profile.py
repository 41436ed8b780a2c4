"""Learn, once per (template, tokenizer), what marks an assistant reply, and the mask rule.

``learn_profile`` renders a few probe conversations (a plain exchange; system and two
turns; a tool call, its result and a reply) and finds:

* the generation prompt (what ``add_generation_prompt=True`` appends: the assistant
  header), the header texts that open a reply and the end-of-turn texts that close one;
* for a template with ``{% generation %}`` blocks, the same read off its blocks;
* whether tool-call arguments go in as a dict or as JSON text;
* the ``MaskRule`` over token ids, checked on every probe: the rule must give exactly the
  mask the render gives, or the template is refused here, once, before any record.

A template that writes nothing a rule can stop on (no special token after a reply), or
whose replies cannot be located even one at a time, is refused with ``TemplateError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..chat.template_rule import MaskRule, mask_disagreement
from ..errors import TemplateError, TemplateLimitError
from ..tokenize.hf import HFTokenizer
from .chat_template import ChatTemplate
from .messages import ArgumentsStyle, arguments_style
from .spans import Layout, NotLocated, locate_last_reply, locate_replies, sentinel_messages, token_mask

MAX_CACHED_RENDERS = 4096
_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# every template must render these; the system and tool probes are used when it renders them
PROBES: tuple[tuple[tuple[dict, ...], tuple[dict, ...] | None], ...] = (
    (({"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}), None),
    (({"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
      {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6."}), None),
)
SYSTEM_PROBE: tuple[tuple[dict, ...], None] = (
    ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4."}), None)


def _tool_probe(style: ArgumentsStyle) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    args = {"city": "Paris"} if style == "dict" else '{"city": "Paris"}'
    return (({"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": args}}]},
             {"role": "tool", "content": "18C and sunny", "tool_call_id": "call_1", "name": "get_weather"},
             {"role": "assistant", "content": "It is 18C and sunny in Paris."}), (_WEATHER,))


@dataclass(frozen=True)
class TemplateProfile:
    """Everything rendering needs besides the conversation; ``state()`` goes into
    ``tokenizer_state.json``."""

    template: ChatTemplate
    variables: dict = field(hash=False)
    generation: bool
    generation_prompt: str
    layout: Layout
    rule: MaskRule
    arguments: ArgumentsStyle
    arguments_reason: str
    tools_supported: bool
    replies_alone: bool = False  # the template's replies are found one at a time only (learned)
    # sentinel renders by conversation structure (``sentinel_fn``); per process, never compared
    renders: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def render_fn(self, tools: list[dict] | None = None):
        def fn(messages, add_generation_prompt=False):
            return self.template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        variables=self.variables).text
        return fn

    def sentinel_fn(self, tools: list[dict] | None = None):
        """``render_fn`` for the sentinel copies of conversations, cached: such a render
        depends on the conversation's structure alone (roles, tool calls, tools), which few
        records of a corpus differ in, so most records need one render instead of two."""
        plain = self.render_fn(tools)
        tools_key = repr(tools)

        def fn(messages, add_generation_prompt=False, key=None):
            """``key``: the messages' ``plain_structure`` (they are then looked up by it)."""
            key = (repr(messages) if key is None else key, tools_key, add_generation_prompt)
            text = self.renders.get(key)
            if text is None:
                if len(self.renders) >= MAX_CACHED_RENDERS:
                    self.renders.clear()
                text = self.renders[key] = plain(messages, add_generation_prompt)
            return text

        fn.cached = lambda key: self.renders.get((key, tools_key, False))  # None: not rendered yet
        return fn

    def __getstate__(self):
        state = dict(self.__dict__)
        state["renders"] = {}  # a worker builds its own
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def state(self) -> dict:
        return {"chat_template": {**self.template.state(), "generation_blocks": self.generation,
                                  "generation_prompt": self.generation_prompt,
                                  "header_texts": list(self.layout.header_texts),
                                  "end_texts": list(self.layout.end_texts)},
                "mask_rule": self.rule.state(),
                "tool_arguments": {"style": self.arguments, "reason": self.arguments_reason}}


def _last_added(text: str, lo: int, hi: int, added: list[str]) -> tuple[int, str] | None:
    """The added token whose occurrence in ``text[lo:hi]`` ends last."""
    best = None
    for t in added:
        at = text.rfind(t, lo, hi)
        if at >= 0 and (best is None or at + len(t) > best[0] + len(best[1])):
            best = (at, t)
    return best


def _first_added(text: str, lo: int, hi: int, added: list[str]) -> tuple[int, str] | None:
    best = None
    for t in added:
        at = text.find(t, lo, hi)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, t)
    return best


def _learn_layout(render, probes, gen_prompt: str, added: list[str], name: str) -> Layout:
    headers: list[str] = [gen_prompt] if gen_prompt else []
    ends: list[str] = []
    first = _first_added(gen_prompt, 0, len(gen_prompt), added) if gen_prompt else None
    shortest = first[0] + len(first[1]) + 1 if first else len(gen_prompt)
    for messages, tools in probes:
        sent, _ = sentinel_messages(list(messages))
        s = render(sent, tools)
        for i, m in enumerate(messages):
            if m["role"] != "assistant" or m.get("tool_calls"):
                continue
            mark = f"\ufdd2c{i}\ufdd3"
            at = s.find(mark)
            if at < 0:
                continue  # a template may drop earlier replies; the per-reply path handles those
            end = _first_added(s, at + len(mark), len(s), added)
            if end is None:
                raise TemplateError(f"chat template {name} writes no special token after an assistant reply, so no "
                                    f"rule can tell where a reply stops (the model would never learn to stop)")
            if end[1] not in ends:
                ends.append(end[1])
            if gen_prompt and not s.endswith(gen_prompt, 0, at):
                # a generation prompt that supplies more than the role header (Qwen3 without
                # thinking appends an empty think block): the replies the template writes
                # itself open with the longest part of it that still names the role
                k = next((k for k in range(len(gen_prompt) - 1, shortest - 1, -1)
                          if s.endswith(gen_prompt[:k], 0, at)), None)
                if k is not None and gen_prompt[:k] not in headers:
                    headers.append(gen_prompt[:k])
            if not gen_prompt:
                head = _last_added(s, 0, at, added)
                if head is None:
                    raise TemplateError(f"chat template {name} writes no assistant header and no special token "
                                        f"before a reply; a reply's start cannot be told from the token ids")
                if head[1] not in headers:
                    headers.append(head[1])
    if not ends:
        raise TemplateError(f"chat template {name} renders no assistant reply's text in a probe conversation; "
                            f"replies cannot be located")
    return Layout(tuple(headers), tuple(ends))


def _generation_layout(render_full, probes, gen_prompt: str, added: list[str], name: str) -> tuple[Layout, bool]:
    headers: list[str] = []
    ends: list[str] = []
    inclusive: set[bool] = set()
    for messages, tools in probes:
        out = render_full(list(messages), tools)
        if not out.generation:
            raise TemplateError(f"chat template {name} has {{% generation %}} blocks but marks nothing in a probe "
                                f"conversation; every assistant reply would be untrained")
        for start, end in out.generation:
            text = out.text
            if gen_prompt and text.endswith(gen_prompt, 0, start):
                head = gen_prompt
            else:
                found = _last_added(text, 0, start, added)
                if found is None:
                    raise TemplateError(f"chat template {name}: no special token precedes a generation block")
                head = text[found[0]:start]
            closing = next((t for t in added if text.endswith(t, start, end)), None)
            if closing is None:
                found = _first_added(text, end, len(text), added)
                if found is None or found[0] != end:
                    raise TemplateError(f"chat template {name}: a generation block is neither closed by nor followed "
                                        f"by a special token, so no rule can tell where a reply stops")
                closing = found[1]
            inclusive.add(text.endswith(closing, start, end))
            headers += [head] if head not in headers else []
            ends += [closing] if closing not in ends else []
    if len(inclusive) != 1:
        raise TemplateError(f"chat template {name}: some generation blocks include the end-of-turn token and some "
                            f"do not; one rule cannot re-derive both")
    return Layout(tuple(headers), tuple(ends)), inclusive.pop()


def learn_profile(template: ChatTemplate, tok: HFTokenizer, variables: dict | None = None) -> TemplateProfile:
    """Learn the template's layout and mask rule with this tokenizer. Raises ``TemplateError``."""
    name = template.name
    vars_ = {**tok.token_strings, **(variables or {})}

    def render_full(messages, tools=None, add_generation_prompt=False):
        return template.render(messages, tools=list(tools) if tools else None,
                               add_generation_prompt=add_generation_prompt, variables=vars_)

    def render(messages, tools=None, add_generation_prompt=False):
        return render_full(messages, tools, add_generation_prompt).text

    style, why = arguments_style(template.compiled(), name, vars_, template.limits)
    probes = list(PROBES)
    for messages, tools in probes:
        render(list(messages), tools)  # a template that raises on a plain probe is refused with its message
    optional = {"system": SYSTEM_PROBE, "tools": _tool_probe(style)}
    supported = {}
    for key, (messages, tools) in optional.items():
        try:
            render(list(messages), tools)
            probes.append((messages, tools))
            supported[key] = True
        except TemplateLimitError:  # a template that runs past its limits is refused, never taken as refusing
            raise
        except TemplateError:  # a template may refuse system messages or tools; records that have them are refused
            supported[key] = False
    tools_supported = supported["tools"]
    lone = [{"role": "user", "content": "Hi there"}]
    try:
        plain, prompted = render(lone), render(lone, add_generation_prompt=True)
        gen_prompt = prompted[len(plain):] if prompted.startswith(plain) else ""
    except TemplateLimitError:
        raise
    except TemplateError:
        gen_prompt = ""
    added = sorted((t for t in tok.added_tokens if t.strip()), key=len, reverse=True)
    generation = template.has_generation_blocks
    if generation:
        layout, inclusive = _generation_layout(render_full, probes, gen_prompt, added, name)
    else:
        layout, inclusive = _learn_layout(render, probes, gen_prompt, added, name), True
    end_ids = []
    for t in layout.end_texts:
        tid = tok.token_id(t)
        if tid is None or t not in tok.added_tokens:
            raise TemplateError(f"chat template {name}: the end-of-turn text {t!r} is not one token of this "
                                f"tokenizer; use the tokenizer the template was written for")
        end_ids.append(tid)
    draft = TemplateProfile(template, vars_, generation, gen_prompt, layout, MaskRule((), ()), style, why,
                            tools_supported)
    try:
        episodes = [ep for messages, tools in probes for ep in _probe_episodes(draft, list(messages), tools, render_full)]
        last_only = False
    except NotLocated:  # some probe's replies are found only one at a time: so is every record's
        episodes = [ep for messages, tools in probes
                    for ep in _probe_episodes(draft, list(messages), tools, render_full, per_reply=True)]
        last_only = True
    encoded = [(text, spans, tok.encode_rendered(text)) for text, spans in episodes]
    headers: list[tuple[int, ...]] = []
    for text, spans, enc in encoded:
        for start, _ in spans:
            ids = _header_ids(text, start, enc, layout.header_texts, name)
            headers += [ids] if ids not in headers else []
    profile = replace(draft, rule=MaskRule(tuple(headers), tuple(end_ids), inclusive, last_only),
                      replies_alone=last_only)
    for _, spans, enc in encoded:
        mask = token_mask(enc.offsets, spans)
        at = mask_disagreement(enc.ids, mask, profile.rule)
        if at is not None:
            raise TemplateError(f"chat template {name}: the mask rule learned from it does not reproduce its own "
                                f"mask on a probe conversation (token {at}: {tok.token_text(int(enc.ids[at]))!r}); "
                                f"its assistant header or end-of-turn token may be tokenized differently in context")
    return profile


def _header_ids(text: str, start: int, enc, header_texts: tuple[str, ...], name: str) -> tuple[int, ...]:
    """The ids of the header that ends at ``start``, as tokenized in context (a header encoded
    alone may split differently: GPT-2's pattern gives "\n\n" alone but "\n", "\n" before a word)."""
    head = next((h for h in header_texts if text.endswith(h, 0, start)), None)
    if head is None:
        raise TemplateError(f"chat template {name}: a reply in a probe conversation does not follow a known header")
    lo = start - len(head)
    inside = (enc.offsets[:, 0] >= lo) & (enc.offsets[:, 1] <= start)
    idx = np.flatnonzero(inside)
    tiles = idx.size > 0 and enc.offsets[idx[0], 0] == lo and enc.offsets[idx[-1], 1] == start \
        and np.array_equal(enc.offsets[idx[1:], 0], enc.offsets[idx[:-1], 1])
    if not tiles:
        raise TemplateError(f"chat template {name}: the assistant header {head!r} does not end on a token boundary "
                            f"with this tokenizer, so no rule over token ids can find where a reply starts")
    return tuple(int(i) for i in enc.ids[idx])


def _probe_episodes(profile: TemplateProfile, messages, tools, render_full,
                    per_reply: bool = False) -> list[tuple[str, list]]:
    """A probe's episodes as ``(text, [(start, end), ...])``, located as records will be.
    Raises ``NotLocated`` when the whole render fails and ``per_reply`` is not set."""
    name = profile.template.name
    if profile.generation:
        out = render_full(messages, tools)
        return [(out.text, list(out.generation))]
    fn = profile.render_fn(list(tools) if tools else None)
    if not per_reply:
        text, spans = locate_replies(fn, messages, profile.layout)
        return [(text, [(a, b) for _, a, b in spans])]
    episodes = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        try:
            text, (_, a, b) = locate_last_reply(fn, messages, profile.layout, k)
        except NotLocated as e:
            raise TemplateError(f"chat template {name}: assistant message {k} of a probe conversation "
                                f"cannot be located ({e.why})") from None
        episodes.append((text, [(a, b)]))
    return episodes
