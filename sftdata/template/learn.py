"""Learn, once per (template, tokenizer), what marks an assistant reply, the mask rule, and
what the template can carry.

``learn_profile`` renders probe conversations and finds:

* the generation prompt (what ``add_generation_prompt=True`` appends: the assistant
  header), the header texts that open a reply and the end-of-turn texts that close one
  (a reply the template writes with no header of its own, DeepSeek's after a tool
  result, opens after the special token before it): ``headers``;
* for a template with ``{% generation %}`` blocks, the same read off its blocks;
* how tool-call arguments and message content go in (``messages``);
* the ``MaskRule`` over token ids, checked on every probe: the rule must give exactly the
  mask the render gives (``probes``);
* a stop token to append where the template writes none after the last reply (GLM ends a
  reply with the next role's token, so its last reply has none): the tokenizer's EOS
  (else the end-of-turn token it writes elsewhere), appended and trained, recorded.

Capabilities are probed one by one. The plain-chat probes (one and two exchanges) are
required: a template that fails them is refused with ``TemplateError``. Then each of
``system`` (a system message), ``tools`` (a call, its result and the reply after it:
``tool_probes``) and ``reasoning`` (a reply with ``reasoning_content``) is tried on its own:
a probe that fails at any stage (the render raises, a part of it is not in the render, its
replies cannot be located, its header is not on token boundaries, the rule does not
reproduce its mask) marks that capability unsupported, with why, and leaves the rule as it
was; records that need it are refused by name (``records``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..chat.template_rule import MaskRule
from ..errors import TemplateError, TemplateLimitError
from ..records.turns import Conversation
from ..tokenize.hf import HFTokenizer
from .chat_template import ChatTemplate
from .headers import written_prompt
from .messages import arguments_style, content_style, tool_schemas
from .probes import CAPABILITY_PROBES, PROBES, WEATHER, Fit, fit_probes, leaves_leading_untrained
from .profile import CAPABILITIES, TemplateProfile
from .reasoning import reasoning_position
from .spans import Layout, NotLocated
from .tool_probes import call_ends, ignores_schemas, renders_calls

Probe = tuple[list[dict], list[dict] | None]  # a probe's messages and tools


@dataclass
class _Probing:
    """What each step of learning uses: the profile so far, the tokenizer, the render
    (``render_full``: messages, tools, add_generation_prompt -> ``Rendered``), the
    tokenizer's added tokens (longest first), and whether the template renders nothing
    without tools (Hermes' tool_use template)."""

    draft: TemplateProfile
    tok: HFTokenizer
    render_full: Callable
    added: list[str]
    needs_tools: bool = False
    unlocated: set[str] = field(default_factory=set)  # capabilities whose probe replies the ids cannot tell

    def probe(self, conv: Conversation) -> Probe:
        return self.draft.messages(conv), tool_schemas(conv) or ([WEATHER] if self.needs_tools else None)


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
    p = _Probing(draft, tok, render_full, added)
    required = _required_probes(p)
    p.draft = _with_generation_prompt(p)
    fit, unsupported = _capabilities(p, required, fit_probes(p.draft, required, tok, render_full, added, per_reply))
    return _finished(p, fit, unsupported)


def _required_probes(p: _Probing) -> list[Probe]:
    """The plain-chat probes, rendered without tools, else with them (``p.needs_tools``: a
    template for tool use only renders nothing without tools); refused with the first
    failure when neither renders."""
    def rendered(needs_tools: bool) -> list[Probe]:
        p.needs_tools = needs_tools
        required = [p.probe(c) for c in PROBES]
        for messages, tools in required:
            p.render_full(messages, tools)
        return required

    try:
        return rendered(False)
    except TemplateLimitError:  # past its limits: refused, never taken as refusing
        raise
    except TemplateError as first:
        try:
            return rendered(True)
        except TemplateLimitError:
            raise
        except TemplateError:
            raise first from None  # it is refused with its first message


def _with_generation_prompt(p: _Probing) -> TemplateProfile:
    """The draft with its generation prompt: what ``add_generation_prompt`` appends to a lone
    user message, else the header the template writes after it anyway (``written_prompt``);
    "" where the template refuses to render it."""
    lone = [{"role": "user", "content": "Hi there"}]
    tools = [WEATHER] if p.needs_tools else None
    try:
        plain, prompted = p.render_full(lone, tools).text, p.render_full(lone, tools, add_generation_prompt=True).text
        prompt = prompted[len(plain):] if prompted.startswith(plain) else ""
        return replace(p.draft, generation_prompt=prompt or written_prompt(p.render_full, tools, p.added))
    except TemplateLimitError:  # past its limits: refused, never taken as refusing
        raise
    except TemplateError:
        return p.draft


def _capabilities(p: _Probing, required: list[Probe], fit: Fit) -> tuple[Fit, dict[str, str]]:
    """Each capability's probe tried on its own, on top of those accepted so far: the fit
    of every accepted probe, and each capability refused with why."""
    name = p.draft.template.name
    accepted = list(required)
    unsupported: dict[str, str] = {}
    for cap in CAPABILITIES:
        probe = p.probe(CAPABILITY_PROBES[cap])
        try:
            fit = _capability_fit(p, cap, accepted, probe, fit)
            accepted.append(probe)
        except TemplateLimitError:
            raise
        except (TemplateError, NotLocated) as e:
            unsupported[cap] = _why(e, name) if isinstance(e, TemplateError) else f"a probe reply cannot be located " \
                f"in the whole render ({e.why})"
            if isinstance(e, TemplateError) and e.reason == "reply_not_located":
                p.unlocated.add(cap)
    return fit, unsupported


def _capability_fit(p: _Probing, cap: str, accepted: list[Probe], probe: Probe, fit: Fit) -> Fit:
    """The fit with a capability's probe added (a tool-call reply may end with a token of its
    own: ``call_ends``). Raises ``TemplateError`` or ``NotLocated`` where it does not fit."""
    messages, tools = probe
    text = p.render_full(messages, tools).text
    if cap == "system" and "Be brief." not in text:
        raise TemplateError(f"chat template {p.draft.template.name}: drops the system message's text")
    try:
        return fit_probes(p.draft, accepted + [probe], p.tok, p.render_full, p.added, fit.replies_alone, False,
                          fit.layout.end_texts)
    except TemplateLimitError:
        raise
    except (TemplateError, NotLocated) as e:
        if cap != "tools":
            raise
        return call_ends(p.draft, accepted, probe, p.tok, p.render_full, p.added, fit, e)


def _finished(p: _Probing, fit: Fit, unsupported: dict[str, str]) -> TemplateProfile:
    """The profile: the fit, where reasoning is rendered, whether tool calls and schemas are."""
    position = reasoning_position(p.render_full, p.probe)
    if position == "none" and "reasoning" not in unsupported:
        unsupported["reasoning"] = "it renders no reply's reasoning_content"
    calls = renders_calls(p.render_full, *p.probe(CAPABILITY_PROBES["tools"]))
    if not calls and not unsupported.get("tools", "").startswith(("refused", "failed")):
        unsupported["tools"] = "it renders no tool call: a call's name does not appear in its render"
    ignores = calls and "tools" not in unsupported and \
        ignores_schemas(p.render_full, *p.probe(CAPABILITY_PROBES["tools"]))
    profile = replace(p.draft, layout=fit.layout, rule=fit.rule, appended_stop=fit.appended_stop,
                      replies_alone=fit.replies_alone, unsupported=unsupported, renders_tool_calls=calls,
                      ignores_tool_schemas=ignores, reasoning=position, unlocated=frozenset(p.unlocated))
    if profile.rule.asked and not leaves_leading_untrained(profile, p.render_full, p.tok):
        profile = replace(profile, rule=replace(profile.rule, asked=()))
    return profile


def _why(e: Exception, name: str) -> str:
    text = str(e)
    for prefix in (f"chat template {name}: ", f"chat template {name} "):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text
