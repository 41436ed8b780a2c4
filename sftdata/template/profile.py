"""Learn, once per (template, tokenizer), what marks an assistant reply, the mask rule, and
what the template can carry.

``learn_profile`` renders probe conversations and finds:

* the generation prompt (what ``add_generation_prompt=True`` appends: the assistant
  header), the header texts that open a reply and the end-of-turn texts that close one
  (a reply the template writes with no header of its own, DeepSeek's after a tool
  result, opens after the special token before it);
* for a template with ``{% generation %}`` blocks, the same read off its blocks;
* how tool-call arguments and message content go in (``messages``);
* the ``MaskRule`` over token ids, checked on every probe: the rule must give exactly the
  mask the render gives;
* a stop token to append where the template writes none after the last reply (GLM ends a
  reply with the next role's token, so its last reply has none): the tokenizer's EOS
  (else the end-of-turn token it writes elsewhere), appended and trained, recorded.

Capabilities are probed one by one. The plain-chat probes (one and two exchanges) are
required: a template that fails them is refused with ``TemplateError``. Then each of
``system`` (a system message), ``tools`` (a call, its result and the reply after it) and
``reasoning`` (a reply with ``reasoning_content``) is tried on its own: a probe that fails
at any stage (the render raises, a part of it is not in the render, its replies cannot be
located, its header is not on token boundaries, the rule does not reproduce its mask)
marks that capability unsupported, with why, and leaves the rule as it was; records that
need it are refused by name (``records``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..chat.template_rule import MaskRule, mask_disagreement
from ..errors import TemplateError, TemplateLimitError
from ..records.turns import Conversation, ToolCall, Turn
from ..tokenize.hf import HFTokenizer
from .chat_template import ChatTemplate
from .messages import ArgumentsStyle, ContentStyle, arguments_style, content_style, conversation_messages, tool_schemas
from .parts import missing_part
from .reasoning import reasoning_position
from .spans import (
    SENT_CLOSE,
    SENT_OPEN,
    Layout,
    NotLocated,
    closed_blocks,
    locate_last_reply,
    locate_replies,
    reply_windows,
    sentinel_messages,
    token_mask,
)

MAX_CACHED_RENDERS = 4096
CAPABILITIES = ("system", "tools", "reasoning")
# a schema as real tool data writes one: every parameter described (Command R's tool template
# prints each parameter's description and fails on a parameter without one)
_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}


_SCHEMA_MARK = "Tells the weather of a place"  # a description no template writes by itself


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
                   Turn("assistant", "It is 18C and sunny in Paris."), tools=(_WEATHER,)),
    "reasoning": _conv(Turn("user", "What is 2+2?"),
                       Turn("assistant", "4.", reasoning="Two and two make four.")),
}


@dataclass(frozen=True)
class TemplateProfile:
    """Everything rendering needs besides the conversation; ``state()`` goes into
    ``tokenizer_state.json``. ``user_variables``: the ``--template-var`` values (in
    ``variables`` with the tokenizer's token strings); ``unsupported``: each capability
    the template cannot carry, and why; ``renders_tool_calls``: a tool call's name appears
    in the template's render at all; ``appended_stop``: the token appended after a last
    reply the template closes with none (None: it always closes them)."""

    template: ChatTemplate
    variables: dict = field(hash=False)
    generation: bool
    generation_prompt: str
    layout: Layout
    rule: MaskRule
    arguments: ArgumentsStyle
    arguments_reason: str
    content: ContentStyle = "string"
    unsupported: dict = field(default_factory=dict, hash=False)
    renders_tool_calls: bool = True
    ignores_tool_schemas: bool = False  # it renders calls but never a schema, and the same text without them
    appended_stop: str | None = None
    user_variables: dict = field(default_factory=dict, hash=False)
    replies_alone: bool = False  # every record served one episode per reply (learned, or --per-reply)
    reasoning: str = "none"  # where it renders reasoning_content: every reply's, the last one's, none
    # sentinel renders by conversation structure (``sentinel_fn``); per process, never compared
    renders: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def tools_supported(self) -> bool:
        return "tools" not in self.unsupported

    def supports(self, capability: str) -> bool:
        return capability not in self.unsupported

    def messages(self, conv: Conversation, turns: tuple[Turn, ...] | None = None) -> list[dict]:
        """``conv``'s message dicts as this template reads them (``turns``: these instead of its own)."""
        return conversation_messages(conv, self.arguments, self.content, turns)

    def render_fn(self, tools: list[dict] | None = None, kwargs: dict | None = None):
        """Render messages (``kwargs``: a record's own template variables over the profile's),
        the appended stop after a last reply the template leaves unclosed."""
        variables = {**self.variables, **kwargs} if kwargs else self.variables
        stop, ends = self.appended_stop, self.layout.end_texts

        def fn(messages, add_generation_prompt=False):
            text = self.template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        variables=variables).text
            if stop is not None and not add_generation_prompt and not text.rstrip().endswith(ends):
                text += stop
            return text
        return fn

    def sentinel_fn(self, tools: list[dict] | None = None, kwargs: dict | None = None):
        """``render_fn`` for the sentinel copies of conversations, cached: such a render
        depends on the conversation's structure alone (roles, tool calls, tools), which few
        records of a corpus differ in, so most records need one render instead of two."""
        plain = self.render_fn(tools, kwargs)
        tools_key = (repr(tools), repr(kwargs))

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
                                  "end_texts": list(self.layout.end_texts),
                                  "appended_stop": self.appended_stop,
                                  "variables": self.user_variables,
                                  "capabilities": {c: self.unsupported.get(c, "supported") for c in CAPABILITIES},
                                  "renders_tool_calls": self.renders_tool_calls,
                                  "tool_schemas": "ignored" if self.ignores_tool_schemas else "rendered",
                                  "content": self.content,
                                  "per_reply": self.replies_alone,
                                  "reasoning_position": self.reasoning},
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


@dataclass
class _Found:
    """What the probes showed so far: headers, end-of-turn texts, and whether a last reply is left unclosed."""

    headers: list[str]
    ends: list[str]
    unclosed: bool = False


def _learn_layout(render, probes, gen_prompt: str, added: list[str], name: str, found: _Found) -> None:
    """Add to ``found`` what ``probes`` show (``render``: messages, tools -> text)."""
    headers, ends = found.headers, found.ends
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
            nxt = s.find("\ufdd2", at + len(mark))  # the next message's text: a reply's end comes before it
            since = s.rfind(SENT_CLOSE, 0, at) + 1  # the previous message's text ends there
            end = _reply_end(s, since, at, at + len(mark), len(s) if nxt < 0 else nxt, gen_prompt[:shortest], added)
            if end is None:
                if s[at + len(mark):].strip() or i != len(messages) - 1:
                    raise TemplateError(f"chat template {name} writes no special token after an assistant reply, "
                                        f"so no rule can tell where a reply stops (the model would never learn to "
                                        f"stop)")
                found.unclosed = True  # the last reply, closed by nothing: a stop is appended
            elif end[1] not in ends:
                ends.append(end[1])
            if gen_prompt and not s.endswith(gen_prompt, 0, at):
                # a generation prompt that supplies more than the role header (Qwen3 without
                # thinking appends an empty think block): the replies the template writes
                # itself open with the longest part of it that still names the role
                k = next((k for k in range(len(gen_prompt) - 1, shortest - 1, -1)
                          if s.endswith(gen_prompt[:k], 0, at)), None)
                if k is not None and gen_prompt[:k] not in headers:
                    headers.append(gen_prompt[:k])
            if not any(s.rfind(h, since, at) >= 0 for h in headers):
                headers.append(_own_header(s, since, at, gen_prompt, shortest, added, name))
    if not ends and not found.unclosed:
        raise TemplateError(f"chat template {name} renders no assistant reply's text in a probe conversation; "
                            f"replies cannot be located")


def _reply_end(s: str, since: int, at: int, lo: int, hi: int, role: str, added: list[str]) -> tuple[int, str] | None:
    """The end-of-turn token after a reply's text (``s[lo:hi]``): the first added token there,
    unless the template also writes it between the reply's role header (``role``: the
    start of the generation prompt, after ``since``) and its text, where a rule would end the
    reply early: Kimi K3 closes the reasoning with ``<|close|>think`` and the answer with
    ``<|close|>response``, the turn with ``<|end_of_msg|>``. Then the first added token
    after the text that the reply's opening does not hold."""
    first = _first_added(s, lo, hi, added)
    head = s.find(role, since, at) if role else -1
    if first is None or head < 0 or s.find(first[1], head, at) < 0:
        return first
    pos = first[0] + len(first[1])
    while (nxt := _first_added(s, pos, hi, added)) is not None:
        if s.find(nxt[1], head, at) < 0:
            return nxt
        pos = nxt[0] + len(nxt[1])
    return first


def _own_header(s: str, since: int, at: int, gen_prompt: str, shortest: int, added: list[str], name: str) -> str:
    """The header of a reply the generation prompt does not open (Command R7B writes
    ``<|START_RESPONSE|>`` after the role tokens): from the longest start of the generation
    prompt before it to the reply; a reply with no header of its own (DeepSeek writes the
    reply after a tool result bare) opens after the special token before it."""
    for k in range(len(gen_prompt), max(shortest, 1) - 1, -1):
        pos = s.rfind(gen_prompt[:k], since, at)
        if pos >= 0:
            return s[pos:at]
    head = _last_added(s, since, at, added)
    if head is None:
        raise TemplateError(f"chat template {name} writes no assistant header and no special token "
                            f"before a reply; a reply's start cannot be told from the token ids")
    return head[1]


def _generation_layout(render_full, probes, gen_prompt: str, added: list[str], name: str) -> tuple[Layout, bool]:
    headers: list[str] = []
    ends: list[str] = []
    inclusive: set[bool] = set()
    for messages, tools in probes:
        out = render_full(list(messages), tools)
        if not out.generation:
            raise TemplateError(f"chat template {name} has {{% generation %}} blocks but marks nothing in a probe "
                                f"conversation; every assistant reply would be untrained")
        for start, end in closed_blocks(out.text, out.generation, added):
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


def _appended_stop(tok: HFTokenizer, ends: list[str]) -> str:
    """The token appended after a last reply the template leaves unclosed: the tokenizer's
    EOS when it is one of its added tokens, else the end-of-turn token it writes elsewhere."""
    eos = tok.token_strings.get("eos_token")
    if eos is not None and eos in tok.added_tokens:
        return eos
    if ends:
        return ends[0]
    raise TemplateError("the template writes no special token after a reply, and the tokenizer names no EOS token "
                        "to append; give the tokenizer's eos_token in its tokenizer_config.json")


@dataclass(frozen=True)
class _Fit:
    layout: Layout
    rule: MaskRule
    appended_stop: str | None
    replies_alone: bool


def _fit(draft: TemplateProfile, probes: list[tuple[list[dict], list[dict] | None]], tok: HFTokenizer,
         render_full, added: list[str], replies_alone: bool, learn_alone: bool = True, ends: tuple[str, ...] = ()) -> _Fit:
    """The layout and rule that fit every probe, checked: each probe's parts are in its
    render and the rule gives exactly its mask. Raises ``TemplateError`` (``NotLocated``
    when a probe's replies are found one at a time only and ``learn_alone`` is False:
    a capability's probe may not turn every record into one episode per reply). ``ends``:
    end-of-turn texts to use besides those learned."""
    name = draft.template.name

    def render(messages, tools=None):
        return render_full(messages, tools).text

    if draft.generation:
        layout, inclusive = _generation_layout(render_full, probes, draft.generation_prompt, added, name)
        stop = None
    else:
        found = _Found([draft.generation_prompt] if draft.generation_prompt else [], list(ends))
        _learn_layout(render, probes, draft.generation_prompt, added, name, found)
        stop = _appended_stop(tok, found.ends) if found.unclosed else None
        ends = found.ends + ([stop] if stop is not None and stop not in found.ends else [])
        layout, inclusive = Layout(tuple(found.headers), tuple(ends)), True
    end_ids = []
    for t in layout.end_texts:
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
                    for ep in _probe_episodes(profile, messages, tools, render_full, per_reply=replies_alone)]
        counts = [c for messages, _ in probes for c in replies(messages, replies_alone)]
    except NotLocated:  # some probe's replies are found only one at a time: so is every record's
        if not learn_alone:
            raise
        replies_alone = True
        episodes = [ep for messages, tools in probes
                    for ep in _probe_episodes(profile, messages, tools, render_full, per_reply=True)]
        counts = [c for messages, _ in probes for c in replies(messages, True)]
    encoded = [(text, spans, tok.encode_rendered(text)) for text, spans in episodes]
    headers: list[tuple[int, ...]] = []
    for text, spans, enc in encoded:
        for start, _ in spans:
            ids = _header_ids(text, start, enc, layout.header_texts, name)
            headers += [ids] if ids not in headers else []
    # a reply located as several spans (gpt-oss's analysis message before its answer): the
    # rule keeps them together as one reply where it trains an episode's last reply only
    joined = any(len(spans) > n for (_, spans), n in zip(episodes, counts))
    rule = MaskRule(tuple(headers), tuple(end_ids), inclusive, replies_alone,
                    asked=asked_ids(render, probes, encoded, layout.end_texts, added, tok.token_strings.get("bos_token")),
                    joined_spans=joined)
    for _, spans, enc in encoded:
        at = mask_disagreement(enc.ids, token_mask(enc.offsets, spans), rule)
        if at is not None:
            raise TemplateError(f"chat template {name}: the mask rule learned from it does not reproduce its own "
                                f"mask on a probe conversation (token {at}: {tok.token_text(int(enc.ids[at]))!r}); "
                                f"its assistant header or end-of-turn token may be tokenized differently in context")
    return _Fit(layout, rule, stop, replies_alone)


def _why(e: Exception, name: str) -> str:
    text = str(e)
    for prefix in (f"chat template {name}: ", f"chat template {name} "):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def learn_profile(template: ChatTemplate, tok: HFTokenizer, variables: dict | None = None,
                  per_reply: bool = False) -> TemplateProfile:
    """Learn the template's layout, mask rule and capabilities with this tokenizer
    (``variables``: ``--template-var``; ``per_reply``: serve every record one episode per
    reply). Raises ``TemplateError`` when the plain-chat probes fail."""
    name = template.name
    user_vars = dict(variables or {})
    # what transformers gives every template: the tokenizer's special token strings, documents
    vars_ = {**tok.token_strings, "documents": None, **user_vars}

    def render_full(messages, tools=None, add_generation_prompt=False):
        return template.render(messages, tools=list(tools) if tools else None,
                               add_generation_prompt=add_generation_prompt, variables=vars_)

    style, why = arguments_style(template.compiled(), name, vars_, template.limits)
    content, _ = content_style(template.compiled(), name, vars_, template.limits)
    added = sorted((t for t in tok.added_tokens if t.strip()), key=len, reverse=True)
    draft = TemplateProfile(template, vars_, template.has_generation_blocks, "", Layout((), ()),
                            MaskRule((), ()), style, why, content, user_variables=user_vars)
    def probe(conv: Conversation, with_tools: bool) -> tuple[list[dict], list[dict] | None]:
        return draft.messages(conv), tool_schemas(conv) or ([_WEATHER] if with_tools else None)

    refused: TemplateError | None = None
    for needs_tools in (False, True):  # a template for tool use only (Hermes' tool_use) renders nothing without tools
        required = [probe(c, needs_tools) for c in PROBES]
        try:
            for messages, tools in required:
                render_full(messages, tools)
            break
        except TemplateLimitError:  # past its limits: refused, never taken as refusing
            raise
        except TemplateError as e:
            if refused is not None:
                raise refused from None  # it is refused with its first message
            refused = e
    lone = [{"role": "user", "content": "Hi there"}]
    tools = [_WEATHER] if needs_tools else None
    try:
        plain, prompted = render_full(lone, tools).text, render_full(lone, tools, add_generation_prompt=True).text
        prompt = prompted[len(plain):] if prompted.startswith(plain) else ""
        draft = replace(draft, generation_prompt=prompt or _written_prompt(render_full, tools, added))
    except TemplateLimitError:  # past its limits: refused, never taken as refusing
        raise
    except TemplateError:
        pass
    fit = _fit(draft, required, tok, render_full, added, per_reply)
    accepted = list(required)
    unsupported: dict[str, str] = {}
    for cap in CAPABILITIES:
        messages, tools = probe(CAPABILITY_PROBES[cap], needs_tools)
        try:
            text = render_full(messages, tools).text
            if cap == "system" and "Be brief." not in text:
                raise TemplateError(f"chat template {name}: drops the system message's text")
            try:
                fit = _fit(draft, accepted + [(messages, tools)], tok, render_full, added, fit.replies_alone, False,
                           fit.layout.end_texts)
            except TemplateLimitError:
                raise
            except (TemplateError, NotLocated) as e:
                if cap != "tools":
                    raise
                fit = _call_ends(draft, accepted, (messages, tools), tok, render_full, added, fit, e)
            accepted.append((messages, tools))
        except TemplateLimitError:
            raise
        except (TemplateError, NotLocated) as e:
            unsupported[cap] = _why(e, name) if isinstance(e, TemplateError) else f"a probe reply cannot be located " \
                f"in the whole render ({e.why})"
    position = reasoning_position(render_full, lambda c: probe(c, needs_tools))
    if position == "none" and "reasoning" not in unsupported:
        unsupported["reasoning"] = "it renders no reply's reasoning_content"
    renders_calls = _renders_calls(render_full, *probe(CAPABILITY_PROBES["tools"], needs_tools))
    if not renders_calls and not unsupported.get("tools", "").startswith(("refused", "failed")):
        unsupported["tools"] = "it renders no tool call: a call's name does not appear in its render"
    ignores = renders_calls and "tools" not in unsupported and \
        _ignores_schemas(render_full, *probe(CAPABILITY_PROBES["tools"], needs_tools))
    profile = replace(draft, layout=fit.layout, rule=fit.rule, appended_stop=fit.appended_stop,
                      replies_alone=fit.replies_alone, unsupported=unsupported, renders_tool_calls=renders_calls,
                      ignores_tool_schemas=ignores, reasoning=position)
    if profile.rule.asked and not leaves_leading_untrained(profile, render_full, tok):
        profile = replace(profile, rule=replace(profile.rule, asked=()))
    return profile


def _call_ends(draft: TemplateProfile, accepted, probe, tok: HFTokenizer, render_full, added: list[str],
               fit: _Fit, failed: Exception) -> _Fit:
    """The fit with the token a template ends a tool-call reply with (gpt-oss's ``<|call|>``,
    Gemma 4's ``<tool_call|>``, Command R's ``<|END_ACTION|>``), where its plain replies
    end otherwise: each added token the template writes after the call's name, in order
    (known end-of-turn tokens, then special tokens, then other added tokens), is tried
    until one fits. Raises the first failure when none does."""
    messages, tools = probe
    k = next(i for i, m in enumerate(messages) if m.get("tool_calls"))
    mark = f"\ufdd2n{k}\ufdd3"
    seen: list[str] = []
    # what follows the call's name when the conversation ends with it, then when it goes on
    # (GLM ends a reply with the next message's role token)
    for upto in (k + 1, len(messages)):
        sent, _ = sentinel_messages(messages[:upto])
        text = render_full(sent, tools).text
        at = text.find(mark)
        if at < 0:
            raise failed
        nxt = text.find("\ufdd2", at + len(mark))
        tail, pos = text[at + len(mark): nxt if nxt >= 0 else len(text)], 0
        while (hit := _first_added(tail, pos, len(tail), added)) is not None:
            seen += [hit[1]] if hit[1] not in seen else []
            pos = hit[0] + len(hit[1])
    known = fit.layout.end_texts
    order = [t for t in seen if t in known] + [t for t in seen if t not in known and t in tok.special_tokens] + \
        [t for t in seen if t not in known and t not in tok.special_tokens]
    for end in order[:8]:
        try:
            return _fit(draft, accepted + [probe], tok, render_full, added, fit.replies_alone, False, known + (end,))
        except (TemplateError, NotLocated):
            continue
    raise failed


# -- replies that answer no one (a conversation opening with the assistant) -------------------
LEADING_PROBE = ({"role": "assistant", "content": "Welcome! Ask me anything."},
                 {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."})


def _turn_header(s: str, since: int, at: int, ends: tuple[str, ...], added: list[str], bos: str | None) -> str | None:
    """The header the template writes before the text of the message at ``at`` (the text
    of the one before it ends at ``since``): from the first added token after the last
    end-of-turn text there (BOS skipped) to the end of its line, trailing spaces left out
    (the turn's own text may follow on it, or a system text the template joins to it); the
    end-of-turn text itself where nothing follows it (GLM's ``<|user|>`` both ends a reply
    and opens a user turn); None where the template writes no token there."""
    lo = since
    last_end = None
    for e in ends:
        pos = s.rfind(e, since, at)
        if pos >= 0 and (last_end is None or pos > last_end[0]):
            last_end = (pos, e)
    if last_end is not None:
        lo = last_end[0] + len(last_end[1])
    while (hit := _first_added(s, lo, at, added)) is not None and hit[1] == bos:
        lo = hit[0] + len(hit[1])
    if hit is not None:
        eol = s.find("\n", hit[0] + len(hit[1]), at)
        return s[hit[0]:at if eol < 0 else eol].rstrip() or None
    return last_end[1] if last_end is not None else None


def _tiled_ids(text: str, lo: int, hi: int, enc) -> tuple[int, ...] | None:
    """The ids of the tokens that tile ``text[lo:hi]`` exactly, or None."""
    idx = np.flatnonzero((enc.offsets[:, 0] >= lo) & (enc.offsets[:, 1] <= hi))
    if idx.size == 0 or enc.offsets[idx[0], 0] != lo or enc.offsets[idx[-1], 1] != hi or \
            not np.array_equal(enc.offsets[idx[1:], 0], enc.offsets[idx[:-1], 1]):
        return None
    return tuple(int(i) for i in enc.ids[idx])


def asked_ids(render, probes, encoded, ends: tuple[str, ...], added: list[str],
              bos: str | None) -> tuple[tuple[int, ...], ...]:
    """``MaskRule.asked``: the id sequences of the headers of the turns a reply answers
    (user turns, tool results) in the probe conversations, as tokenized in their renders
    (``encoded``: ``(text, spans, enc)`` per probe episode)."""
    texts: set[str] = set()
    for messages, tools in probes:
        sent, _ = sentinel_messages(list(messages))
        s = render(sent, tools)
        for i, m in enumerate(messages):
            at = s.find(f"{SENT_OPEN}c{i}{SENT_CLOSE}") if m["role"] in ("user", "tool") else -1
            if at >= 0:
                head = _turn_header(s, s.rfind(SENT_CLOSE, 0, at) + 1, at, ends, added, bos)
                texts.update([head] if head else [])
    found: set[tuple[int, ...]] = set()
    for text, _, enc in encoded:
        for head in texts:
            pos = text.find(head)
            while pos >= 0:
                ids = _tiled_ids(text, pos, pos + len(head), enc)
                found.update([ids] if ids else [])
                pos = text.find(head, pos + 1)
    return tuple(sorted(found))


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


def _written_prompt(render_full, tools, added: list[str]) -> str:
    """The assistant header of a template that writes it after the last user message
    whether a generation prompt is asked for or not (Firefunction, Command R7B): what
    follows a user message's text when it ends the conversation, less the end-of-turn
    token that closes it (the first added token); "" when nothing is left."""
    mark = "\ufdd2c0\ufdd3"
    text = render_full([{"role": "user", "content": mark}], tools).text
    at = text.find(mark)
    if at < 0:
        return ""
    tail = text[at + len(mark):]
    first = _first_added(tail, 0, len(tail), added)
    if first is None:
        return ""
    rest = tail[first[0] + len(first[1]):]
    return rest if _first_added(rest, 0, len(rest), added) is not None and rest.strip() else ""


def _renders_calls(render_full, messages: list[dict], tools) -> bool:
    """Whether the template writes a tool call's name at all (after the user's text, so not
    the schema's): in a call without its result, without and with the tools (Hunyuan and
    MiniMax write calls only when tools are given), or in the whole tool probe."""
    asked = messages[0]["content"]
    asked = asked if isinstance(asked, str) else asked[0]["text"]
    for msgs, tls in ((messages[:2], None), (messages[:2], tools), (messages, tools)):
        try:
            text = render_full(msgs, tls).text
        except TemplateLimitError:  # past its limits: refused, never taken as refusing
            raise
        except TemplateError:
            continue
        at = text.find(asked)
        if at >= 0 and "get_weather" in text[at + len(asked):]:
            return True
    return False


def _ignores_schemas(render_full, messages: list[dict], tools) -> bool:
    """Whether the template renders tool calls but never the tools' schemas (DeepSeek V3.1):
    neither the probe tool's description nor its parameter's description is in the tool
    probe's render, and the render is the same text without the tools. The model never
    sees schemas at inference either, so a record's schemas are left out of its render
    (which is then exactly transformers' with them) and counted, not refused."""
    schema = {"type": "function", "function": {**_WEATHER["function"], "description": _SCHEMA_MARK}}
    schema["function"]["parameters"] = {**_WEATHER["function"]["parameters"], "properties": {
        "city": {"type": "string", "description": _SCHEMA_MARK + " city"}}}
    try:
        with_tools = render_full(messages, [schema]).text
        without = render_full(messages, None).text
    except TemplateLimitError:
        raise
    except TemplateError:
        return False
    return _SCHEMA_MARK not in with_tools and with_tools == without


def _header_ids(text: str, start: int, enc, header_texts: tuple[str, ...], name: str) -> tuple[int, ...]:
    """The ids of the header that ends at ``start``, as tokenized in context (a header encoded
    alone may split differently: GPT-2's pattern gives "\n\n" alone but "\n", "\n" before a word)."""
    head = next((h for h in header_texts if text.endswith(h, 0, start)), None)
    if head is None:
        raise TemplateError(f"chat template {name}: a reply in a probe conversation does not follow a known header")
    lo = start - len(head)
    inside = (enc.offsets[:, 0] >= lo) & (enc.offsets[:, 1] <= start)
    idx = np.flatnonzero(inside)
    tiles = idx.size > 0 and np.array_equal(enc.offsets[idx[1:], 0], enc.offsets[idx[:-1], 1])
    if not tiles:
        raise TemplateError(f"chat template {name}: no token of the assistant header {head!r} lies wholly inside "
                            f"it with this tokenizer, so no rule over token ids can find where a reply starts")
    # a header whose first characters merge with the text before it (Apriel's
    # ``\n<|begin_assistant|>\n`` after a tool result's text): its tokens wholly inside it
    # a header whose last characters merge with the reply's first ones into one token
    # (StepFun's ``<|im_start|>assistant\n<think>\n`` before a reply opening with a newline):
    # the boundary token belongs to the reply. The header is then its tokens wholly before
    # the reply, and that token, holding the reply's first characters, is trained (as
    # ``token_ranges`` maps the reply's span); where the header ends on a boundary its own
    # longer ids are the header, the longest at a place winning (``rule_spans``)
    return tuple(int(i) for i in enc.ids[idx])


def _probe_episodes(profile: TemplateProfile, messages, tools, render_full,
                    per_reply: bool = False) -> list[tuple[str, list]]:
    """A probe's episodes as ``(text, [(start, end), ...])``, located as records will be,
    each checked to hold every part of its conversation (``parts``). Raises ``NotLocated``
    when the whole render fails and ``per_reply`` is not set, ``TemplateError`` when a
    part is missing."""
    name = profile.template.name
    if profile.generation and per_reply:  # each reply the last block of the conversation up to it
        out = [render_full(messages[:k + 1], tools) for k, m in enumerate(messages) if m["role"] == "assistant"]
        return [(o.text, closed_blocks(o.text, o.generation, profile.layout.end_texts)[-1:]) for o in out]
    if profile.generation:
        out = render_full(messages, tools)
        _check_parts(out.text, messages, {-1: (0, 0)}, tools, name)
        return [(out.text, closed_blocks(out.text, out.generation, profile.layout.end_texts))]
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
