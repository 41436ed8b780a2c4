"""What a template does with tool calls, probed: whether it writes a call at all
(``renders_calls``), whether it renders calls but never the tools' schemas
(``ignores_schemas``), and the token it ends a tool-call reply with where that is not the
end of its plain replies (``call_ends``).
"""

from __future__ import annotations

from ..errors import TemplateError, TemplateLimitError
from ..tokenize.hf import HFTokenizer
from .headers import first_added
from .probes import WEATHER, Fit, fit_probes
from .profile import TemplateProfile
from .spans import NotLocated, sentinel_messages

_SCHEMA_MARK = "Tells the weather of a place"  # a description no template writes by itself


def renders_calls(render_full, messages: list[dict], tools) -> bool:
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


def ignores_schemas(render_full, messages: list[dict], tools) -> bool:
    """Whether the template renders tool calls but never the tools' schemas (DeepSeek V3.1):
    neither the probe tool's description nor its parameter's description is in the tool
    probe's render, and the render is the same text without the tools. The model never
    sees schemas at inference either, so a record's schemas are left out of its render
    (which is then exactly transformers' with them) and counted, not refused."""
    schema = {"type": "function", "function": {**WEATHER["function"], "description": _SCHEMA_MARK}}
    schema["function"]["parameters"] = {**WEATHER["function"]["parameters"], "properties": {
        "city": {"type": "string", "description": _SCHEMA_MARK + " city"}}}
    try:
        with_tools = render_full(messages, [schema]).text
        without = render_full(messages, None).text
    except TemplateLimitError:
        raise
    except TemplateError:
        return False
    return _SCHEMA_MARK not in with_tools and with_tools == without


def call_ends(draft: TemplateProfile, accepted, probe, tok: HFTokenizer, render_full, added: list[str],
               fit: Fit, failed: Exception) -> Fit:
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
        while (hit := first_added(tail, pos, len(tail), added)) is not None:
            seen += [hit[1]] if hit[1] not in seen else []
            pos = hit[0] + len(hit[1])
    known = fit.layout.end_texts
    order = [t for t in seen if t in known] + [t for t in seen if t not in known and t in tok.special_tokens] + \
        [t for t in seen if t not in known and t not in tok.special_tokens]
    for end in order[:8]:
        try:
            return fit_probes(draft, accepted + [probe], tok, render_full, added, fit.replies_alone, False, known + (end,))
        except (TemplateError, NotLocated):
            continue
    raise failed
